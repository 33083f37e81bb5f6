"""A test plug-in for actor-rank faults: a Ray ``worker_process_setup_hook`` that, inside every worker of
a test's own Ray, wraps :class:`~asyncrl.trainer.driver.hosts.actor_host.ActorHost` so that each rank writes its
pid to ``<folder>/rank<r>-<pid>.pid`` when it starts and, when :func:`configure` asked for it, rank
``raise_rank`` raises in ``train_step`` at ``raise_at_version`` (once, or every time), or rank ``kill_rank``
SIGKILLs itself on entering ``train_step`` at ``kill_at_version`` (once: the marker ``<folder>/killed`` holds
the wall time of the kill), while its peers are already inside the step, waiting for it in a collective. Nothing of it exists outside the tests: no production flag or variable a user could set."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def hook(folder: Path) -> Callable[[], None]:
    """The setup hook for ``ray.init(runtime_env={"worker_process_setup_hook": hook(folder)})``."""
    where = str(folder)

    def install() -> None:
        from asyncrl.trainer.driver.hosts import actor_host

        cls: Any = actor_host.ActorHost
        if getattr(cls, "_rank_faults_installed", False):
            return
        init, step = cls.__init__, cls.train_step

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807 -- the wrapped constructor
            init(self, *args, **kwargs)
            Path(where, f"rank{self.rank}-{os.getpid()}.pid").write_text(str(os.getpid()))

        def train_step(self: Any, batch: Any, version: int, *args: Any, **kwargs: Any) -> Any:
            cfg = json.loads(Path(where, "config.json").read_text())
            marker = Path(where, "raised")
            killed = Path(where, "killed")
            if self.rank == cfg["kill_rank"] and version == cfg["kill_at_version"] and not killed.exists():
                import signal
                import time

                killed.write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            if (self.rank == cfg["raise_rank"] and version == cfg["raise_at_version"]
                    and not (cfg["once"] and marker.exists())):
                marker.touch()
                raise RuntimeError(f"injected fault in rank {self.rank} at version {version}")
            return step(self, batch, version, *args, **kwargs)

        cls.__init__, cls.train_step = __init__, train_step
        cls._rank_faults_installed = True

    return install


def configure(folder: Path, *, raise_rank: int | None = None, raise_at_version: int = 0, once: bool = True,
              kill_rank: int | None = None, kill_at_version: int = 0) -> None:
    """What the next job's ranks do (read at every ``train_step``); forgets earlier pids, raises and kills."""
    for p in [*folder.glob("rank*.pid"), folder / "raised", folder / "killed"]:
        p.unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {"raise_rank": raise_rank, "raise_at_version": raise_at_version, "once": once,
         "kill_rank": kill_rank, "kill_at_version": kill_at_version}))


def killed_at(folder: Path) -> float | None:
    """The wall time a ``kill_rank`` rank SIGKILLed itself (None: it did not)."""
    marker = folder / "killed"
    return float(marker.read_text()) if marker.exists() else None


def pids(folder: Path, rank: int | None = None) -> list[int]:
    """The pids every (or rank ``rank``'s) actor process wrote, oldest first."""
    files = sorted(folder.glob("rank*.pid" if rank is None else f"rank{rank}-*.pid"), key=lambda p: p.stat().st_mtime)
    return [int(p.read_text()) for p in files]
