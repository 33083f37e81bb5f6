"""The driver's side of the snapshot and interrupt-sync strategies: what each needs from the loop
(:class:`~asyncrl.trainer.driver.loop.stage.Stage` is the hooks; this module, two of its subclasses):

- ``snapshot``: the actor keeps the weights of exactly the versions a not-yet-trained token still
  references; the driver knows them (waiting groups, generate calls in flight) and passes them
  with every step (:class:`SnapshotStage`);
- ``interruptSync``: around every weight sync ``v -> v+1`` the rollout workers are interrupted and
  held, score every untrained token of version ``v`` with the training-side model on their own
  resources, take the new weights and resume (:class:`InterruptSyncStage`, paper §5.1);
- ``dedicated`` has a module of its own (:mod:`.dedicated_stage`); every other reference uses
  :class:`~asyncrl.trainer.driver.loop.stage.Stage` itself.
"""

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.driver.loop import weight_sync
from asyncrl.trainer.driver.loop.accounting import set_sync_phase
from asyncrl.trainer.driver.loop.stage import PhaseCallback, Stage, StepKwargs, sync_report
from asyncrl.trainer.driver.loop.staleness import Group
from asyncrl.trainer.driver.loop.view import LoopView
from asyncrl.trainer.driver.run.step_report import WeightSync
from asyncrl.trainer.oldlogits.retention import cap_drop, live_versions
from asyncrl.trainer.oldlogits.score_result import ScoreResult

if TYPE_CHECKING:
    from ray import ObjectRef

    from asyncrl.trainer.weight_sync.outcome import SyncOutcome

log = logging.getLogger(__name__)
T = TypeVar("T")

class SnapshotStage(Stage):
    """``snapshot`` (and the audit of a cheap reference): tell the actor which versions untrained
    tokens still reference, so it keeps exactly those weight snapshots.

    After the step at version ``v`` the next batch trains at ``v+1`` and takes no token older than
    ``v+1-W``; of those versions only the ones held by a waiting group or possibly by a generate
    call in flight (admitted at ``a``: any of ``a .. v+1``) are kept.

    ``cap`` (``oldLogits.snapshot.maxVersions``) is a hard limit. Validation refuses a cap below
    ``W+1``, the most versions the window can reference, so it binds only if that invariant breaks;
    then the oldest versions are given up: waiting groups holding them are dropped (counted as
    ``snapshot_cap``, logged), and so is every group that comes back holding one -- never scored
    under another version.
    """

    name = "snapshot"

    def __init__(self, cap: int = 0) -> None:
        self.cap = cap
        self.given_up: set[int] = set()

    def _holds_given_up(self, group: Group) -> bool:
        return any(v in self.given_up for t in group for v in t.sampled_versions)

    def _drop(self, loop: LoopView) -> None:
        dropped = loop.buffer.drop_where(self._holds_given_up)
        if dropped.groups:
            log.warning("snapshot cap %d: dropped %d groups holding versions %s whose weights were given up",
                        self.cap, dropped.groups, sorted(self.given_up))
            loop.m.trajectories_dropped.labels("snapshot_cap").inc(dropped.trajectories)
            loop.m.tokens_dropped.labels("snapshot_cap").inc(dropped.sampled_tokens)

    def returned(self, loop: LoopView, ref: "ObjectRef", trajs: list[Trajectory]) -> None:
        if self.given_up:
            self._drop(loop)

    def step_kwargs(self, loop: LoopView) -> StepKwargs:
        # Rollout samples with the current version until this step's weights arrive, also in calls admitted
        # while the actor trains: such a call is one in flight since ``loop.version``.
        in_flight_since = [*loop.workers.admitted_versions(), loop.version]
        live = live_versions(loop.buffer.waiting(), in_flight_since, loop.version, loop.W) - self.given_up
        gone = cap_drop(live, self.cap) if self.cap else set()
        if gone:
            self.given_up |= gone
            live -= gone
            self._drop(loop)
        return {"live_versions": sorted(live)}


@dataclass
class SyncTimes:
    """Cumulative interrupt-sync accounting (the run summary's ``interrupt_sync``)."""

    syncs: int = 0
    tokens_scored: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        ("interrupt", "score", "update", "resume"), 0.0))
    release_s: float = 0.0
    acquire_s: float = 0.0
    scorer_build_s: float = 0.0  # the training-side model built on the workers (each window with release)
    scorer_load_s: float = 0.0  # the outgoing version's weights loaded into it
    stuck: int = 0  # phases that ran past phaseTimeoutSeconds


class InterruptSyncStage(Stage):
    """``interruptSync``: every weight sync ``v -> v+1`` runs four timed phases (paper §5.1).

    1. *interrupt*: every worker stops at a token boundary and holds; the generate calls in flight
       return their finished trajectories (into the buffer), unfinished episodes stay suspended in
       their worker;
    2. *score*: every untrained sampled token of version ``v`` -- in suspended episodes and in the
       waiting groups -- gets its exact ``pi_old`` from the training-side model code on the rollout
       workers' own resources (their engines released meanwhile when ``releaseRolloutResources``);
       tokens of ``v`` in the batch just trained were scored by the actor's own forward;
    3. *update*: the workers take version ``v+1``;
    4. *resume*: generation continues (suspended episodes under ``v+1``: a partial rollout).

    So every token is scored exactly once, under its own version, while that version is resident.
    Rollout makes no token between *interrupt* and *resume*: that stall is this strategy's cost.

    A worker found dead at *interrupt* is replaced there (``LoopView.on_every_worker``): the replacement takes
    version ``v+1`` at once (under LoRA with the actor's base) and sits out *score*; the dead worker's suspended
    episodes are aborted, and the waiting groups' tokens are shared among the workers that still hold ``v``. When
    none does (every worker died) and tokens of ``v`` wait, the job stops with that reason.
    """

    name = "interruptSync"

    def __init__(self, spec: AsyncRLJobSpec, on_phase: PhaseCallback | None = None) -> None:
        self.timeout = float(spec.old_logits.interrupt_sync.phase_timeout_seconds)
        self.release = bool(spec.old_logits.interrupt_sync.release_rollout_resources)
        self.on_phase = on_phase
        self.times = SyncTimes()

    def _phase(self, loop: LoopView, phase: str) -> None:
        set_sync_phase(loop.m, phase)
        if self.on_phase is not None:
            self.on_phase(phase)

    def sync_weights(self, loop: LoopView, weights: Any, version: int) -> WeightSync:
        import ray

        old = version - 1
        took: dict[str, float] = {}
        holding: list[Any] = []  # the workers that hold version ``old`` (a replacement holds ``version`` already)

        def timed(phase: str, work: Callable[[], T]) -> T:
            self._phase(loop, phase)
            t0 = time.monotonic()
            out = work()
            took[phase] = time.monotonic() - t0
            loop.m.sync_phase_duration.labels(phase).observe(took[phase])
            self.times.seconds[phase] += took[phase]
            if took[phase] > self.timeout:
                self.times.stuck += 1
            return out

        def interrupt() -> None:
            held = loop.on_every_worker(lambda w: w.sync_interrupt.remote(self.timeout))  # None: replaced
            holding.extend(w for w, n in zip(loop.hosts.rollout, held, strict=True) if n is not None)
            while refs := loop.workers.refs():  # held workers return promptly: collect what they finished
                done, _ = ray.wait(refs, num_returns=1)
                loop.collect(done[0])

        def score() -> int:
            todo = [t for g in loop.buffer.waiting() for t in g if t.unscored(old)]
            if todo and not holding:
                raise RuntimeError(
                    f"interruptSync: every rollout worker died before the window of version {version}, so none holds "
                    f"version {old} to score the {len(todo)} waiting trajectories' tokens of it; the job stops rather "
                    "than train them without their exact pi_old (run more than one rollout worker to survive a death)")
            shares = [todo[i::len(holding)] for i in range(len(holding))]
            outs: list[ScoreResult] = ray.get([w.sync_score.remote(share, old, self.release)
                                               for w, share in zip(holding, shares, strict=True)])
            n = 0
            for share, out in zip(shares, outs, strict=True):
                for t, (pos, val) in zip(share, out.scores, strict=True):
                    if pos:
                        t.set_logp_old(pos, val)
                n += out.tokens
                self.times.release_s += out.release_seconds
                self.times.acquire_s += out.acquire_seconds
                self.times.scorer_build_s += out.scorer_build_seconds
                self.times.scorer_load_s += out.scorer_load_seconds
            return n

        parts: list[SyncOutcome | None] = []
        try:
            timed("interrupt", interrupt)
            self.times.tokens_scored += timed("score", score)
            # every worker, a replacement too (it takes the version again: under broadcast it is in the group)
            parts = timed("update", lambda: weight_sync.to_workers(loop.hosts, loop.hosts.rollout, weights, version))
            timed("resume", lambda: ray.get([w.sync_resume.remote() for w in loop.hosts.rollout]))
        finally:
            self._phase(loop, "idle")
        self.times.syncs += 1
        # Generation stands still from interrupt to resume: the whole window is this strategy's pause.
        window = sum(took.values())
        return dataclasses.replace(sync_report(window, parts), pause_seconds=window, phases=dict(took))

    def summary(self) -> dict[str, Any]:
        t = self.times
        return {"interrupt_sync": {"syncs": t.syncs, "tokens_scored": t.tokens_scored,
                                   "phase_s": {p: round(s, 3) for p, s in t.seconds.items()},
                                   "release_s": round(t.release_s, 3), "acquire_s": round(t.acquire_s, 3),
                                   "scorer_build_s": round(t.scorer_build_s, 3),
                                   "scorer_load_s": round(t.scorer_load_s, 3),
                                   "phases_over_timeout": t.stuck}}
