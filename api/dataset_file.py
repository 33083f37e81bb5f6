"""Reading and checking the file of ``spec.task.dataset`` (no torch: ``asyncrl validate`` uses it too).

:func:`dataset_problems` reads the file and returns every problem at once, each naming the file, the
line (JSONL) or row (Parquet) and the fix; ``asyncrl validate`` prints them when the file is readable
where it runs, and the job checks again at start (``rollout/envs/dataset.py``), where the rows are
split and ordered. Parquet needs ``pyarrow`` (imported only for a Parquet file).
"""

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncrl.api.dataset import DatasetFormat, DatasetSpec
from asyncrl.api.dataset_jsonl import read_jsonl
from asyncrl.api.dataset_limits import ReadLimits, size_text
from asyncrl.api.dataset_problems import FIELD, MAX_LISTED, DatasetError

MESSAGE_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")  # = rollout.envs.interface.ROLES
_SUFFIXES = {".jsonl": DatasetFormat.JSONL, ".ndjson": DatasetFormat.JSONL,
             ".parquet": DatasetFormat.PARQUET, ".pq": DatasetFormat.PARQUET}
_SHOWN = 40  # characters of a user's value quoted in a message
Message = dict[str, Any]
__all__ = ["FIELD", "MAX_LISTED", "DatasetError", "check_rows", "dataset_format", "dataset_problems", "local_check",
           "prompt_messages", "read_rows"]


def _capped(problems: list[str], what: str) -> list[str]:
    if len(problems) <= MAX_LISTED:
        return problems
    return problems[:MAX_LISTED] + [f"... and {len(problems) - MAX_LISTED} more {what}"]


def _shown(value: Any) -> str:
    """``repr(value)``, cut to a few dozen characters (a row's value in a message: no 1 MiB lines)."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "...'"


# ----------------------------------------------------------------------------- reading
def dataset_format(spec: DatasetSpec) -> DatasetFormat:
    """The format of ``spec.path``: ``spec.format``, or from the file name when it is ``auto``."""
    if spec.format is not DatasetFormat.AUTO:
        return spec.format
    fmt = _SUFFIXES.get(Path(spec.path).suffix.lower())
    if fmt is None:
        raise DatasetError([
            f"{FIELD}.path: {spec.path}: cannot tell the format from the name (known endings: "
            f"{', '.join(_SUFFIXES)}); rename the file or set {FIELD}.format to jsonl or parquet"
        ])
    return fmt


def _open_regular(path: Path, limits: ReadLimits) -> int:
    """A descriptor of ``path`` (symlinks followed) when it is a regular file within ``maxFileBytes``.

    Opened without blocking and checked on the descriptor: a named pipe or a device (``/dev/zero``, a
    terminal) would block the read or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        where = "" if path.is_absolute() else f" (relative to the working directory {Path.cwd()})"
        raise DatasetError([f"{FIELD}.path: {path}: no such file{where}; give an existing JSONL or Parquet "
                            "file"]) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = ("it is a folder; name the file inside it" if stat.S_ISDIR(st.st_mode) else
                "not a regular file (a device, pipe or socket, which may block or never end); name a JSONL or "
                "Parquet file")
        raise DatasetError([f"{FIELD}.path: {path}: {what}"])
    if st.st_size > limits.file_bytes:
        os.close(fd)
        raise DatasetError([f"{FIELD}.path: {path}: {st.st_size} bytes ({size_text(st.st_size)}), more than "
                            f"{FIELD}.maxFileBytes = {limits.file_bytes} ({size_text(limits.file_bytes)}); split the "
                            f"file or raise {FIELD}.maxFileBytes"])
    os.set_blocking(fd, True)
    return fd


def read_rows(path: str | Path, fmt: DatasetFormat, limits: ReadLimits | None = None,
              ) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of ``path`` as dicts (JSONL: one per non-blank line; Parquet: one per table row), and
    where each is, for messages: ``data.jsonl:17`` (line 17), ``data.parquet row 16`` (0-based).

    Within ``limits`` (the spec's defaults when None): a file, line or row over a cap, a row nested too
    deep, bytes that are not UTF-8, running out of memory: each is a :class:`DatasetError` naming the
    file and the line or row; no rows are returned then (nothing half-loaded)."""
    limits = limits or ReadLimits()
    p = Path(path)
    try:
        fd = _open_regular(p, limits)
        if fmt is DatasetFormat.JSONL:
            with os.fdopen(fd, "rb") as f:
                return read_jsonl(f, str(path), limits)
        os.close(fd)
        from asyncrl.api.dataset_parquet import read_parquet  # pyarrow, only for a Parquet file

        return read_parquet(p, limits)
    except OSError as exc:
        raise DatasetError([f"{FIELD}.path: {path}: cannot be read ({exc}); check the file and its "
                            "permissions"]) from None


# ----------------------------------------------------------------------------- rows
def prompt_messages(value: Any, system_prompt: str | None = None) -> list[Message]:
    """The chat messages of a prompt value: a string is one user message; a list must be messages
    ``{role, content}``. ``system_prompt`` goes first unless the prompt starts with a system message.
    Raises ``ValueError`` saying what is wrong (without the row: the caller adds it)."""
    if isinstance(value, str):
        messages: list[Message] = [{"role": "user", "content": value}]
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        messages = []
        for i, m in enumerate(value):
            if not isinstance(m, Mapping):
                raise ValueError(f"message {i} is a {type(m).__name__}, not an object {{role, content}}")
            if m.get("role") not in MESSAGE_ROLES:
                raise ValueError(f"message {i} has role {_shown(m.get('role'))}; valid roles: "
                                 f"{', '.join(MESSAGE_ROLES)}")
            if not isinstance(m.get("content"), str):
                raise ValueError(f"message {i} has no string content")
            messages.append({"role": m["role"], "content": m["content"]})
        if not messages:
            raise ValueError("the message list is empty")
    else:
        raise ValueError(f"a prompt is a string or a list of chat messages, got {type(value).__name__}")
    if system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


def check_rows(rows: Sequence[Mapping[str, Any]], where: Sequence[str], spec: DatasetSpec, source: str) -> list[str]:
    """Every problem of ``rows`` against ``spec`` (missing fields, bad prompts), naming the row (``where``)
    and the fix."""
    if not rows:
        return [f"{source}: the dataset has no rows; give a file with at least one row"]
    problems: list[str] = []
    for name, fld in (("promptField", spec.prompt_field), ("answerField", spec.answer_field),
                      ("idField", spec.id_field)):
        if fld is None:
            continue
        missing = [i for i, r in enumerate(rows) if fld not in r]
        if len(missing) == len(rows):
            columns = sorted({k for r in rows[:100] for k in r})
            shown = ", ".join(map(_shown, columns[:20])) + (" ..." if len(columns) > 20 else "")
            problems.append(f"{source}: no row has the field {fld!r} ({FIELD}.{name}); the rows have "
                            f"{shown or 'no fields'}: set {FIELD}.{name} to one of them")
        elif missing:
            listed = ", ".join(where[i] for i in missing[:MAX_LISTED]) + (" ..." if len(missing) > MAX_LISTED else "")
            problems.append(f"{source}: {len(missing)} of {len(rows)} rows lack the field {fld!r} ({FIELD}.{name}): "
                            f"{listed}; add it to them or remove those rows")
    bad = []
    for i, r in enumerate(rows):
        if spec.prompt_field not in r:
            continue  # reported above
        try:
            prompt_messages(r[spec.prompt_field])
        except ValueError as exc:
            bad.append(f"{where[i]}: {spec.prompt_field!r}: {exc}; write a string or a list of "
                       "{\"role\": ..., \"content\": ...} messages")
    problems.extend(_capped(bad, "bad prompts"))
    return problems


def dataset_problems(spec: DatasetSpec) -> list[str]:
    """Every problem of the dataset file ``spec.path`` (unreadable, bad lines, missing fields, bad prompts)."""
    try:
        rows, where = read_rows(spec.path, dataset_format(spec), spec.limits)
    except DatasetError as exc:
        return exc.problems
    return check_rows(rows, where, spec, spec.path)


def local_check(spec: DatasetSpec | None, *, must_exist: bool = False) -> tuple[list[str], str | None]:
    """What ``asyncrl validate`` says of ``spec.task.dataset``: its problems when the file is here (or
    ``must_exist``, ``--local``), else a warning (a path in the job's volume or image is checked at start)."""
    if spec is None:
        return [], None
    if not must_exist and not Path(spec.path).exists():
        return [], (f"warning: {FIELD}.path: {spec.path}: no such file here (a relative path is taken from the "
                    "working directory), so its rows were not checked (asyncrl run here would refuse it; a cluster "
                    "job reads the file in its rollout pods and checks it at start; --local makes this an error)")
    return dataset_problems(spec), None
