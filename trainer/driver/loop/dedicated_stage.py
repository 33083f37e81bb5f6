"""The driver's side of ``oldLogits.strategy: dedicated`` (paper §5.1, "a dedicated old-logit model").

Separate scorers (``oldLogits.dedicated.replicas`` of them, each one Ray actor or, at
``oldLogits.dedicated.tensorParallel`` k > 1, a gang of k ranks behind one handle:
:func:`~asyncrl.trainer.driver.hosts.fleet.dedicated_spawner`; pods with the ``oldlogits`` role in a cluster)
hold the training-side model code and follow the versions like rollout replicas. The
pure :class:`~asyncrl.trainer.oldlogits.dedicated_plan.DedicatedPlan` decides what they score and
when they advance; :class:`~asyncrl.trainer.oldlogits.dedicated_fleet.DedicatedFleet` dispatches that to
the processes and replaces one that dies (its unanswered work is re-queued, nothing is lost). This
stage connects both to the loop:

- every admitted generate call and every returned one is told to the plan; the scorers score each
  returned trajectory's tokens of their resident version *while the actor trains* (the loop waits
  on the scorers' calls beside the generate calls and the train step);
- before a batch trains at version ``v`` the loop waits until every trained token older than ``v``
  has its exact ``pi_old`` and the scorers trail by at most ``maxLagVersions`` (the wait is counted:
  ``asyncrl_oldlogits_wait_seconds_total``); tokens of ``v`` itself are scored by the actor's own
  forward (:class:`~asyncrl.trainer.oldlogits.precomputed.PrecomputedProvider`);
- every new version is published to the scorers with the same handle rollout receives (under
  ``weightSync.transport: broadcast`` the scorers are members of the group and receive the bytes with
  rollout, :mod:`~asyncrl.trainer.driver.loop.weight_sync`).
"""

import time
from typing import TYPE_CHECKING, Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.driver.loop import weight_sync
from asyncrl.trainer.driver.loop.stage import Stage
from asyncrl.trainer.driver.loop.staleness import Group
from asyncrl.trainer.driver.loop.view import LoopView
from asyncrl.trainer.driver.run.step_report import WeightSync

if TYPE_CHECKING:
    from ray import ObjectRef

    from asyncrl.trainer.oldlogits.dedicated_fleet import DedicatedFleet
    from asyncrl.trainer.oldlogits.dedicated_plan import DedicatedPlan


class DedicatedStage(Stage):
    """``dedicated``: see the module docstring."""

    name = "dedicated"

    def __init__(self, spec: AsyncRLJobSpec) -> None:
        self.spec = spec
        self._plan: DedicatedPlan | None = None  # both made by start()
        self._fleet: DedicatedFleet | None = None
        self.wait_s = 0.0
        self.waits = 0
        self._replaced_seen = 0

    @property
    def plan(self) -> "DedicatedPlan":
        if self._plan is None:
            raise RuntimeError("the dedicated stage has not started")
        return self._plan

    @property
    def fleet(self) -> "DedicatedFleet":
        if self._fleet is None:
            raise RuntimeError("the dedicated stage has not started")
        return self._fleet

    def start(self, loop: LoopView) -> None:
        from asyncrl.trainer.driver.hosts.fleet import dedicated_spawner
        from asyncrl.trainer.oldlogits.dedicated_fleet import DedicatedFleet
        from asyncrl.trainer.oldlogits.dedicated_plan import DedicatedPlan

        d = self.spec.old_logits.dedicated
        spawn = loop.hosts.spawn_dedicated or dedicated_spawner(self.spec, n_procs_cpus=1.0, threads=1)
        self._plan = DedicatedPlan(replicas=d.replicas, max_lag_versions=d.max_lag_versions, start_version=loop.version)
        handles = [spawn(i) for i in range(d.replicas)]
        if self.spec.model.lora is not None:  # the versions are adapters: every scorer takes the base first
            weight_sync.give_base(loop.hosts, handles)
            spawn = _with_base(spawn, loop.hosts)
        self._fleet = DedicatedFleet(self._plan, handles, spawn)
        # Under broadcast the scorers join the weight-sync group (formed again before the next version) and
        # take the current version from the object store meanwhile.
        weight_sync.join(loop.hosts, self.fleet.handles)
        self.fleet.copies_from_peers = weight_sync.broadcasts(loop.hosts)
        self.fleet.weights[loop.version] = weight_sync.for_joiner(loop.hosts, loop.version)
        self.fleet.dispatch()

    # ---------------------------------------------------------------- what happened
    def admitted(self, loop: LoopView, ref: "ObjectRef", version: int) -> None:
        self.plan.admitted(ref, version)

    def returned(self, loop: LoopView, ref: "ObjectRef", trajs: list[Trajectory]) -> None:
        unscorable = self.plan.returned(ref, trajs)
        if unscorable:  # the plan's admission rule was broken: a bug, never trained with a wrong pi_old
            raise RuntimeError(
                f"dedicated old logits: trajectories {unscorable[:5]} hold tokens of a version the scorers "
                "already left; they cannot be scored exactly"
            )
        self.fleet.dispatch()

    def released(self, loop: LoopView, trajs: list[Trajectory]) -> None:
        self.plan.released(t.traj_id for t in trajs)

    # ---------------------------------------------------------------- the loop's waits
    def refs(self) -> list["ObjectRef"]:
        return self._fleet.refs() if self._fleet is not None else []

    def collect(self, loop: LoopView, ref: "ObjectRef") -> None:
        self.fleet.collect(ref)
        if self.fleet.replaced > self._replaced_seen:
            loop.m.worker_replacements.labels("oldlogits").inc(self.fleet.replaced - self._replaced_seen)
            self._replaced_seen = self.fleet.replaced

    def before_train(self, loop: LoopView, groups: list[Group]) -> None:
        trajs = [t for g in groups for t in g]
        t0 = time.monotonic()
        gate = self.plan.gate(trajs, loop.version)
        while gate.wait:
            if loop.wait_any() is False:
                raise RuntimeError(f"dedicated old logits: waiting for the scorers with nothing in flight "
                                   f"({gate.reason}); the plan cannot make progress: {self.plan.state()}")
            gate = self.plan.gate(trajs, loop.version)
        took = time.monotonic() - t0
        if took > 0.001:
            self.waits += 1
        self.wait_s += took
        loop.m.oldlogits_wait_seconds.inc(took)
        loop.m.oldlogits_lag.set(gate.lag)
        loop.step_extra["dedicated_wait_s"] = round(took, 4)

    def trained(self, loop: LoopView, groups: list[Group]) -> None:
        self.released(loop, [t for g in groups for t in g])

    def sync_weights(self, loop: LoopView, weights: Any, version: int) -> WeightSync:
        out = super().sync_weights(loop, weights, version)
        # hosts.weights: this version's handle (under broadcast the scorers already hold it, or -- when they
        # missed it -- its object-store copy)
        self.fleet.publish(version, loop.hosts.weights)
        return out

    def summary(self) -> dict[str, Any]:
        import ray

        if self._plan is None or self._fleet is None:  # not started (or its start failed)
            return {}
        st = self.plan.state()
        scorers = []
        for h in self.fleet.handles:
            try:
                scorers.append(vars(ray.get(h.state.remote(), timeout=30)))
            except Exception:  # noqa: BLE001 -- a dead scorer reports nothing
                scorers.append(None)
        return {"dedicated": {
            "resident_version": st.resident, "latest_version": st.latest,
            "scored_tokens": st.scored_tokens_total, "requeued_tokens": st.requeued_tokens_total,
            "wait_s": round(self.wait_s, 3), "waits": self.waits, "replacements": self.fleet.replaced,
            "scorers": scorers,
        }}


def _with_base(spawn: Any, hosts: Any) -> Any:
    """``spawn`` for a LoRA job: a respawned scorer takes the actor's frozen base before any version. (It holds
    the hosts, not the loop: the fleet keeps it, and a loop -> stage -> fleet -> loop cycle would keep the
    scorers' handles, so their processes, alive until a garbage collection.)"""

    def respawn(replica: int) -> Any:
        handle = spawn(replica)
        weight_sync.give_base(hosts, [handle])
        return handle

    return respawn
