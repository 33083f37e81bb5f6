"""A multi-rank actor fails as one, for real: one rank killed (SIGKILL) or raising while the others wait in
a gloo collective ends the whole group within about a second (every rank killed, no process left blocked,
the failing rank's error named); a job whose actor rank dies or raises mid-run restarts the gang from its
last complete checkpoint, counted once, and finishes; past ``runPolicy.backoffLimit`` it fails saying so."""

import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.hosts.actor_group import ActorGroup, ActorRankError, RankInfo
from asyncrl.trainer.driver.loop.gang_restart import GangRestartLimitError, run_with_restarts
from asyncrl.trainer.driver.loop.training_loop import RunOptions
from tests.support import rank_faults

pytestmark = pytest.mark.slow  # a Ray of its own (~30 s to start on loaded cores); the jobs ~1-3 min each

COLLECTIVE_TIMEOUT_S = 120.0  # the gloo backstop in these tests: detection must not wait for it

JOB: dict[str, Any] = {  # a DP=2 actor (two CPU ranks), checkpoints every 2 versions
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "rank-faults"},
    "spec": {
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 16},
        "train": {"steps": 4, "promptsPerStep": 2, "warmStartSteps": 0},
        "actor": {"replicas": 2, "gpusPerReplica": 0},
        "rollout": {"replicas": 1},
        "checkpoint": {"everySteps": 2},
        "monitoring": {"enabled": False},
    },
}


@pytest.fixture(scope="module")
def faults(no_shared_ray: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A Ray of this module's own whose workers carry the rank-fault plug-in; yields its folder."""
    import ray

    from asyncrl.trainer.driver.hosts.ray_env import descendants, reap

    folder = tmp_path_factory.mktemp("rank-faults")
    rank_faults.configure(folder)
    # neither module is importable in Ray's workers: ship them by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.cloudpickle.register_pickle_by_value(rank_faults)
    before = descendants()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.ERROR,
             log_to_driver=False, runtime_env={"worker_process_setup_hook": rank_faults.hook(folder)})
    try:
        yield folder
    finally:
        ray.shutdown()
        reap({pid: t for pid, t in descendants().items() if pid not in before})


class GlooRank:
    """One process of a real two-rank gloo group (what the actor's ranks are, without the model)."""

    def __init__(self, rank: int, world: int, init_method: Any) -> None:
        from asyncrl.trainer.collective.groups import init_default_group

        init_default_group(init_method, "gloo", rank, world, COLLECTIVE_TIMEOUT_S)  # the actor's own rendezvous
        self.rank = rank

    def pid(self) -> int:
        return os.getpid()

    def reduce(self, fail: str = "", fail_rank: int = 1) -> float:
        """An all-reduce; rank ``fail_rank`` first raises (``fail="raise"``) or waits (``"wait"``: the test kills it
        meanwhile) while the others are already in the collective."""
        import torch
        import torch.distributed as dist

        if self.rank == fail_rank and fail == "raise":
            time.sleep(0.5)
            raise RuntimeError("injected fault\nthe last line names it")
        if self.rank == fail_rank and fail == "wait":
            time.sleep(60)
        t = torch.ones(1)
        dist.all_reduce(t)
        return float(t[0])


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead, waiting for its parent


def _wait_gone(pids: list[int], timeout_s: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _group() -> tuple[ActorGroup, list[int]]:
    import ray

    from asyncrl.trainer.megatron.parallel import rendezvous

    # this test module is not importable in Ray's workers: ship the class by value
    cls: Any = ray.remote(GlooRank)
    init = rendezvous("127.0.0.1")
    ranks = [cls.options(num_cpus=0.1, max_concurrency=1).remote(r, 2, init) for r in range(2)]
    pids = ray.get([r.pid.remote() for r in ranks])
    return ActorGroup(ranks, [RankInfo(socket.gethostname(), p) for p in pids], poll_s=0.2), pids


def test_a_rank_killed_while_the_other_waits_in_a_collective_ends_the_group_before_the_timeout(faults: Path) -> None:
    import signal

    import ray

    group, pids = _group()
    assert ray.get(group.reduce.remote()) == 2.0  # the group works
    ref = group.reduce.remote(fail="wait")  # rank 0 enters the all-reduce, rank 1 waits
    time.sleep(1.0)
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    # rank 0 ends out of its collective: killed by the group, or gloo saw the peer's socket close first
    with pytest.raises((ray.exceptions.RayActorError, ray.exceptions.RayTaskError)) as seen:
        ray.get(ref, timeout=COLLECTIVE_TIMEOUT_S)
    detected = time.monotonic() - killed
    f = group.failure_for(seen.value)  # what the driver asks: the rank that died, not rank 0's gloo error
    assert isinstance(f, ActorRankError) and f.rank == 1 and f.died and f.method == "reduce", f
    assert f"pid {pids[1]}" in str(f)
    with pytest.raises(ActorRankError, match="actor rank 1"):
        group.reduce.remote()  # the group is gone: the next call says why
    assert group.failure_for(RuntimeError("rank 0 killed")) is f
    assert _wait_gone(pids) == []  # no rank left blocked in the collective
    print(f"dead rank -> group failed in {detected:.2f} s (gloo timeout {COLLECTIVE_TIMEOUT_S:.0f} s)")
    # the event, not the time: rank 0 left its collective because the group ended it or gloo saw the peer's
    # socket close, never because the gloo backstop timed out (that is what a slow detection would look like)
    assert "timed out" not in str(seen.value).lower() and "timeout" not in str(seen.value).lower(), seen.value


def test_a_rank_that_raises_ends_the_group_with_its_last_line(faults: Path) -> None:
    import ray

    group, pids = _group()
    t0 = time.monotonic()
    ref = group.reduce.remote(fail="raise")  # rank 0 waits in the all-reduce for rank 1, which raises
    with pytest.raises(ray.exceptions.RayActorError) as seen:  # rank 0 was killed out of its collective
        ray.get(ref, timeout=COLLECTIVE_TIMEOUT_S)
    detected = time.monotonic() - t0
    f = group.failure
    assert isinstance(f, ActorRankError) and f.rank == 1 and not f.died, f
    assert f.cause == "RuntimeError: the last line names it", f.cause
    assert _wait_gone(pids) == []
    print(f"raising rank -> group failed in {detected:.2f} s (0.5 s of it the rank's own sleep)")
    assert "timed out" not in str(seen.value).lower() and "timeout" not in str(seen.value).lower(), seen.value


def test_rank_zero_raising_also_ends_the_group(faults: Path) -> None:
    import ray

    group, pids = _group()
    ref = group.reduce.remote(fail="raise", fail_rank=0)
    with pytest.raises(ray.exceptions.RayTaskError):  # the driver sees rank 0's own error
        ray.get(ref, timeout=COLLECTIVE_TIMEOUT_S)
    failure = group.failure_for(RuntimeError("x"))
    assert failure is not None and failure.rank == 0 and not failure.died, failure
    assert _wait_gone(pids) == []  # rank 1, blocked in the all-reduce, was killed too


# ---------------------------------------------------------------- the real job: a DP=2 actor in the loop
def _versions(result: Any) -> list[int]:
    return [int(r["version"]) for r in result.steps if "version" in r]


def test_a_rank_killed_mid_step_restarts_the_gang_from_the_checkpoint_once(faults: Path, tmp_path: Path) -> None:
    # Rank 1 SIGKILLs itself on entering the step of version 3 -> 4 (after the checkpoint of version 2), while
    # rank 0 is inside that step waiting for it. (A timer killing it from here raced the step on fast
    # machines: the last step could finish first, and the run then ended with nothing to restart.)
    rank_faults.configure(faults, kill_rank=1, kill_at_version=3)
    trained: list[list[str]] = [[]]  # group ids trained per attempt, with the version they trained at
    restarts: list[tuple[int, ActorRankError, float]] = []

    def on_batch(groups: list[Any], version: int) -> None:
        trained[-1].extend(f"{g[0].group_id}@{version}" for g in groups)

    def on_restart(n: int, exc: ActorRankError) -> None:
        restarts.append((n, exc, time.time()))
        trained.append([])

    result = run_with_restarts(validate_job(JOB), RunOptions(run_dir=tmp_path / "run", num_cpus=2),
                               on_batch=on_batch, on_restart=on_restart)
    s = result.summary.to_json()  # summary.json's form
    killed = rank_faults.killed_at(faults)
    assert killed is not None and s["status"] == "succeeded", s
    assert len(restarts) == 1 and s["restarts"] == 1, (restarts, s)  # counted once
    n, exc, at = restarts[0]
    assert exc.rank == 1 and exc.died, exc
    assert "actor rank 1" in s["restart_causes"][0] and "died" in s["restart_causes"][0], s
    assert s["start_version"] == 2 and s["resumed_from"].endswith("step-000002"), s
    assert _versions(result) == [1, 2, 3, 4], _versions(result)  # the log continues from the checkpoint
    # No prompt group of a checkpointed step came back after the restart (what was trained is in the weights).
    before = {t.split("@")[0] for t in trained[0] if int(t.split("@")[1]) < 2}
    after = {t.split("@")[0] for t in trained[1]}
    assert before and after and not before & after, (before, after)
    assert _wait_gone(rank_faults.pids(faults)) == []  # every rank of both attempts is gone
    print(f"rank 1 SIGKILLed mid-step -> gang restart began {at - killed:.2f} s later "
          f"(detection, teardown of the attempt and its summary)")


def test_a_rank_that_raises_mid_run_restarts_the_gang_once(faults: Path, tmp_path: Path) -> None:
    rank_faults.configure(faults, raise_rank=1, raise_at_version=3)
    causes: list[ActorRankError] = []
    result = run_with_restarts(validate_job(JOB), RunOptions(run_dir=tmp_path / "run", num_cpus=2),
                               on_restart=lambda n, exc: causes.append(exc))
    s = result.summary.to_json()  # summary.json's form
    assert s["status"] == "succeeded" and s["restarts"] == 1, s
    assert [(c.rank, c.died, c.method) for c in causes] == [(1, False, "train_step")], causes
    assert causes[0].cause == "RuntimeError: injected fault in rank 1 at version 3", causes[0].cause
    assert s["start_version"] == 2 and _versions(result) == [1, 2, 3, 4], s
    assert _wait_gone(rank_faults.pids(faults)) == []


def test_past_the_backoff_limit_the_run_fails_saying_so(faults: Path, tmp_path: Path) -> None:
    rank_faults.configure(faults, raise_rank=1, raise_at_version=0, once=False)  # every attempt fails
    job = {**JOB, "spec": {**JOB["spec"], "runPolicy": {"backoffLimit": 1}, "train": {**JOB["spec"]["train"],
                                                                                      "steps": 2}}}
    restarts: list[int] = []
    with pytest.raises(GangRestartLimitError) as info:
        run_with_restarts(validate_job(job), RunOptions(run_dir=tmp_path / "run", num_cpus=2),
                          on_restart=lambda n, exc: restarts.append(n))
    assert restarts == [1]
    msg = str(info.value)
    assert "actor rank 1" in msg and "injected fault in rank 1 at version 0" in msg, msg
    assert "restarted 1 time(s)" in msg and "runPolicy.backoffLimit=1 is reached" in msg, msg
    # the second attempt logged no step either: its own word is last-attempt.json beside the first's summary
    summary = json.loads((tmp_path / "run" / "last-attempt.json").read_text())
    assert summary["status"] == "failed" and summary["restarts"] == 1, summary
    assert "actor rank 1" in summary["error"], summary
    assert _wait_gone(rank_faults.pids(faults)) == []
