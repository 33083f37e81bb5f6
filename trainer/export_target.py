"""Where ``asyncrl export`` may write: the ``--out`` folder's rules, and what a crashed export left beside it.

An export is written into ``.<out>.tmp-<pid>`` and renamed into place
(:func:`asyncrl.trainer.checkpoint.folder.replace_folder`, which moves an existing folder aside as
``.<out>.old-<pid>`` and deletes it). ``--force`` replaces only what an earlier export wrote: a folder
holding :data:`MARKER_FILE` (every export writes one). A symbolic link at ``--out`` is refused, forced or
not: the export never writes through a link, and never replaces one.
"""

import json
import os
import shutil
from pathlib import Path

MARKER_FILE = "asyncrl-export.json"  # in every export: version, dtype, job, source checkpoint


class ExportTargetError(ValueError):
    """An ``--out`` the export must not write: the message names it and the fix."""


def check_target(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` the export must not write: a symbolic link (dangling or not; the export never
    writes through or replaces one), an existing path without ``overwrite`` (``--force``), and, with it,
    anything but a folder an earlier export wrote (it holds :data:`MARKER_FILE`)."""
    if out.is_symlink():
        raise ExportTargetError(f"{out} is a symbolic link (to {os.readlink(out)!r}): the export never writes through or "
                          "replaces a link; pass the folder it points to, or another --out")
    if not out.exists():
        return
    if not overwrite:
        raise ExportTargetError(f"{out} exists; choose another --out or pass --force to replace it")
    marker = out / MARKER_FILE
    if not out.is_dir() or marker.is_symlink() or not marker.is_file() or not _is_marker(marker):
        what = "a file" if not out.is_dir() else f"a folder without an asyncrl export marker ({MARKER_FILE})"
        raise ExportTargetError(f"{out} is {what}: --force replaces only a folder an earlier asyncrl export wrote; "
                          "choose another --out, or move it away yourself")


def _is_marker(marker: Path) -> bool:
    try:
        record = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict) and isinstance(record.get("version"), int)


def _remove(path: Path) -> None:
    """Remove a leftover folder, or a link or file (never followed)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def sweep_leftovers(out: Path) -> list[Path]:
    """Remove what crashed exports to ``out`` left beside it (``.<name>.tmp-*``, ``.<name>.old-*``; one writer
    per ``--out``); links are unlinked, never followed. Returns what was removed."""
    removed = [p for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*") for p in out.parent.glob(pattern)]
    for stale in removed:
        _remove(stale)
    return removed
