"""What an old-logit stage is to the loop: :class:`Stage`, the hooks the loop calls between rollout and the actor.

The actor's provider (:mod:`asyncrl.trainer.oldlogits`) turns a batch into ``logp_ref``; some strategies also
need the *driver* to act between rollout and the actor. Each such strategy is a subclass
(:mod:`.stages`: snapshot and interrupt-sync, :mod:`.dedicated_stage`: dedicated), chosen by
:func:`.stage_registry.make_stage` from the spec's ``old_logits_route``. :class:`Stage` itself is every other
reference: nothing between rollout and the actor, and the weight sync is a plain hand-over to every worker.
"""

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.driver.loop import weight_sync
from asyncrl.trainer.driver.loop.staleness import Group
from asyncrl.trainer.driver.loop.view import LoopView
from asyncrl.trainer.driver.run.step_report import WeightSync
from asyncrl.trainer.weight_sync.outcome import Delivered, SyncOutcome

if TYPE_CHECKING:
    from ray import ObjectRef

PhaseCallback = Callable[[str], None]  # the status reporter's view of the current sync phase


class StepKwargs(TypedDict, total=False):
    """The keyword arguments a stage adds to the step's ``ActorHost.train_step``."""

    live_versions: list[int]  # the versions untrained tokens may still carry (snapshot retention)


class Stage:
    """No driver-side old-logit work (every reference except the exact strategies)."""

    name = "none"

    def start(self, loop: LoopView) -> None:
        """Once, when the loop starts (after the warm start or resume, rollout holding its weights)."""

    def refs(self) -> list["ObjectRef"]:
        """Ray calls of this stage in flight: the loop waits on them beside its own."""
        return []

    def collect(self, loop: LoopView, ref: "ObjectRef") -> None:
        """One of :meth:`refs` finished."""

    def admitted(self, loop: LoopView, ref: "ObjectRef", version: int) -> None:
        """A generate call was admitted at actor ``version`` (its tokens are of ``version`` or newer)."""

    def returned(self, loop: LoopView, ref: "ObjectRef", trajs: list[Trajectory]) -> None:
        """A generate call came back with ``trajs`` (already in the staleness buffer)."""

    def before_train(self, loop: LoopView, groups: list[Group]) -> None:
        """Right before the actor trains on ``groups`` at ``loop.version`` (may wait)."""

    def trained(self, loop: LoopView, groups: list[Group]) -> None:
        """The actor's step on ``groups`` returned (applied or skipped): they are never trained again."""

    def released(self, loop: LoopView, trajs: list[Trajectory]) -> None:
        """Trajectories dropped before training (stale, or the snapshot cap)."""

    def step_kwargs(self, loop: LoopView) -> StepKwargs:
        """Extra keyword arguments of this step's ``ActorHost.train_step``."""
        return {}

    def sync_weights(self, loop: LoopView, weights: Any, version: int) -> WeightSync:
        """Hand ``version``'s weights to every rollout worker; returns how it went, for the step's report."""
        t0 = time.monotonic()
        outs = weight_sync.to_every_worker(loop.hosts, loop.on_every_worker, weights, version)
        return sync_report(time.monotonic() - t0, outs)

    def summary(self) -> dict[str, Any]:
        return {}


def sync_report(seconds: float, outs: Sequence[SyncOutcome | None]) -> WeightSync:
    """A hand-over of ``seconds`` with the slowest worker's ``RolloutHost.update_weights`` parts: transfer
    (buckets pulled, generation running), pause (generation stopped installing weights) and bytes (one
    worker's payload). A replaced worker (None) is left out; with no answer at all the parts are None."""
    got = [o for o in outs if isinstance(o, Delivered)]
    if not got:
        return WeightSync(seconds)
    return WeightSync(seconds, transfer_seconds=max(o.transfer_seconds for o in got),
                      pause_seconds=max(o.pause_seconds for o in got),
                      bytes=max(float(o.nbytes) for o in got))
