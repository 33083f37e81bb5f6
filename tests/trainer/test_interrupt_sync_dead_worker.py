"""InterruptSyncStage with a rollout worker found dead at *interrupt* (fake workers, real Ray refs): the loop
replaces it there, the replacement sits out *score* (it already holds the new version), the outgoing version's
tokens are shared among the workers that still hold it, and *update*/*resume* reach every worker, the replacement
too. With no worker left holding the outgoing version and tokens of it waiting, the job stops, naming why."""

from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock

import pytest

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.driver.loop.stages import InterruptSyncStage
from asyncrl.trainer.oldlogits.score_result import ScoreResult
from asyncrl.trainer.weight_sync.outcome import Delivered

pytestmark = pytest.mark.usefixtures("ray_session")  # tests/conftest.py


class Worker:
    """A rollout host's interrupt-sync methods; ``calls`` records (method, args)."""

    def __init__(self, name: str, calls: list[tuple[str, str, Any]]) -> None:
        self.name, self.calls = name, calls

    def __getattr__(self, method: str) -> Any:
        import ray

        def remote(*args: Any) -> Any:
            self.calls.append((self.name, method, args))
            if method == "sync_score":
                trajs = args[0]
                return ray.put(ScoreResult(scores=[([1], [-0.5])] * len(trajs), tokens=len(trajs),
                                           release_seconds=0.0, score_seconds=0.0, acquire_seconds=0.0,
                                           scorer_build_seconds=0.0, scorer_load_seconds=0.0))
            if method == "update_weights":
                return ray.put(Delivered(transfer_seconds=0.0, nbytes=1, handover_seconds=0.0, pause_seconds=0.0))
            return ray.put(0)

        return SimpleNamespace(remote=remote)


class Traj:
    def __init__(self) -> None:
        self.scored: list[Any] = []

    def unscored(self, version: int) -> list[int]:
        return [] if self.scored else [1]

    def set_logp_old(self, pos: list[int], val: list[float]) -> None:
        self.scored.append((pos, val))


def _loop(n_workers: int, dead: set[int], trajs: list[Traj]) -> tuple[Any, list[tuple[str, str, Any]]]:
    calls: list[tuple[str, str, Any]] = []
    hosts = SimpleNamespace(rollout=[Worker(f"w{i}", calls) for i in range(n_workers)], sync=None, weights=None)

    def on_every_worker(call: Any) -> list[Any]:
        import ray

        out = []
        for i, w in enumerate(list(hosts.rollout)):
            if i in dead:  # found dead: replaced by a worker that holds the new version
                hosts.rollout[i] = Worker(f"w{i}-replacement", calls)
                out.append(None)
            else:
                out.append(ray.get(call(w)))
        return out

    loop = SimpleNamespace(m=MagicMock(), hosts=hosts, on_every_worker=on_every_worker,
                           workers=SimpleNamespace(refs=lambda: []), buffer=SimpleNamespace(waiting=lambda: [trajs]))
    return loop, calls


def _stage() -> InterruptSyncStage:
    return InterruptSyncStage(AsyncRLJobSpec.model_validate(
        {"correction": {"reference": "exact"}, "oldLogits": {"strategy": "interruptSync"}}))


def test_the_replacement_sits_out_score_and_takes_update_and_resume() -> None:
    trajs = [Traj() for _ in range(4)]
    loop, calls = _loop(3, {1}, trajs)
    _stage().sync_weights(loop, "weights", 5)
    by = {(name, method) for name, method, _ in calls}
    scorers = sorted(name for name, method, _ in calls if method == "sync_score")
    assert scorers == ["w0", "w2"]  # the replacement holds version 5 already: it scores nothing of version 4
    assert sum(len(args[0]) for _, method, args in calls if method == "sync_score") == 4
    assert all(t.scored for t in trajs)  # every waiting token of version 4 was scored
    for name in ("w0", "w1-replacement", "w2"):
        assert (name, "update_weights") in by and (name, "sync_resume") in by, name
    assert ("w1", "update_weights") not in by  # the dead worker's handle is asked nothing after interrupt


def test_no_worker_left_holding_the_outgoing_version_stops_the_job() -> None:
    loop, _ = _loop(1, {0}, [Traj()])
    with pytest.raises(RuntimeError, match="every rollout worker died .* none holds version 4 to score the 1"):
        _stage().sync_weights(loop, "weights", 5)
    quiet, calls = _loop(1, {0}, [])  # nothing of version 4 waits: the window goes on
    _stage().sync_weights(quiet, "weights", 5)
    assert ("w0-replacement", "sync_resume", ()) in calls
