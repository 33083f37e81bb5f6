"""Live audit of a cheap reference against exact ``pi_old`` (issue 8 §3, ``correction.audit``).

With a cheap reference (``behavior``, ``current``, ``linear``, ``loglinear``, ``ewma``) and
``correction.audit.everyNSteps > 0``, the actor also keeps weight snapshots (the same store and the
same retention as the snapshot strategy) and, on every Nth step, scores a ``fraction`` of the batch
rows exactly under the version that generated each token (with routing replay, through the routes that
version sampled it with, as the snapshot strategy does). Per audited step, over those rows' trained tokens:

- ``abs_diff_mean``, ``abs_diff_p99``: mean and 99th percentile (linear interpolation, as
  ``torch.quantile``) of ``|log pi_ref - log pi_old|``;
- ``mask_disagree_tokens``: tokens whose discrepancy keep decision differs between ``pi_ref / mu``
  and ``pi_old / mu``: the keep of mode ``mask`` (in the band, not vetoed) at the job's level,
  bounds and veto, whatever the job's mode (for ``truncate`` the band decides where the clamp acts);
- ``clip_disagree_tokens``: tokens whose staleness clip stops the gradient for one of
  ``pi_theta / pi_ref`` and ``pi_theta / pi_old`` but not the other (sign-aware, the job's clip);
- ``tokens``: the denominator of all of the above.

The decisions come from the loss's own functions (:func:`~asyncrl.trainer.correction.discrepancy.
discrepancy_weights`, :func:`~asyncrl.trainer.correction.clip.ppo_clip`), never re-derived here.

With a data-parallel actor the seeded row choice is global (every rank draws the same rows), each DP rank
scores its token-balanced share of them (:func:`~asyncrl.trainer.megatron.parallel.dp_share`) and the parts
are reduced over the DP group: the counts add, the distances are taken over every rank's differences
(gathered: a percentile does not add), so every rank reports what one process would.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.api.correction import CorrectionSpec, DiscrepancyMode
from asyncrl.trainer.megatron import parallel
from asyncrl.trainer.oldlogits.protocol import PaddedBatch, Scorer
from asyncrl.trainer.oldlogits.snapshot import StoreBacked, WeightSnapshots, score_exact

PREFIX = "audit_"  # every metric name of an audited step starts with it


@dataclass(frozen=True)
class AuditStats:
    """One audited step. Counts are exact; the two distances are over ``tokens`` tokens."""

    tokens: int  # trained tokens of the audited rows with finite log-probs (the denominator)
    rows: int  # batch rows scored exactly
    rows_unscorable: int  # chosen rows left out: a version of theirs is not resident (none after a resume)
    abs_diff_mean: float  # mean |log pi_ref - log pi_old| (nan when tokens == 0)
    abs_diff_p99: float  # 99th percentile of the same (nan when tokens == 0)
    mask_disagree_tokens: int
    clip_disagree_tokens: int

    def record(self) -> dict[str, float]:
        """Flat metrics under :data:`PREFIX`: counts, the two distances and the two fractions
        (``*_disagree`` = ``*_disagree_tokens / tokens``, nan when ``tokens == 0``)."""
        n = self.tokens
        out = {
            "tokens": float(n),
            "rows": float(self.rows),
            "rows_unscorable": float(self.rows_unscorable),
            "abs_diff_mean": self.abs_diff_mean,
            "abs_diff_p99": self.abs_diff_p99,
            "mask_disagree_tokens": float(self.mask_disagree_tokens),
            "clip_disagree_tokens": float(self.clip_disagree_tokens),
            "mask_disagree": self.mask_disagree_tokens / n if n else math.nan,
            "clip_disagree": self.clip_disagree_tokens / n if n else math.nan,
        }
        return {PREFIX + k: v for k, v in out.items()}


@dataclass(frozen=True)
class AuditParts:
    """What one rank's audited rows add to the step's audit (reduced over DP by :func:`merge_parts`)."""

    diffs: Tensor  # [n] float64 |log pi_ref - log pi_old| of the audited tokens
    mask_disagree_tokens: int
    clip_disagree_tokens: int


def merge_parts(parts: Sequence[AuditParts], *, rows: int, rows_unscorable: int) -> AuditStats:
    """One audit from the parts of every rank (pure): counts add, the distances over all the differences."""
    diff = torch.cat([p.diffs.reshape(-1).to(torch.float64).cpu() for p in parts]) if parts else torch.zeros(0)
    n = int(diff.numel())
    return AuditStats(
        tokens=n, rows=rows, rows_unscorable=rows_unscorable,
        abs_diff_mean=float(diff.mean()) if n else math.nan,
        abs_diff_p99=float(torch.quantile(diff, 0.99)) if n else math.nan,
        mask_disagree_tokens=sum(p.mask_disagree_tokens for p in parts),
        clip_disagree_tokens=sum(p.clip_disagree_tokens for p in parts),
    )


def audit_parts(
    logp_theta: Tensor,
    logp_ref: Tensor,
    logp_old: Tensor,
    logp_mu: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    spec: CorrectionSpec,
    *,
    turn_ids: Tensor | None = None,
) -> AuditParts:
    """The differences and disagreement counts of these rows (pure; see the module docstring).

    Args:
        logp_theta: ``[b, T]`` current log-probs (detached inside).
        logp_ref: ``[b, T]`` the cheap reference's log-probs.
        logp_old: ``[b, T]`` exact training-side old log-probs (each token under its own version).
        logp_mu: ``[b, T]`` inference log-probs.
        advantages: ``[b, T]`` (or ``[b]``) advantages.
        loss_mask: ``[b, T]`` bool, True = a trained token.
        spec: the job's ``correction`` (mask level, bounds, veto; clip bounds and dual clip).
        turn_ids: ``[b, T]`` turn ids (mask level ``turn``).
    """
    from asyncrl.trainer.correction import indicators as ind
    from asyncrl.trainer.correction.clip import ppo_clip
    from asyncrl.trainer.correction.discrepancy import SAFETY_BOUND, discrepancy_weights

    shape = loss_mask.shape
    named = {"logp_theta": logp_theta, "logp_ref": logp_ref, "logp_old": logp_old, "logp_mu": logp_mu}
    bad = [f"{n} {tuple(t.shape)}" for n, t in named.items() if t.shape != shape]
    if advantages.shape not in (shape, shape[:1]) or loss_mask.dim() != 2:
        bad.append(f"advantages {tuple(advantages.shape)} (must be [b, T] or [b])")
    if bad:
        raise ValueError(f"audit_parts: shape mismatch with loss_mask {tuple(shape)} = [b, T]: " + ", ".join(bad))
    dtype = torch.float64  # a diagnostic: exact counts, no rounding ties between the two references
    with torch.no_grad():
        theta, ref, old, mu = (t.detach().to(dtype) for t in (logp_theta, logp_ref, logp_old, logp_mu))
        adv = advantages.detach().to(dtype)
        adv = adv.unsqueeze(-1).expand(shape) if adv.dim() == 1 else adv
        finite = torch.isfinite(theta + ref + old + mu + adv)
        valid_b = loss_mask & finite  # [b, T] the audited tokens
        valid = ind.from_bool(valid_b, dtype)
        diff = (ref - old).abs()[valid_b]  # [n]

        def keep(logp: Tensor) -> Tensor:  # [b, T] 0/1: mode mask's keep of r_d = pi / mu (as the loss)
            log_rd = (logp - mu).nan_to_num(0.0, 0.0, 0.0).mul_(valid)
            log_rd_unclamped = log_rd.clone()
            log_rd.clamp_(-SAFETY_BOUND, SAFETY_BOUND)
            return discrepancy_weights(
                log_rd, log_rd.exp(), valid, mode=DiscrepancyMode.MASK, level=spec.mask.level,
                low=spec.mask.bounds.low, high=spec.mask.bounds.high, veto_below=spec.mask.veto_below,
                turn_ids=turn_ids, log_rd_unclamped=log_rd_unclamped,
            ).keep

        def stopped(logp: Tensor) -> Tensor:  # [b, T] 0/1: the clip stops the gradient (as the loss)
            log_rs = (theta - logp).nan_to_num(0.0, 0.0, 0.0).mul_(valid)
            saturated = log_rs.abs().gt(SAFETY_BOUND).to(dtype)
            rs = log_rs.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
            clip = ppo_clip(
                rs, adv.nan_to_num(0.0, 0.0, 0.0) * valid, eps_low=spec.clip.low, eps_high=spec.clip.high,
                dual_clip=spec.clip.dual_clip, extra_stop=saturated,
            )
            return clip.stopped * valid

        mask_disagree = int((keep(ref) != keep(old)).logical_and_(valid_b).sum())
        clip_disagree = int((stopped(ref) != stopped(old)).logical_and_(valid_b).sum())
    return AuditParts(diffs=diff, mask_disagree_tokens=mask_disagree, clip_disagree_tokens=clip_disagree)


def audit_rows(loss_mask: Tensor, fraction: float, *, seed: int, version: int) -> Tensor:
    """The rows to audit (sorted ``[k]`` long): ``ceil(fraction * m)`` of the ``m`` rows holding a
    trained token, chosen by a generator seeded from ``(seed, version)`` (the same on a rerun)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"correction.audit.fraction must be in (0, 1]; got {fraction}")
    candidates = loss_mask.any(dim=1).nonzero().squeeze(1).cpu()  # [m]
    k = math.ceil(fraction * candidates.numel())
    g = torch.Generator().manual_seed(seed * 1_000_003 + version)
    picked = candidates[torch.randperm(candidates.numel(), generator=g)[:k]]
    return picked.sort().values


class Auditor(StoreBacked):
    """The audit of one actor: its snapshot store (retention as the snapshot strategy) and its steps.

    Args:
        every_n_steps: audit the step that makes version ``k * every_n_steps`` (``k >= 1``).
        fraction: share of the batch rows scored exactly.
        seed: ``train.seed`` (with the version, it chooses the rows).
        capacity: most resident versions (``W + 1``: all that the staleness bound admits).
    """

    def __init__(self, every_n_steps: int, fraction: float, *, seed: int, capacity: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"correction.audit.everyNSteps must be >= 1 for an auditor; got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.fraction = fraction
        self.seed = seed
        self.store = WeightSnapshots(capacity)

    def due(self, version: int) -> bool:
        """Whether the step at ``version`` (making ``version + 1``) is audited."""
        return (version + 1) % self.every_n_steps == 0

    def before_step(self, scorer: Scorer) -> None:
        """Record the live version if not resident yet (version 0, or the first step after a resume)."""
        self.store.record(scorer.version, scorer.named_weights())

    def after_update(self, scorer: Scorer) -> None:
        """Record the version the update just made (rollout receives it now)."""
        self.store.record(scorer.version, scorer.named_weights())

    def run(
        self, batch: PaddedBatch, scorer: Scorer, version: int, logp_theta: Tensor, logp_ref: Tensor,
        spec: CorrectionSpec,
    ) -> AuditStats:
        """Score the chosen rows exactly and compare (under DP: this rank's share, reduced over the group).

        Args:
            batch: the step's batch; version: the version it met (chooses the rows).
            scorer: runs the exact forwards from the stored snapshots (its live weights are not used,
                so this may run after the update).
            logp_theta, logp_ref: ``[B, T]`` the step's current and reference log-probs.
            spec: the job's ``correction``.
        """
        chosen = audit_rows(batch.loss_mask, self.fraction, seed=self.seed, version=version)
        resident = torch.tensor(self.store.versions, dtype=torch.long)
        sampled = batch.versions[chosen].cpu()  # [k, T]
        mask = batch.loss_mask[chosen].cpu()
        ok = (~mask | torch.isin(sampled, resident)).all(dim=1)  # [k] every trained token's version kept
        rows = chosen[ok].to(batch.tokens.device)
        dp_rank, dp_size = parallel.dp_rank_size()
        mine = parallel.dp_share(rows, batch.loss_mask, dp_rank, dp_size)  # every row when alone
        loss_mask = batch.loss_mask[mine]
        slots, slot_versions = batch.route_slots, batch.route_slot_versions  # routing replay: each version's routes
        logp_old = score_exact(self.store, scorer, batch.tokens[mine], batch.versions[mine], loss_mask,
                               None if slots is None else slots[mine],
                               None if slot_versions is None else slot_versions[mine])
        part = audit_parts(logp_theta[mine], logp_ref[mine], logp_old, batch.logp_mu[mine], batch.advantages[mine],
                           loss_mask, spec, turn_ids=batch.turn_ids[mine])
        return merge_parts(_gather_parts(part, dp_size), rows=int(rows.numel()), rows_unscorable=int((~ok).sum()))


def _gather_parts(part: AuditParts, dp_size: int) -> list[AuditParts]:
    """Every DP rank's part, in DP-rank order (the same list on every rank; no collective when alone)."""
    if dp_size == 1:
        return [part]
    import torch.distributed as dist

    local = AuditParts(part.diffs.detach().cpu(), part.mask_disagree_tokens, part.clip_disagree_tokens)
    everyone: list[AuditParts | None] = [None] * dp_size
    dist.all_gather_object(everyone, local, group=parallel.dp_group())
    return [p for p in everyone if p is not None]

