"""The decoupled off-policy correction loss (paper §3.2 Eq. 3–4, docs/architecture.md, notation).

Per valid token, with ``r_d = pi_ref / mu`` and ``r_s = pi_theta / pi_ref``::

    term = w(r_d) * pg(r_s, A)

``w`` is the symmetric discrepancy weight (:mod:`.discrepancy`, never looks at the sign of ``A``),
``pg`` the sign-aware PPO clip with optional dual clip (:mod:`.clip`). The loss reduces ``term``
with denominators counted *before* the discrepancy mask, so rejecting tokens never inflates the
gradient of the others (inclusionAI/AReaL ``areal/utils/functional/functional.py``, its
``loss_mask_count``).

Why it is written this way:
1. Inputs are upcast to at least fp32 before subtracting log-probs (bf16 differences are coarse).
2. A token with a non-finite log-prob or advantage is invalid: its values are replaced
   (``nan_to_num``, then zeroed by the validity indicator) before any arithmetic that reaches the
   loss, and it is counted (docs/architecture.md, the path of one token). No NaN reaches the loss or the gradient.
3. Every log-ratio is clamped to ``±SAFETY_BOUND`` (20, verl's bound) before ``exp``; where
   ``log r_s`` is clamped its gradient is 0, as autograd of ``exp(clamp(.))`` would give.
4. The whole forward runs under ``no_grad`` and the gradient w.r.t. ``logp_theta`` is attached
   analytically (``d term / d log pi_theta = -A * r_s * w`` where the clip lets it through, else
   0), so the backward pass is one multiply instead of replaying ~20 elementwise kernels. The
   tests check it against autograd of an independent loop implementation. Double backward is not
   supported (PPO never needs it).
5. Masks are 0/1 floats and scratch buffers are reused (:mod:`.indicators`); ``log r_s`` and
   ``log r_d`` share one ``[2, B, T]`` buffer so their NaN guard, clamp, ``expm1``, sums and
   extremes are one kernel each; metrics come from counts the loss already has (per-row clip
   counts for per-sequence advantages, extremes in one min and one max reduction). ``bench/correction.py``
   compares forward + backward with a bare autograd PPO-clip loss (``docs/results.md``).
"""

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from asyncrl.api.correction import CorrectionSpec, DiscrepancyLevel, DiscrepancyMode, LossAggregation
from asyncrl.trainer.correction import indicators as ind
from asyncrl.trainer.correction.clip import clip_minus_adv
from asyncrl.trainer.correction.discrepancy import SAFETY_BOUND, discrepancy_weights, lookup
from asyncrl.trainer.correction.stats import CorrectionStats, compute_stats


@dataclass(frozen=True)
class CorrectionResult:
    """``loss``: 0-dim, differentiable w.r.t. ``logp_theta`` only; ``metrics``: the batch's counts and
    sums (``stats.METRICS``) with fractions derived from them (``stats.DERIVED``)."""

    loss: Tensor
    metrics: CorrectionStats[Tensor]


class _AttachGrad(torch.autograd.Function):
    """Returns ``value`` (0-dim) with ``d value / d logp_theta = coef * scale`` (``coef`` ``[B, T]``,
    ``scale`` 0-dim or ``[B, 1]``, both precomputed): the denominator is applied in the backward's one
    multiply instead of a pass of its own in the forward."""

    @staticmethod
    def forward(ctx: Any, logp_theta: Tensor, value: Tensor, coef: Tensor, scale: Tensor) -> Tensor:
        ctx.save_for_backward(coef, scale)
        ctx.theta_dtype = logp_theta.dtype
        return value.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None, None]:
        coef, scale = ctx.saved_tensors
        return (coef * (grad_out * scale)).to(ctx.theta_dtype), None, None, None


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum()`` without the ``[B, T]`` temporary."""
    return torch.dot(a.reshape(-1), b.reshape(-1))


def _check_inputs(
    logp_theta: Tensor,
    logp_ref: Tensor,
    logp_mu: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    turn_ids: Tensor | None,
) -> None:
    if logp_theta.dim() != 2:
        raise ValueError(f"logp_theta must be [B, T]; got shape {tuple(logp_theta.shape)}")
    shape = logp_theta.shape
    named = {"logp_ref": logp_ref, "logp_mu": logp_mu, "loss_mask": loss_mask}
    if turn_ids is not None:
        named["turn_ids"] = turn_ids
    bad = [f"{n} {tuple(t.shape)}" for n, t in named.items() if t.shape != shape]
    if advantages.shape not in (shape, shape[:1]):
        bad.append(f"advantages {tuple(advantages.shape)} (must be [B, T] or [B])")
    if bad:
        raise ValueError(f"shape mismatch with logp_theta {tuple(shape)} = [B, T]: " + ", ".join(bad))
    if loss_mask.dtype != torch.bool:
        raise TypeError(f"loss_mask must be bool (True = token counts); got dtype {loss_mask.dtype}")
    for n, t in (("logp_theta", logp_theta), ("logp_ref", logp_ref), ("logp_mu", logp_mu), ("advantages", advantages)):
        if not t.is_floating_point():
            raise TypeError(f"{n} must be a floating-point tensor; got dtype {t.dtype}")
    if turn_ids is not None and (turn_ids.is_floating_point() or turn_ids.dtype == torch.bool):
        raise TypeError(f"turn_ids must be an integer tensor; got dtype {turn_ids.dtype}")


def _check_scalars(
    mask_low: float, mask_high: float, veto_below: float | None, clip_low: float, clip_high: float,
    dual_clip: float | None,
) -> None:
    # The same rules as the spec models (asyncrl.api.correction), for callers that bypass them.
    problems = []
    if not 0.0 < mask_low < 1.0 < mask_high:
        problems.append(f"mask bounds need 0 < low < 1 < high; got low={mask_low}, high={mask_high}")
    if veto_below is not None and not 0.0 < veto_below < 1.0:
        problems.append(f"veto_below must be in (0, 1) or None; got {veto_below}")
    if not (0.0 < clip_low < 1.0 and clip_high > 0.0):
        problems.append(f"clip needs 0 < low < 1 and high > 0; got low={clip_low}, high={clip_high}")
    if dual_clip is not None and not dual_clip > 1.0:
        problems.append(f"dual_clip must be > 1 or None; got {dual_clip}")
    if problems:
        raise ValueError("; ".join(problems))


def decoupled_pg_loss(
    logp_theta: Tensor,
    logp_ref: Tensor,
    logp_mu: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    mode: DiscrepancyMode,
    level: DiscrepancyLevel,
    mask_low: float,
    mask_high: float,
    veto_below: float | None,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    aggregation: LossAggregation,
    turn_ids: Tensor | None = None,
) -> CorrectionResult:
    """The decoupled correction loss with explicit scalars (pure; see :func:`correction_loss`).

    Args:
        logp_theta: ``[B, T]`` log pi_theta of the sampled tokens (the only input with gradient).
        logp_ref: ``[B, T]`` log pi_ref (treated as a constant).
        logp_mu: ``[B, T]`` log mu_old, the behaviour/inference policy (treated as a constant).
        advantages: ``[B, T]`` or ``[B]`` (broadcast over T).
        loss_mask: ``[B, T]`` bool, True = the token counts.
        mode, level, mask_low, mask_high, veto_below: ``spec.mask`` (discrepancy of ``r_d``).
        clip_low, clip_high, dual_clip: ``spec.clip`` (staleness clip of ``r_s``).
        aggregation: ``tokenMean`` or ``sequenceMean``.
        turn_ids: ``[B, T]`` int turn ids, -1 outside turns (level ``turn`` only).
    """
    _check_inputs(logp_theta, logp_ref, logp_mu, advantages, loss_mask, turn_ids)
    _check_scalars(mask_low, mask_high, veto_below, clip_low, clip_high, dual_clip)
    agg = lookup({a: a for a in LossAggregation}, aggregation, "loss_aggregation")
    dtype = torch.promote_types(logp_theta.dtype, torch.float32)  # (1)
    need_unclamped = veto_below is not None and math.log(veto_below) <= -SAFETY_BOUND
    B, T = logp_theta.shape
    # In-place ops below only ever touch tensors created in this function (fewer fresh [B, T]
    # buffers: on CPU each costs page faults comparable to the kernel itself). The two log-ratios
    # live in one [2, B, T] buffer so that every step they share (NaN guard, clamp, expm1, sums,
    # extremes) is one kernel over both.
    with torch.no_grad():
        ref = logp_ref.detach().to(dtype)
        logs = torch.empty((2, B, T), dtype=dtype, device=logp_theta.device)  # [log r_s, log r_d]
        log_rs, log_rd = logs.unbind(0)
        torch.sub(logp_theta.detach().to(dtype), ref, out=log_rs)
        torch.sub(ref, logp_mu.detach().to(dtype), out=log_rd)
        adv = advantages.detach().to(dtype)
        adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # [B, 1] broadcasts over T
        mask = ind.from_bool(loss_mask, dtype)  # [B, T] 0/1
        mask_count = mask.sum()
        # (2) NaN/inf in any of the three log-probs or the advantage makes this sum non-finite.
        scratch = torch.add(log_rs, log_rd).add_(adv)
        valid = mask.mul_(ind.finite_(scratch))  # [B, T] 0/1
        logs.nan_to_num_(0.0, 0.0, 0.0).mul_(valid)  # both ratios 0 where invalid
        saturated = torch.abs(log_rs, out=scratch).gt_(SAFETY_BOUND)  # (3) the clamp stops these gradients
        log_rd_unclamped = log_rd.clone() if need_unclamped else None
        logs.clamp_(-SAFETY_BOUND, SAFETY_BOUND)
        # r - 1 without cancellation (the k3 estimators need it), 0 where invalid; r = that + 1.
        ratios_m1 = logs.expm1()  # [2, B, T]
        ratios = ratios_m1 + 1.0  # [2, B, T] [r_s, r_d], 1 where invalid
        rs, rd = ratios.unbind(0)
        # -A (0 where invalid) and the dual-clip cap c |A| (>= 0; [B, 1] for per-sequence advantages).
        adv = adv.nan_to_num(0.0, 0.0, 0.0)
        minus_adv = torch.mul(valid, adv.neg())
        cap = None if dual_clip is None else adv.abs().mul_(dual_clip)
        adv_rows = adv if adv.shape[-1] == 1 and T != 1 else None

        disc = discrepancy_weights(
            log_rd, rd, valid, mode=mode, level=level, low=mask_low, high=mask_high,
            veto_below=veto_below, turn_ids=turn_ids, log_rd_unclamped=log_rd_unclamped,
        )
        clip = clip_minus_adv(rs, minus_adv, cap, eps_low=clip_low, eps_high=clip_high, extra_stop=saturated,
                              adv_rows=adv_rows)
        coef = clip.grad.mul_(disc.weight)  # [B, T] d term / d logp_theta, before the denominator

        n_tok = valid.sum(dim=-1)  # [B] valid tokens per sequence, before the discrepancy mask
        if agg is LossAggregation.TOKEN_MEAN:
            scale = n_tok.sum().clamp(min=1.0).reciprocal()  # 0-dim 1 / den
            value = _dot(clip.pg, disc.weight) * scale
        else:  # sequenceMean: mean over each sequence's valid tokens, then over non-empty sequences
            n_seq = n_tok.clamp(max=1.0).sum().clamp(min=1.0)
            scale = (n_tok.clamp(min=1.0) * n_seq).reciprocal_().unsqueeze(-1)  # [B, 1] 1 / seq_den
            value = _dot(clip.pg.mul_(disc.weight).sum(dim=-1), scale.squeeze(-1))

        stats = compute_stats(
            mask_count=mask_count, valid=valid, n_tok=n_tok, logs=logs, ratios_m1=ratios_m1, ratios=ratios,
            disc=disc, clip=clip, scratch=(saturated, minus_adv),  # both read for the last time by the clip
        )
    loss = _AttachGrad.apply(logp_theta, value, coef, scale)
    return CorrectionResult(loss=loss, metrics=stats)


def correction_loss(
    logp_theta: Tensor,
    logp_ref: Tensor,
    logp_mu: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    spec: CorrectionSpec,
    *,
    turn_ids: Tensor | None = None,
) -> CorrectionResult:
    """The decoupled correction loss configured by ``spec`` (``spec.correction`` of the job).

    Args:
        logp_theta: ``[B, T]`` log pi_theta (current policy; the loss is differentiable w.r.t. it only).
        logp_ref: ``[B, T]`` log pi_ref, the reference standing in for pi_old (detached).
        logp_mu: ``[B, T]`` log mu_old, recorded by the inference engine (detached).
        advantages: ``[B, T]``, or ``[B]`` broadcast over tokens.
        loss_mask: ``[B, T]`` bool, True = the token counts.
        spec: :class:`asyncrl.api.correction.CorrectionSpec` (``mask``, ``clip``, ``loss_aggregation``).
        turn_ids: ``[B, T]`` int turn ids (-1 outside turns), required by ``mask.level: turn``.

    Returns:
        :class:`CorrectionResult` with the 0-dim ``loss`` and :class:`CorrectionStats` counts.
    """
    return decoupled_pg_loss(
        logp_theta, logp_ref, logp_mu, advantages, loss_mask,
        mode=spec.mask.mode, level=spec.mask.level,
        mask_low=spec.mask.bounds.low, mask_high=spec.mask.bounds.high, veto_below=spec.mask.veto_below,
        clip_low=spec.clip.low, clip_high=spec.clip.high, dual_clip=spec.clip.dual_clip,
        aggregation=spec.loss_aggregation, turn_ids=turn_ids,
    )
