"""Reading a JSONL dataset file within its caps: one JSON object per line, each line checked before it is parsed.

A line is read at most ``maxRowBytes`` at a time (a longer one is skipped to its end, never held whole), decoded
as UTF-8, measured for nesting without recursion (:func:`nesting_depth`) and only then parsed. ``NaN`` and
``Infinity`` are refused: they are no JSON (RFC 8259), and a reward service's JSON parser would refuse the
sample that carries them. A lone UTF-16 surrogate (``"\\ud800"``) is refused too: it is no character, and
hashing, tokenising or sending the row would fail on it later. Every problem names the file and the line.
Once a problem is found no row is kept: the read ends in a :class:`~asyncrl.api.dataset_file.DatasetError`,
nothing half-loaded.
"""

import json
import re
import sys
from collections.abc import Iterator
from itertools import accumulate
from typing import Any, BinaryIO

from asyncrl.api.dataset_limits import ReadLimits, size_text
from asyncrl.api.dataset_problems import FIELD, DatasetError, Problems

_BOM = b"\xef\xbb\xbf"
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included (no backtracking blow-up)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800 .. \udfff: a surrogate written as an escape
_SKIP_CHUNK = 1 << 20


class _NotJsonConstant(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in the text (Python's json takes them; JSON has none)."""


def _refuse_constant(name: str) -> Any:
    raise _NotJsonConstant(name)


def nesting_depth(text: str, at_most: int) -> int:
    """How deep ``text``'s ``[ ]`` / ``{ }`` nest outside strings (a flat object is 1), computed without
    recursion; any value ``<= at_most`` when it does not nest deeper than ``at_most`` (the common case is
    decided by counting brackets, at C speed)."""
    opened = text.count("[") + text.count("{")
    if opened <= at_most:
        return opened
    bare = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in bare), default=0)


def _lines(f: BinaryIO, row_bytes: int) -> Iterator[tuple[bytes | None, int, int]]:
    """``(text, bytes read, text bytes)`` for each line of ``f``, the text without its ``\\n`` or ``\\r\\n``; text
    ``None`` for a line over ``row_bytes``, which is read to its end in chunks and dropped, never held whole."""
    while raw := f.readline(row_bytes + 2):  # up to row_bytes of text and its \r\n
        ended = raw.endswith(b"\n") or len(raw) <= row_bytes + 1  # a whole line, or the last one
        text = raw.removesuffix(b"\n").removesuffix(b"\r") if ended else raw
        if len(text) <= row_bytes:
            yield text, len(raw), len(text)
            continue
        read, last = len(raw), raw[-2:]
        while not raw.endswith(b"\n") and (raw := f.readline(_SKIP_CHUNK)):
            read, last = read + len(raw), (last + raw)[-2:]
        yield None, read, read - (2 if last == b"\r\n" else 1 if last.endswith(b"\n") else 0)


def read_jsonl(f: BinaryIO, path: str, limits: ReadLimits) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the open JSONL file ``f`` (named ``path`` in messages) and where each is (``path:17``).
    Raises :class:`DatasetError` with every problem found (bad lines listed up to a few, the rest counted)."""
    rows: list[dict[str, Any]] = []
    where: list[str] = []
    problems = Problems("unreadable lines")
    lines = _lines(f, limits.row_bytes)
    count = total = n = 0  # rows, bytes read, the line being read
    try:
        while True:
            n += 1  # before the read: a MemoryError while reading names the line it was reading
            if (line := next(lines, None)) is None:
                break
            raw, size, length = line
            total += size
            if total > limits.file_bytes:  # the size seen at open can grow, or be 0 (/proc)
                problems.stop(f"{path}: more than {size_text(limits.file_bytes)} read by line {n} ({FIELD}.maxFileBytes "
                              f"= {limits.file_bytes}); split the file or raise {FIELD}.maxFileBytes")
                break
            if raw is None:
                problems.add(f"{path}:{n}: the line is longer than {size_text(limits.row_bytes)} ({length} bytes; "
                             f"{FIELD}.maxRowBytes = {limits.row_bytes}); shorten the row or raise {FIELD}.maxRowBytes")
                continue
            if n == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]  # a byte-order mark some editors write: no row content
            if not raw.strip():
                continue  # blank lines (a trailing newline) are no rows
            count += 1
            if count > limits.rows:
                problems.stop(f"{path}: more than {limits.rows} rows (line {n} is row {count}; {FIELD}.maxRows = "
                              f"{limits.rows}); split the file or raise {FIELD}.maxRows")
                break
            row = _row(raw, f"{path}:{n}", limits, problems)
            if row is not None and not problems:  # after a problem nothing is kept: the read will be refused
                rows.append(row)
                where.append(f"{path}:{n}")
    except MemoryError:
        rows.clear()  # nothing half-loaded, and the memory back before the message is built
        where.clear()
        problems.stop(f"{path}:{n}: out of memory while reading the file; lower "
                      f"{FIELD}.maxFileBytes and maxRowBytes to what the process can hold, split the file, or give "
                      "the pods more memory")
    if problems:
        raise DatasetError(problems.lines())
    return rows, where


def _row(raw: bytes, at: str, limits: ReadLimits, problems: Problems) -> dict[str, Any] | None:
    """The object on one line, or None with its problem added to ``problems``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.add(f"{at}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); save the "
                     "file as UTF-8")
        return None
    depth = nesting_depth(text, limits.depth)
    if depth > limits.depth:
        problems.add(f"{at}: the row nests {depth} levels of [ ] and {{ }} (more than {FIELD}.maxDepth = "
                     f"{limits.depth}); flatten it or raise {FIELD}.maxDepth (at most 256)")
        return None
    try:
        row = json.loads(text, parse_constant=_refuse_constant)
    except _NotJsonConstant as exc:
        problems.add(f"{at}: {exc} is not JSON (RFC 8259 has no NaN or Infinity; a reward service would refuse "
                     "the sample); write null, a string or a finite number")
        return None
    except json.JSONDecodeError as exc:
        problems.add(f"{at}: not JSON ({exc.msg} at column {exc.colno}); fix or remove the line")
        return None
    except ValueError as exc:  # an integer past sys.get_int_max_str_digits() digits
        if "digits" not in str(exc):
            raise
        problems.add(f"{at}: a number has more than {sys.get_int_max_str_digits()} digits; write it as a string")
        return None
    except RecursionError:  # not reached below the depth cap: a last guard, never a traceback
        problems.add(f"{at}: too deeply nested to parse; flatten the row or lower its nesting")
        return None
    if not isinstance(row, dict):
        problems.add(f"{at}: a row must be a JSON object ({{\"prompt\": ..., ...}}), got {type(row).__name__}; wrap "
                     "it in an object")
        return None
    if _SURROGATE_ESCAPE.search(text):  # rare: only then look for a surrogate that pairs with nothing
        try:
            json.dumps(row, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            problems.add(f"{at}: a string holds a lone UTF-16 surrogate (\\u{ord(exc.object[exc.start]):04x}), no "
                         "character; remove it or write the whole pair")
            return None
    return row
