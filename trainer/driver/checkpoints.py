"""Checkpoint folders of a run: ``<dir>/step-000050``; the newest complete one is resumed.

The actor writes each folder atomically (a temporary sibling renamed into place, with its
``meta.json``); the driver only names, finds and prunes folders.
"""

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"^step-(\d{6,})$")
MARKER = "meta.json"  # written by the actor's atomic checkpoint


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    version: int


def path_for(root: Path, version: int) -> Path:
    """Folder of the checkpoint taken at ``version``."""
    return root / f"step-{version:06d}"


def _complete(root: Path) -> list[Checkpoint]:
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and (p / MARKER).exists():
            out.append(Checkpoint(p, int(m.group(1))))
    return sorted(out, key=lambda c: c.version)


def all_complete(root: Path) -> list[Checkpoint]:
    """Every complete checkpoint under ``root``, oldest first."""
    return _complete(root)


def latest(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``root``, if any."""
    found = _complete(root)
    return found[-1] if found else None


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints; returns what was removed."""
    found = _complete(root)
    removed = [c.path for c in found[: max(0, len(found) - keep)]]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed
