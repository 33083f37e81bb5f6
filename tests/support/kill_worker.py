"""Killing one of a running job's Ray processes from its step callback, for the fault tests."""

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any


def descends_from_us(pid: int) -> bool:
    """True when this test process is an ancestor of ``pid`` (our own Ray's workers, not another run's)."""
    me = os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: the parent's pid
        if pid == me:
            return True
    return False


def ray_pids(title: str = "ray::RolloutHost") -> list[int]:
    """Processes Ray titled ``title...`` started by this test's Ray (one per rollout worker by default)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if cmd.startswith(title) and descends_from_us(int(d.name)):
                pids.append(int(d.name))
    return pids


def kill_at_version(version: int, expect: int, title: str = "ray::RolloutHost",
                    pick: Callable[[list[int]], int] = min) -> tuple[Callable[[Any], None], list[int]]:
    """``(on_step, killed)``: ``on_step`` (a ``run_job`` callback) SIGKILLs one of the ``expect`` processes titled
    ``title`` (the one ``pick`` chooses) the first time a report of ``version`` arrives; ``killed`` lists its pid."""
    killed: list[int] = []

    def on_step(r: Any) -> None:  # a StepReport or an EvalResult
        if getattr(r, "version", None) == version and not killed:
            pids = sorted(ray_pids(title))
            assert len(pids) == expect, (pids, [Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0]
                                                for p in ray_pids("ray::")])
            victim = pick(pids)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    return on_step, killed


def survived_with_rd_one(result: Any, killed: list[int], versions: int, tol: float = 1e-5) -> dict[str, Any]:
    """The run succeeded after its kill, trained versions 1..``versions`` in order, and every step's r_d stayed
    within ``tol`` of 1 (an exact route under an fp32 rollout); returns the summary (``summary.json``'s form)."""
    s: dict[str, Any] = result.summary.to_json()
    assert killed and s["status"] == "succeeded", s
    steps = [r for r in result.steps if "version" in r]
    assert [r["version"] for r in steps] == list(range(1, versions + 1))
    for r in steps:
        print(f"version {r['version']}: r_d [{r['rd_min']:.7f}, {r['rd_max']:.7f}], sync {r.get('sync_bytes')} B")
        assert abs(r["rd_min"] - 1.0) < tol and abs(r["rd_max"] - 1.0) < tol, r
    return s
