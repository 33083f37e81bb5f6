"""What the actor reports: :class:`TrainStepMetrics` (one RL step), :class:`SftStepMetrics` (one warm-start
step), and :class:`UpdateTally`, what the updates of one batch did while they ran.

The reports are frozen and typed; they cross Ray as they are and are flattened to text only where text
is written (:func:`asyncrl.trainer.driver.run.step_report.step_line`). ``applied`` is the one name for "the
version advanced": at least one optimizer update of the batch was applied.
"""

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.oldlogits.audit import AuditStats
from asyncrl.trainer.oldlogits.ewma import EwmaProvider


@dataclass(frozen=True)
class TrainStepMetrics:
    """What one :meth:`MegatronActor.train_step` (one batch, one version) did. Counters (``*_total``) are
    cumulative; per-update values are means over the batch's updates with their last value beside."""

    version: int  # actor version after the step
    reference: str  # which reference produced logp_ref (docs/architecture.md, the path of one token: always said)
    applied: bool  # True: at least one update applied, so the version advanced (by one)
    loss: float  # mean loss of the updates that computed a finite one (nan when none did)
    grad_norm: float  # mean gradient norm (before clipping) of the applied updates; nan when none applied
    valid_tokens: int  # loss_mask.sum()
    nonfinite_loss_total: int
    nonfinite_grad_total: int
    ewma_reset: bool
    ewma_reset_reason: str  # why the EWMA reference was reset this step ("" when it was not)
    ewma_resets_total: int
    reference_seconds: float  # the extra forward of the reference (0 when none)
    forward_seconds: float
    backward_seconds: float  # backward + clip + optimizer step
    # The loss's counts and sums over every micro-batch of every update, summed over the DP ranks.
    correction: CorrectionStats[float]
    # Weight versions resident after the step (snapshot strategy + audit), and their bytes (host memory, or
    # file sizes for snapshot.device disk). Not the cap (oldLogits.snapshot.maxVersions).
    snapshot_resident_versions: int = 0
    snapshot_resident_bytes: int = 0
    audit_seconds: float = 0.0  # the audit's exact forwards and statistics (0 on non-audit steps)
    audit: AuditStats | None = None  # on an audited step; None otherwise
    updates: int = 1  # optimizer updates planned for the batch: epochs x min(minibatches, rows)
    updates_applied: int = 0  # of them, applied (finite loss and gradient norm)
    updates_skipped: int = 0  # of them, skipped: non-finite loss or gradient norm (counted in *_total too)
    micro_batches: int = 1  # gradient forwards of the step (over all updates)
    loss_last: float = math.nan  # the last update's loss (nan when it stopped before)
    grad_norm_last: float = math.nan  # the last update's gradient norm (nan when it stopped before backward)
    in_bounds_ratio: float = 1.0  # share of the batch's valid tokens with r_d inside mask.bounds (EWMA reset)
    # The EWMA reset rule (trainer/correction/ewma_reset.py): the threshold in force (nan: none, or not ewma),
    # the outcome of an earlier reset decided at this version ("recovered" / "unrecovered" / ""), and counters.
    learning_rate: float = math.nan  # the optimizer's learning rate for this step's updates (ActorOptimizer.learning_rate())
    ewma_reset_threshold: float = math.nan
    ewma_reset_outcome: str = ""
    ewma_resets_recovered_total: int = 0
    ewma_resets_unrecovered_total: int = 0
    # routing replay: trained tokens (over every update) whose replayed routes the training forward's own router
    # would have changed in >= 1 MoE layer, and the trained tokens replayed (both 0 without replay)
    route_flips: float = 0.0
    route_tokens: float = 0.0


@dataclass(frozen=True)
class SftStepMetrics:
    """What one :meth:`MegatronActor.sft_step` did."""

    version: int
    applied: bool  # the optimizer step was applied (finite loss and gradient norm): the version advanced
    loss: float  # mean next-token cross-entropy over loss_mask tokens (nats)
    grad_norm: float
    valid_tokens: int
    seconds: float


@dataclass
class UpdateTally:
    """What the updates of one batch did (stage 2 of :meth:`MegatronActor.train_step`), for the report."""

    reference_seconds: float = 0.0
    records: list[CorrectionStats[torch.Tensor]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # the minibatch loss of every update that computed one
    norms: list[float] = field(default_factory=list)  # the gradient norm of every applied update
    skipped: int = 0
    micro: int = 0
    loss_last: float = math.nan
    grad_last: float = math.nan
    forward_s: float = 0.0
    backward_s: float = 0.0
    # routing replay: per micro-batch, trained tokens whose replayed routes differ from the training forward's
    # own router in >= 1 MoE layer, and the trained tokens counted (0-dim tensors: no host sync per micro-batch)
    route_flips: list[torch.Tensor] = field(default_factory=list)
    route_tokens: list[torch.Tensor] = field(default_factory=list)

    @property
    def applied(self) -> bool:
        """At least one update applied (the same on every rank: the norm and the finite flag are global)."""
        return bool(self.norms)

    @property
    def loss_mean(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else math.nan

    @property
    def grad_norm_mean(self) -> float:
        return sum(self.norms) / len(self.norms) if self.norms else math.nan


# A rank that trained no row this batch (fewer rows than DP ranks): zero counts, the neutral extremes.
NO_TOKENS = CorrectionStats(**{f.name: 1.0 if f.name in ("rd_min", "rd_max", "rs_min", "rs_max") else 0.0
                               for f in dataclasses.fields(CorrectionStats)})


class EwmaResetFields(TypedDict, total=False):
    """The ``ewma_reset_*`` fields of :class:`TrainStepMetrics` (typed, so they unpack into it)."""

    ewma_reset_threshold: float
    ewma_reset_outcome: str
    ewma_resets_recovered_total: int
    ewma_resets_unrecovered_total: int


def ewma_reset_fields(provider: object) -> EwmaResetFields:
    """The ``ewma_reset_*`` fields of a step report from the ewma provider (the one with a reset rule);
    none (the defaults) for every other provider."""
    if not isinstance(provider, EwmaProvider):
        return {}
    st = provider.reset_status()
    return {"ewma_reset_threshold": st.threshold, "ewma_reset_outcome": st.outcome,
            "ewma_resets_recovered_total": st.recovered_total, "ewma_resets_unrecovered_total": st.unrecovered_total}

