"""The driver's snapshot retention as production runs it: :meth:`SnapshotStage.step_kwargs` over a real
staleness buffer and the driver's metrics, against the brute-force reading of the window rule.

``SnapshotStage`` calls :func:`asyncrl.trainer.oldlogits.retention.live_versions` and ``cap_drop`` (one
implementation, tested here through its caller and in ``test_oldlogits_snapshot.py`` on its own).
"""

import itertools
import random
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from asyncrl.rollout.trajectory import NO_VERSION, Trajectory
from asyncrl.trainer.driver.loop.stages import SnapshotStage
from asyncrl.trainer.driver.loop.staleness import StalenessBuffer
from asyncrl.trainer.driver.loop.workers import GenerateCall, WorkerPool
from asyncrl.trainer.driver.run.metrics import DriverMetrics, create_metrics

_ids = itertools.count()


def _traj(group: str, versions: list[int]) -> Trajectory:
    stamped = [NO_VERSION, *versions]  # one prompt token, then the sampled ones
    return Trajectory(
        traj_id=f"t{next(_ids)}", group_id=group, task="calculator", tokens=[1] * len(stamped), prompt_len=1,
        loss_mask=[v != NO_VERSION for v in stamped], versions=stamped, logp_mu=[0.0] * len(stamped),
        turn_ids=[0 if v != NO_VERSION else -1 for v in stamped],
    )


@dataclass
class _Loop:
    """The members of :class:`~asyncrl.trainer.driver.loop.view.LoopView` that the snapshot stage reads."""

    version: int
    W: int  # noqa: N815 -- the paper's symbol, as LoopView spells it
    buffer: StalenessBuffer
    m: DriverMetrics
    workers: WorkerPool = field(default_factory=lambda: WorkerPool(0, now=0.0))


def _loop(version: int, W: int, groups: list[list[list[int]]], admitted: list[int]) -> _Loop:  # noqa: N803
    buffer = StalenessBuffer(max_staleness=W, groups_per_step=4)  # room for every group at once
    for gi, members in enumerate(groups):
        assert buffer.reserve(1, 0) == 1
        buffer.put([_traj(f"g{gi}", vs) for vs in members], reserved=1)
    workers = WorkerPool(len(admitted), now=0.0)  # one generate call in flight per worker, admitted at a
    for i, a in enumerate(admitted):
        workers.leave_idle(i, now=0.0)
        workers.admitted(GenerateCall(f"call{i}", worker=i, groups=1, admitted_at=a))  # type: ignore[arg-type]
    return _Loop(version, W, buffer, create_metrics(CollectorRegistry()), workers)


def _brute_force(version: int, W: int, groups: list[list[list[int]]], admitted: list[int]) -> set[int]:  # noqa: N803
    # After the step the actor is at v + 1; a token of version u is trainable then while v + 1 - u <= W.
    # Live: v + 1 (rollout samples it next), v (rollout samples it until the new weights land, also in calls
    # admitted while the actor trains), every waiting token's version, and every version a call admitted at
    # a may still produce (a .. v) -- each only if still trainable.
    trainable = {u for u in range(0, version + 2) if version + 1 - u <= W}
    live = {version + 1, version}
    live |= {u for members in groups for vs in members for u in vs}
    live |= {u for a in admitted for u in range(a, version + 1)}
    return (live & trainable) | {version + 1}


def test_the_stage_keeps_exactly_the_versions_of_the_window_rule() -> None:
    rng = random.Random(7)
    for _ in range(300):
        W = rng.randint(0, 4)  # noqa: N806
        version = rng.randint(0, 9)
        groups = [[sorted(rng.choices(range(max(0, version - W - 2), version + 1), k=rng.randint(1, 3)))
                   for _ in range(rng.randint(1, 2))] for _ in range(rng.randint(0, 3))]
        admitted = [rng.randint(0, version) for _ in range(rng.randint(0, 2))]
        got = SnapshotStage().step_kwargs(_loop(version, W, groups, admitted))  # type: ignore[arg-type]
        assert got == {"live_versions": sorted(_brute_force(version, W, groups, admitted))}, (version, W, groups, admitted)


def test_the_cap_gives_up_the_oldest_versions_and_drops_their_groups() -> None:
    # W = 3 at version 5: after the step versions 3..6 are trainable; the waiting groups hold 3, 4 and 5.
    loop = _loop(5, 3, [[[3, 3]], [[4]], [[5]]], [])
    stage = SnapshotStage(cap=2)
    assert stage.step_kwargs(loop) == {"live_versions": [5, 6]}  # type: ignore[arg-type]
    assert stage.given_up == {3, 4}
    assert [g[0].group_id for g in loop.buffer.waiting()] == ["g2"]  # the groups of versions 3 and 4 are gone
    dropped = loop.m.trajectories_dropped.labels("snapshot_cap")._value.get()
    tokens = loop.m.tokens_dropped.labels("snapshot_cap")._value.get()
    assert (dropped, tokens) == (2, 3)  # two trajectories, 2 + 1 sampled tokens
