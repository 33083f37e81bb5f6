"""A test plug-in for actor-rank faults: a Ray ``worker_process_setup_hook`` that, inside every worker of
a test's own Ray, wraps :class:`~asyncrl.trainer.driver.actor_host.ActorHost` so that each rank writes its
pid to ``<folder>/rank<r>-<pid>.pid`` when it starts (a test kills rank 1 by pid) and, when
:func:`configure` asked for it, rank ``raise_rank`` raises in ``train_step`` at ``raise_at_version`` (once,
or every time). Nothing of it exists outside the tests: no production flag or variable a user could set."""

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def hook(folder: Path) -> Callable[[], None]:
    """The setup hook for ``ray.init(runtime_env={"worker_process_setup_hook": hook(folder)})``."""
    where = str(folder)

    def install() -> None:
        from asyncrl.trainer.driver import actor_host

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
            if (self.rank == cfg["raise_rank"] and version == cfg["raise_at_version"]
                    and not (cfg["once"] and marker.exists())):
                marker.touch()
                raise RuntimeError(f"injected fault in rank {self.rank} at version {version}")
            return step(self, batch, version, *args, **kwargs)

        cls.__init__, cls.train_step = __init__, train_step
        cls._rank_faults_installed = True

    return install


def configure(folder: Path, *, raise_rank: int | None = None, raise_at_version: int = 0, once: bool = True) -> None:
    """What the next job's ranks do (read at every ``train_step``); forgets earlier pids and raises."""
    for p in [*folder.glob("rank*.pid"), folder / "raised"]:
        p.unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {"raise_rank": raise_rank, "raise_at_version": raise_at_version, "once": once}))


def pids(folder: Path, rank: int | None = None) -> list[int]:
    """The pids every (or rank ``rank``'s) actor process wrote, oldest first."""
    files = sorted(folder.glob("rank*.pid" if rank is None else f"rank{rank}-*.pid"), key=lambda p: p.stat().st_mtime)
    return [int(p.read_text()) for p in files]
