"""The driver's share of a checkpoint: what the actor's checkpoint cannot know.

The actor checkpoints weights, optimizer, old-logit provider state and its version
(:meth:`MegatronActor.save_checkpoint`). The driver adds, per checkpoint version, a small JSON file
``driver-<version>.json`` beside the checkpoint folders, written atomically *before* the actor's
folder (so a complete checkpoint always has its driver state):

- the prompt cursor of every rollout worker (groups started so far): a resumed run continues each
  worker's prompt sequence and never replays a prompt it already drew;
- the staleness buffer's counts at that moment. Waiting and in-flight groups are not saved: a
  resume counts them as aborted (``groups_aborted_at_resume``) and rollout regenerates new ones,
  so no trained token is trained twice and none is lost (trained ones are in the weights).

The actor draws no randomness while training (no dropout; the audit's row choice is a function
of seed and version); rollout sampling restarts from the worker's seed, on fresh prompts.
"""

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

_NAME = re.compile(r"^driver-(\d{6,})\.json$")


class DriverStateError(RuntimeError):
    """A driver state file that does not parse: ``path`` and ``reason`` say which and why."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class DriverState:
    """The driver's state at a checkpoint version."""

    version: int
    cursors: list[int]  # per rollout worker index: groups started so far
    buffer: dict[str, int] = field(default_factory=dict)  # BufferCounts at the checkpoint
    groups_open: int = 0  # waiting + in flight at the checkpoint: aborted by a resume

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DriverState":
        return cls(int(d["version"]), [int(c) for c in d["cursors"]], dict(d.get("buffer", {})),
                   int(d.get("groups_open", 0)))


def path_for(root: Path, version: int) -> Path:
    return root / f"driver-{version:06d}.json"


def save(root: Path, state: DriverState) -> Path:
    """Write ``state`` atomically (temporary file, fsync, rename) next to the checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    target = path_for(root, state.version)
    tmp = target.with_suffix(".json.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(asdict(state), f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written state behind
        raise
    return target


def load(root: Path, version: int) -> DriverState | None:
    """The driver state of checkpoint ``version`` (None: a checkpoint written without one);
    :class:`DriverStateError` naming the file when it does not parse."""
    p = path_for(root, version)
    if not p.exists():
        return None
    try:
        state = DriverState.from_dict(json.loads(p.read_text()))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise DriverStateError(p, f"the driver state {p.name} is unreadable ({type(exc).__name__}: {exc})") from exc
    if state.version != version:
        raise DriverStateError(p, f"the driver state {p.name} says version {state.version}, not {version}")
    return state


def prune(root: Path, keep_versions: set[int]) -> list[Path]:
    """Delete driver states whose checkpoint is gone."""
    removed = []
    if root.is_dir():
        for p in root.iterdir():
            m = _NAME.match(p.name)
            if m and int(m.group(1)) not in keep_versions:
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed
