"""One step's report, typed from the actor to the text: :class:`ActorStep` crosses Ray from
:meth:`ActorHost.train_step`, the loop adds its own figures (:class:`StepReport`), and :func:`step_line`
flattens it, once, where text is written (``metrics.jsonl``, the run's ``steps``, the report plot).

Names on this path, one per concept:

- ``applied``: at least one optimizer update of the batch was applied, so the version advanced (a step not
  applied made no version: a non-finite loss or gradient norm on every update);
- ``staleness_max``: the observed worst version gap of a trained token in the batch (never W, the setting
  ``async.maxStaleness`` the guard holds it to);
- ``snapshot_resident_versions``: weight versions resident in the actor after the step (never the cap,
  ``oldLogits.snapshot.maxVersions``).

The line keeps the keys readers of ``metrics.jsonl`` use (docs/metrics.md); ``version`` is written only
for an applied step (the new version), as before, and ``applied`` says so explicitly.
"""

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.trainer.actor.reports import TrainStepMetrics


@dataclass(frozen=True)
class ActorStep:
    """What :meth:`ActorHost.train_step` returns beside the new weights' sync handle."""

    metrics: TrainStepMetrics
    publish_seconds: float = 0.0  # gather, convert, cast, pack, put of the new weights (0: not applied)
    # a step not applied: what the batch held (TrainBatch.summary(), the non-finite values' context)
    batch_summary: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightSync:
    """How one version reached the rollout workers (the slowest worker's parts)."""

    seconds: float  # the whole hand-over, as the driver waited for it
    transfer_seconds: float | None = None  # buckets pulled while generation ran (None: no worker answered)
    pause_seconds: float | None = None  # generation stopped installing weights (interruptSync: the whole window)
    bytes: float | None = None  # one worker's payload
    phases: Mapping[str, float] = field(default_factory=dict)  # interruptSync: seconds per phase


@dataclass(frozen=True)
class StepReport:
    """One actor step as the driver saw it: the actor's report plus the batch, timing and sync figures."""

    step: int  # the step's number: the version it trained at + 1
    wall_s: float  # seconds since the run started
    reward_mean: float
    success_rate: float
    staleness_mean: float  # mean version gap of the batch's trained tokens
    staleness_max: int  # worst version gap of a trained token (<= W, checked)
    trajectories: int
    partial_frac: float
    step_s: float  # the actor's step as the driver waited for it
    env_errors: int  # episodes the environment's code aborted so far (a running total)
    actor: ActorStep
    dedicated_wait_s: float | None = None  # the dedicated stage: the wait for the batch's old logits (None: no wait)
    sync: WeightSync | None = None  # None: not applied (nothing synced)
    checkpoint: str | None = None
    export: str | None = None
    export_s: float | None = None
    dropped_groups_total: int = 0

    @property
    def applied(self) -> bool:
        return self.actor.metrics.applied

    @property
    def version(self) -> int | None:
        """The version this step made (None: not applied)."""
        return self.actor.metrics.version if self.applied else None

    def with_(self, **changes: Any) -> "StepReport":
        return dataclasses.replace(self, **changes)


def _actor_part(a: ActorStep) -> dict[str, Any]:
    m = a.metrics
    out: dict[str, Any] = {
        "applied": m.applied, "loss": m.loss, "grad_norm": m.grad_norm, "reference": m.reference,
        "ewma_reset": int(m.ewma_reset), "ewma_reset_reason": m.ewma_reset_reason,
        "actor_forward_s": round(m.forward_seconds, 4),
        "actor_reference_s": round(m.reference_seconds, 4), "actor_backward_s": round(m.backward_seconds, 4),
        "snapshot_resident_versions": m.snapshot_resident_versions,
        "snapshot_resident_bytes": m.snapshot_resident_bytes,
        "actor_audit_s": round(m.audit_seconds, 4),
        # train.minibatches x train.epochs updates per batch
        "updates": m.updates, "updates_applied": m.updates_applied, "updates_skipped": m.updates_skipped,
        "micro_batches": m.micro_batches, "loss_last": m.loss_last, "grad_norm_last": m.grad_norm_last,
        "in_bounds_ratio": m.in_bounds_ratio,
        "learning_rate": m.learning_rate,
        # routing replay: share of trained tokens whose replayed routes the training forward's router would change
        **({"route_flip_frac": m.route_flips / m.route_tokens, "route_replayed_tokens": m.route_tokens}
           if m.route_tokens else {}),
        **m.correction.record(), **(m.audit.record() if m.audit is not None else {}),
    }
    if not math.isnan(m.ewma_reset_threshold):  # the ewma reference's reset rule (none before its warm-up)
        out["ewma_reset_threshold"] = round(m.ewma_reset_threshold, 6)
    if m.ewma_reset_outcome:  # an earlier reset's outcome, decided W versions after it
        out["ewma_reset_outcome"] = m.ewma_reset_outcome
    if m.applied:
        out["weights_publish_s"] = round(a.publish_seconds, 4)
    else:
        out["batch_summary"] = dict(a.batch_summary)
    return out


def _sync_part(s: WeightSync) -> dict[str, Any]:
    out: dict[str, Any] = {"sync_s": round(s.seconds, 4)}
    if s.transfer_seconds is not None:
        out["sync_transfer_s"] = round(s.transfer_seconds, 4)
    if s.pause_seconds is not None:
        out["sync_pause_s"] = round(s.pause_seconds, 4)
    if s.bytes is not None:
        out["sync_bytes"] = s.bytes
    out |= {f"sync_{p}_s": round(v, 4) for p, v in s.phases.items()}
    return out


def step_line(r: StepReport) -> dict[str, Any]:
    """The report as one ``metrics.jsonl`` line (a flat JSON object; the only place it is flattened)."""
    out: dict[str, Any] = {
        "step": r.step, "wall_s": round(r.wall_s, 3), "reward_mean": r.reward_mean,
        "success_rate": r.success_rate, "staleness_mean": r.staleness_mean, "staleness_max": r.staleness_max,
        "trajectories": r.trajectories, "partial_frac": r.partial_frac, "step_s": round(r.step_s, 4),
        "env_errors": r.env_errors,
        **_actor_part(r.actor),
    }
    if r.dedicated_wait_s is not None:  # what the old-logit stage adds
        out["dedicated_wait_s"] = r.dedicated_wait_s
    if r.applied:
        out["version"] = r.version
        if r.sync is not None:
            out |= _sync_part(r.sync)
        if r.checkpoint is not None:
            out["checkpoint"] = r.checkpoint
        if r.export is not None:
            out["export"] = r.export
            out["export_s"] = r.export_s
    out["dropped_groups_total"] = r.dropped_groups_total
    return out
