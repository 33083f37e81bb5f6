"""One table of hostile and careless ``spec.task.dataset`` files, each refused in one line or read whole.

Each :class:`HostileDataset` writes one file (or link, or pipe) and says what must happen:

- ``refusal``: a fragment of the refusal; ``""`` = the file survives and its rows are exactly ``rows``;
- ``spec``: ``DatasetSpec`` fields beside ``path`` (small caps keep a case fast; the cases without caps run
  at the defaults, the bombs among them);
- ``lines``: how many lines the refusal holds (one, unless the case is about listing many problems).

``make(case, folder)`` writes the case's file in ``folder`` and returns its path (a link's target, where
there is one, sits beside ``folder``: "outside" it). Used by ``tests/api/test_hostile_datasets.py``, through
``asyncrl validate``'s check (``dataset_problems``) and the job's start (``load_dataset``).
"""

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from asyncrl.api.dataset_limits import DEFAULT_MAX_DECODED_BYTES, MIB

Writer = Callable[[Path], None]
ROW = {"prompt": "What is 2+2?", "answer": 4}
ROW_LINE = json.dumps(ROW)


@dataclass(frozen=True)
class HostileDataset:
    """One dataset file and what reading it must give."""

    id: str
    file: str
    write: Writer
    refusal: str
    spec: dict[str, Any] = field(default_factory=dict)
    rows: tuple[dict[str, Any], ...] = ()
    lines: int = 1


def make(case: HostileDataset, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / case.file
    case.write(path)
    return path


# ----------------------------------------------------------------------------- writers
def _bytes(data: bytes) -> Writer:
    return lambda p: p.write_bytes(data)


def _text(text: str) -> Writer:
    return _bytes(text.encode())


def _lines(*lines: str) -> Writer:
    return _text("".join(line + "\n" for line in lines))


def _parquet(table: Callable[[], pa.Table], **options: Any) -> Writer:
    return lambda p: pq.write_table(table(), p, **options)


def dictionary_bomb(rows: int, value_bytes: int) -> pa.Table:
    """``rows`` rows whose prompt is one ``value_bytes``-long string, held once in a dictionary: a Parquet
    file of a few hundred bytes (the data pages are one run of index 0) that decodes to rows x value_bytes."""
    prompt = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["a" * value_bytes]))
    return pa.table({"prompt": prompt, "answer": pa.array([1] * rows, pa.int64())})


def _small_bomb(store_schema: bool) -> Writer:
    """20,000 x 200,000 bytes; with or without the Arrow schema pyarrow stores (other writers store none,
    and a reader then gets the dictionary decoded)."""
    def write(p: Path) -> None:
        pq.write_table(dictionary_bomb(20_000, 200_000), p, compression="zstd", store_schema=store_schema)
        assert p.stat().st_size < 4096, p.stat().st_size  # a bomb: 4e9 bytes decoded from under 4 KiB
    return write


def _nested_lists(depth: int) -> pa.Table:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return pa.table({"prompt": [value], "answer": [1]})


def _not_utf8_parquet() -> pa.Table:
    prompt = pa.array([b"fine", b"caf\xe9"], pa.binary()).view(pa.string())  # a string column, Latin-1 bytes
    return pa.table({"prompt": prompt, "answer": [1, 2]})


def _sparse(size: int) -> Writer:
    def write(p: Path) -> None:
        with open(p, "wb") as f:
            f.truncate(size)  # no blocks written: the size alone is over the cap
    return write


def _link_outside(p: Path) -> None:
    target = p.parent.parent / "elsewhere" / "real.jsonl"
    target.parent.mkdir(exist_ok=True)
    target.write_text(ROW_LINE + "\n")
    p.symlink_to(target)


def _link(target: str) -> Writer:
    return lambda p: p.symlink_to(target)


def _loop(p: Path) -> None:
    p.symlink_to(p.parent / "other.jsonl")
    (p.parent / "other.jsonl").symlink_to(p)


def _row_of(length: int) -> str:
    """A row line of exactly ``length`` bytes (its prompt padded with x)."""
    bare = len(json.dumps({"prompt": "", "answer": 1}))  # 27
    return json.dumps({"prompt": "x" * (length - bare), "answer": 1})


DEEP = 100_000
_FIELD = "spec.task.dataset"

# ----------------------------------------------------------------------------- the table
HOSTILE_DATASETS: list[HostileDataset] = [
    # ---- sizes: a line, the rows, the file
    HostileDataset("line-over-the-default-cap", "d.jsonl",
                   _lines(ROW_LINE, json.dumps({"prompt": "x" * (2 * MIB), "answer": 1}), ROW_LINE),
                   f"d.jsonl:2: the line is longer than 1 MiB ({2 * MIB + 27} bytes; {_FIELD}.maxRowBytes = 1048576)"),
    HostileDataset("line-at-the-cap-with-crlf", "d.jsonl", _text(_row_of(64) + "\r\n"), "",
                   spec={"maxRowBytes": 64}, rows=({"prompt": "x" * 37, "answer": 1},)),
    HostileDataset("line-one-byte-over-the-cap", "d.jsonl", _text(_row_of(65) + "\r\n"),
                   f"d.jsonl:1: the line is longer than 64 bytes (65 bytes; {_FIELD}.maxRowBytes = 64)",
                   spec={"maxRowBytes": 64}),
    HostileDataset("last-line-over-the-cap-without-newline", "d.jsonl", _text(ROW_LINE + "\n" + _row_of(100)),
                   "d.jsonl:2: the line is longer than 64 bytes (100 bytes;", spec={"maxRowBytes": 64}),
    HostileDataset("too-many-rows", "d.jsonl", _lines(ROW_LINE, "", ROW_LINE, ROW_LINE, ROW_LINE),
                   f"d.jsonl: more than 3 rows (line 5 is row 4; {_FIELD}.maxRows = 3)", spec={"maxRows": 3}),
    HostileDataset("too-many-parquet-rows", "d.parquet", _parquet(lambda: pa.Table.from_pylist([ROW] * 4)),
                   f"d.parquet: 4 rows, more than {_FIELD}.maxRows = 3", spec={"maxRows": 3}),
    HostileDataset("file-over-the-cap", "d.jsonl", _lines(*[ROW_LINE] * 60),  # 60 x 40 bytes = 2400
                   f"d.jsonl: 2400 bytes (2.3 KiB), more than {_FIELD}.maxFileBytes = 2048 (2 KiB)",
                   spec={"maxFileBytes": 2048}),
    HostileDataset("file-over-the-default-cap", "d.parquet", _sparse(2**30 + 1),
                   f"d.parquet: 1073741825 bytes (1.0 GiB), more than {_FIELD}.maxFileBytes = 1073741824 (1 GiB)"),
    # ---- Parquet that decodes to more than it weighs
    # 20,000 rows of one 200,000-byte value: a row decodes to 200,000 + 4 (its offset) + 8 (the int64 answer)
    # = 200,012 bytes; 10,736 rows are 2,147,328,832 <= 2 GiB = 2,147,483,648, row 10,736 makes 2,147,528,844.
    *[HostileDataset(f"parquet-dictionary-bomb{suffix}", "d.parquet", _small_bomb(stored),
                     f"d.parquet: its rows decode to more than {_FIELD}.maxDecodedBytes = {DEFAULT_MAX_DECODED_BYTES} "
                     "(2 GiB) by row 10736,") for suffix, stored in (("", True), ("-without-arrow-schema", False))],
    HostileDataset("parquet-compression-bomb", "d.parquet",  # plain pages of one letter: zstd makes 4 MiB tiny
                   _parquet(lambda: pa.table({"prompt": ["a" * 65536] * 64, "answer": [1] * 64}),
                            use_dictionary=False, compression="zstd"),
                   "d.parquet: its row groups declare", spec={"maxDecodedBytes": MIB}),
    # row 1: 2 MiB + 4 (its offset) + 8 (the answer) = 2,097,164 bytes decoded
    HostileDataset("parquet-row-over-the-cap", "d.parquet",
                   _parquet(lambda: pa.table({"prompt": ["a", "b" * (2 * MIB), "c"], "answer": [1, 2, 3]})),
                   f"d.parquet row 1: 2097164 bytes decoded, more than {_FIELD}.maxRowBytes = 1048576 (1 MiB)"),
    # ---- nesting
    HostileDataset("jsonl-deep-in-a-field", "d.jsonl",
                   _lines('{"prompt": "p", "answer": ' + "[" * DEEP + "]" * DEEP + "}"),
                   f"d.jsonl:1: the row nests {DEEP + 1} levels of [ ] and {{ }} (more than {_FIELD}.maxDepth = 64)"),
    HostileDataset("jsonl-deep-unclosed-array", "d.jsonl", _lines(ROW_LINE, "[" * DEEP),
                   f"d.jsonl:2: the row nests {DEEP} levels"),
    HostileDataset("jsonl-chat-one-level-over-the-cap", "d.jsonl",
                   _lines(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": 1})),
                   f"d.jsonl:1: the row nests 3 levels of [ ] and {{ }} (more than {_FIELD}.maxDepth = 2)",
                   spec={"maxDepth": 2}),
    HostileDataset("jsonl-chat-at-the-cap", "d.jsonl",
                   _lines(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": 1})), "",
                   spec={"maxDepth": 3}, rows=({"prompt": [{"role": "user", "content": "hi"}], "answer": 1},)),
    HostileDataset("brackets-inside-strings-are-text", "d.jsonl",  # an escaped quote does not end the string
                   _lines(json.dumps({"prompt": '\\"[{' * 1000, "answer": "]}" * 1000})), "",
                   rows=({"prompt": '\\"[{' * 1000, "answer": "]}" * 1000},)),
    HostileDataset("parquet-nested-over-the-cap", "d.parquet", _parquet(lambda: _nested_lists(4)),
                   f"d.parquet: column 'prompt' nests 5 levels (the row is 1; more than {_FIELD}.maxDepth = 4)",
                   spec={"maxDepth": 4}),
    HostileDataset("parquet-nested-past-arrow", "d.parquet", _parquet(lambda: _nested_lists(60)),
                   "d.parquet: not a readable Parquet file (Parquet schema too deeply nested"),
    HostileDataset("a-json-file-is-no-jsonl", "d.json", _text(json.dumps([ROW, ROW], indent=2)),
                   "d.json: cannot tell the format from the name"),
    # ---- text that is not JSON text
    HostileDataset("jsonl-not-utf8", "d.jsonl", _bytes(ROW_LINE.encode() + b'\n{"prompt": "caf\xe9", "answer": 2}\n'),
                   "d.jsonl:2: not UTF-8 (byte 0xe9 at byte 16 of the line); save the file as UTF-8"),
    HostileDataset("parquet-not-utf8", "d.parquet", _parquet(_not_utf8_parquet),
                   "d.parquet row 1: a string column holds bytes that are not UTF-8"),
    HostileDataset("nan", "d.jsonl", _lines('{"prompt": "p", "answer": NaN}'), "d.jsonl:1: NaN is not JSON"),
    HostileDataset("infinity", "d.jsonl", _lines(ROW_LINE, '{"prompt": "p", "answer": [1, Infinity]}'),
                   "d.jsonl:2: Infinity is not JSON"),
    HostileDataset("minus-infinity", "d.jsonl", _lines('{"prompt": "p", "answer": -Infinity}'),
                   "d.jsonl:1: -Infinity is not JSON"),
    HostileDataset("a-5000-digit-number", "d.jsonl", _lines('{"prompt": "p", "answer": 1' + "0" * 5000 + "}"),
                   "d.jsonl:1: a number has more than 4300 digits; write it as a string"),
    HostileDataset("lone-surrogate", "d.jsonl", _lines('{"prompt": "p\\ud800", "answer": 1}'),
                   "d.jsonl:1: a string holds a lone UTF-16 surrogate (\\ud800)"),
    HostileDataset("surrogate-pair", "d.jsonl", _lines('{"prompt": "\\ud83d\\ude00", "answer": 1}'), "",
                   rows=({"prompt": "\U0001f600", "answer": 1},)),
    HostileDataset("byte-order-mark", "d.jsonl", _bytes(b"\xef\xbb\xbf" + ROW_LINE.encode() + b"\r\n"), "",
                   rows=(ROW,)),
    HostileDataset("many-bad-lines-listed-then-counted", "d.jsonl", _lines(*["{"] * 1000),
                   "... and 992 more unreadable lines", lines=9),
    # ---- what the path is
    HostileDataset("symlink-to-a-file-outside", "d.jsonl", _link_outside, "", rows=(ROW,)),
    HostileDataset("symlink-to-dev-zero", "d.jsonl", _link("/dev/zero"),
                   "d.jsonl: not a regular file (a device, pipe or socket"),
    HostileDataset("named-pipe", "d.jsonl", os.mkfifo, "d.jsonl: not a regular file (a device, pipe or socket"),
    HostileDataset("symlink-loop", "d.jsonl", _loop, "Too many levels of symbolic links"),
    HostileDataset("a-folder", "d.jsonl", lambda p: p.mkdir(), "d.jsonl: it is a folder; name the file inside it"),
    # ---- empty and broken files
    HostileDataset("empty-jsonl", "d.jsonl", _bytes(b""), "d.jsonl: the dataset has no rows"),
    HostileDataset("blank-lines-only", "d.jsonl", _text("\n\r\n  \n"), "d.jsonl: the dataset has no rows"),
    HostileDataset("empty-parquet-file", "d.parquet", _bytes(b""),
                   "d.parquet: not a readable Parquet file (it does not end in the Parquet magic bytes PAR1)"),
    HostileDataset("parquet-without-rows", "d.parquet",
                   _parquet(lambda: pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.int64())})),
                   "d.parquet: the dataset has no rows"),
    HostileDataset("parquet-footer-of-2-gib", "d.parquet", _bytes(b"PAR1" + struct.pack("<I", 2**31) + b"PAR1"),
                   "d.parquet: its metadata (footer) is 2 GiB, more than 64 MiB"),
    HostileDataset("encrypted-parquet", "d.parquet", _bytes(b"PAR1" + struct.pack("<I", 4) + b"PARE"),
                   "d.parquet: an encrypted Parquet file"),
]
