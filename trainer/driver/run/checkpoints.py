"""Checkpoint folders of a run: ``<dir>/step-000050``; the newest *verified* one is resumed.

The actor writes each folder atomically (a temporary sibling renamed into place) with a marker
``meta.json`` that records the size and SHA-256 of its files
(:mod:`asyncrl.trainer.checkpoint.folder`): every rank of the actor group writes its shards into the
sibling and rank 0 seals it (:mod:`asyncrl.trainer.checkpoint.sharded`), so one folder resumes at
any TP/DP layout. The driver names, verifies, chooses and prunes folders.

A checkpoint is complete only when it verifies: its marker parses, every recorded file has its
recorded size and checksum, and the driver's state beside it (``driver-<version>.json``,
:mod:`.recovery`) parses. Resuming walks from the newest folder down and takes the first one that
verifies; every folder it passes over is set aside as ``step-NNNNNN.corrupt`` and reported with its
reason. Set-aside folders are kept for a look, never resumed: one per step (a step set aside again
replaces its earlier one) and the newest :data:`CORRUPT_KEEP` steps' (older ones, and the ``.corrupt-2``,
``-3`` ... of earlier versions, are deleted when a resume sets a folder aside: :func:`prune_corrupt`).
"""

import logging
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.trainer.checkpoint.folder import META_FILE, CheckpointError, verify_checkpoint
from asyncrl.trainer.driver.run import faults, recovery

log = logging.getLogger(__name__)

_NAME = re.compile(r"^step-(\d{6,})$")
MARKER = META_FILE  # written last by the actor's atomic checkpoint
CORRUPT_SUFFIX = ".corrupt"
CORRUPT_KEEP = 3  # set-aside folders kept (the newest steps'): enough to look at a fault that repeats, no pile-up
# A set-aside folder; the "-N" copies are what earlier versions left when a step was set aside twice.
_CORRUPT = re.compile(r"^step-(\d{6,})\.corrupt(?:-(\d+))?$")
# What an interrupted write leaves (the actor's folder, a replaced folder, the driver's state file).
_TEMPORARY = re.compile(r"^\.step-\d{6,}\.(tmp|old)-\d+$|^driver-\d{6,}\.json\.tmp$")


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    version: int


@dataclass(frozen=True)
class Skipped:
    """A checkpoint that resuming passed over: where it was, why, and where it was set aside."""

    checkpoint: Checkpoint
    reason: str
    moved_to: Path | None

    def describe(self) -> str:
        where = f"; set aside as {self.moved_to}" if self.moved_to is not None else ""
        return f"checkpoint {self.checkpoint.path} skipped: {self.reason}{where}"


@dataclass(frozen=True)
class ResumePoint:
    """What resuming chose: the newest verified checkpoint (None: none) and the newer ones it skipped."""

    checkpoint: Checkpoint | None
    skipped: list[Skipped] = field(default_factory=list)
    state: recovery.DriverState | None = None

    def notices(self) -> list[str]:
        """One line per skipped folder and one for the choice, for the console and the log."""
        out = [s.describe() for s in self.skipped]
        if self.skipped:
            chosen = (f"resuming from {self.checkpoint.path} (version {self.checkpoint.version}), the newest "
                      "verified checkpoint; the steps after it are trained again"
                      if self.checkpoint is not None else
                      "no verified checkpoint left: the run starts from the beginning")
            out.append(chosen)
        return out


def path_for(root: Path, version: int) -> Path:
    """Folder of the checkpoint taken at ``version``."""
    return root / f"step-{version:06d}"


def found(root: Path) -> list[Checkpoint]:
    """Every ``step-NNNNNN`` folder under ``root``, verified or not, oldest first."""
    if not root.is_dir():
        return []
    out = [Checkpoint(p, int(m.group(1))) for p in root.iterdir() if (m := _NAME.match(p.name)) and p.is_dir()]
    return sorted(out, key=lambda c: c.version)


def all_complete(root: Path, *, checksums: bool = False) -> list[Checkpoint]:
    """Every checkpoint under ``root`` that verifies (sizes; with ``checksums`` also SHA-256), oldest first."""
    out = []
    for c in found(root):
        try:
            verify_checkpoint(c.path, checksums=checksums)
        except CheckpointError:
            continue
        out.append(c)
    return out


def latest(root: Path) -> Checkpoint | None:
    """The newest fully verified checkpoint under ``root``, if any."""
    for c in reversed(found(root)):
        try:
            verify_checkpoint(c.path)
        except CheckpointError:
            continue
        return c
    return None


def choose_resume(root: Path, *, set_aside: bool = True) -> ResumePoint:
    """The newest checkpoint whose folder and driver state verify; newer broken ones are skipped (and,
    with ``set_aside``, renamed ``step-NNNNNN.corrupt``), each with its reason (logged as a warning)."""
    skipped: list[Skipped] = []
    for c in reversed(found(root)):
        try:
            verify_checkpoint(c.path)
            state = recovery.load(root, c.version)
        except (CheckpointError, recovery.DriverStateError) as exc:
            reason = exc.reason
            moved = _set_aside(c.path) if set_aside else None
            skipped.append(Skipped(c, reason, moved))
            log.warning("%s", skipped[-1].describe())
            continue
        point = ResumePoint(c, skipped, state)
        break
    else:
        point = ResumePoint(None, skipped)
    if set_aside and skipped:
        prune_corrupt(root, CORRUPT_KEEP)
    for line in point.notices()[len(skipped):]:
        log.warning("%s", line)
    return point


def _set_aside(path: Path) -> Path | None:
    """Rename ``path`` to ``<name>.corrupt``, replacing the folder an earlier resume set aside for that step."""
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    try:
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        path.rename(target)
    except OSError as exc:  # read-only volume: leave it; it is skipped again next time
        log.warning("could not set %s aside (%s); it stays and is skipped again on the next resume", path, exc)
        return None
    return target


def set_aside_folders(root: Path) -> list[tuple[int, int, Path]]:
    """``(version, copy, folder)`` of every set-aside folder under ``root``, oldest first (copy 1 is
    ``step-N.corrupt``, n is ``step-N.corrupt-n``)."""
    if not root.is_dir():
        return []
    out = [(int(m.group(1)), int(m.group(2) or 1), p) for p in root.iterdir() if (m := _CORRUPT.match(p.name))]
    return sorted(out)


def prune_corrupt(root: Path, keep: int) -> list[Path]:
    """Delete all set-aside folders but the newest ``keep``; returns what was removed. A link is removed,
    never followed."""
    found_ = set_aside_folders(root)
    removed = [p for _, _, p in found_[: max(0, len(found_) - keep)]]
    for p in removed:
        if p.is_symlink() or not p.is_dir():
            p.unlink(missing_ok=True)
        else:
            shutil.rmtree(p, ignore_errors=True)
    return removed


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints; returns what was removed.

    Only folders that verify (marker and sizes) count and are deleted: a broken newest folder never
    makes pruning delete the good ones below it.
    """
    complete = all_complete(root)
    removed = [c.path for c in complete[: max(0, len(complete) - keep)]]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def sweep_temporaries(root: Path) -> list[Path]:
    """Remove what interrupted writes left under ``root`` (``.step-N.tmp-PID``, ``.step-N.old-PID``,
    ``driver-N.json.tmp``). Called when a run starts, before anything writes there."""
    return faults.remove_matching(root, _TEMPORARY)
