"""Train–inference discrepancy handling of ``r_d = pi_ref / mu_old`` (paper §3.2 Eq. 3, docs/architecture.md, notation).

The discrepancy ratio is *symmetric*: its weight never looks at the advantage sign (unlike the
staleness clip in :mod:`.clip`). Two registries keep the modes out of if/elif chains:

- :data:`LEVELS` aggregates the token log-ratios on a unit (token / sequence / geometric / turn).
- :data:`MODES` turns the aggregated ratio into the weight ``w`` (mask / icepop / truncate / none),
  with the semantics documented on :class:`asyncrl.api.correction.DiscrepancyMode`.

Everything here runs under ``no_grad`` on detached inputs: ``w`` is a constant factor of the
policy-gradient term (the loss is differentiable w.r.t. ``logp_theta`` only).
"""

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import Tensor

from asyncrl.api.correction import DiscrepancyLevel, DiscrepancyMode
from asyncrl.trainer.correction import indicators as ind

# verl's SAFETY_BOUND (verl/trainer/ppo/rollout_corr_helper.py): every log-ratio, token-level or
# aggregated, is clamped to [-20, 20] before exp, so exp() stays within [2.1e-9, 4.9e8] in fp32.
SAFETY_BOUND = 20.0

K = TypeVar("K")
V = TypeVar("V")


def lookup(registry: Mapping[K, V], key: object, what: str) -> V:
    """``registry[key]`` or a ``ValueError`` that lists the valid keys."""
    for k, v in registry.items():
        if k == key:
            return v
    valid = ", ".join(str(k) for k in registry)
    raise ValueError(f"unknown {what} {key!r}; valid: {valid}")


# --- levels: (log_rd [B, T] clamped, 0 where invalid; valid [B, T] 0/1; turn_ids) -> [B, T] ---
# Each returns the aggregated log r_d of the token's unit, 0 where the token is invalid.
LevelFn = Callable[[Tensor, Tensor, Tensor | None], Tensor]


def _token_level(log_rd: Tensor, valid: Tensor, turn_ids: Tensor | None) -> Tensor:
    return log_rd


def _sequence_level(log_rd: Tensor, valid: Tensor, turn_ids: Tensor | None) -> Tensor:
    # log of the product of the ratios over the sequence's valid tokens; clamped again because a
    # sum of clamped terms can leave the safety bound.
    seq = log_rd.sum(dim=-1, keepdim=True).clamp(-SAFETY_BOUND, SAFETY_BOUND)  # [B, 1]
    return seq * valid


def _geometric_level(log_rd: Tensor, valid: Tensor, turn_ids: Tensor | None) -> Tensor:
    count = valid.sum(dim=-1, keepdim=True).clamp(min=1.0)  # [B, 1]
    return (log_rd.sum(dim=-1, keepdim=True) / count) * valid  # mean log-ratio = log geometric mean


def _turn_level(log_rd: Tensor, valid: Tensor, turn_ids: Tensor | None) -> Tensor:
    """Geometric mean over each turn: a maximal run of equal ``turn_ids >= 0`` in a row.

    Runs are found without a host sync: a new run starts where the id changes, ``cumsum`` numbers
    the runs of a row, and ``index_add_`` sums each run into a ``[B * T]`` buffer. A valid token
    outside any turn (``turn_id < 0``) keeps its own token-level ratio.
    """
    if turn_ids is None:
        raise ValueError("mask.level 'turn' needs turn_ids [B, T] (turn ids, -1 outside turns); got None")
    B, T = log_rd.shape
    starts = torch.ones_like(turn_ids, dtype=torch.bool)  # [B, T]
    starts[:, 1:] = turn_ids[:, 1:] != turn_ids[:, :-1]
    run = starts.cumsum(dim=-1) - 1  # [B, T] run index within the row, in [0, T)
    flat = (run + torch.arange(B, device=run.device).unsqueeze(-1) * T).reshape(-1)  # [B*T]
    sums = torch.zeros(B * T, dtype=log_rd.dtype, device=log_rd.device).index_add_(0, flat, log_rd.reshape(-1))
    counts = torch.zeros(B * T, dtype=log_rd.dtype, device=log_rd.device).index_add_(0, flat, valid.reshape(-1))
    mean = (sums[flat] / counts[flat].clamp(min=1.0)).reshape(B, T)  # [B, T] mean of the token's run
    in_turn = (turn_ids >= 0).to(log_rd.dtype) * valid
    return torch.lerp(log_rd, mean, in_turn)


LEVELS: dict[DiscrepancyLevel, LevelFn] = {
    DiscrepancyLevel.TOKEN: _token_level,
    DiscrepancyLevel.SEQUENCE: _sequence_level,
    DiscrepancyLevel.GEOMETRIC: _geometric_level,
    DiscrepancyLevel.TURN: _turn_level,
}


# --- modes: aggregated r_d -> weight -------------------------------------------------------------
@dataclass(frozen=True)
class ModeRule:
    """How a mode weighs a token: ``weight(r_d, keep, low, high) -> w`` (``keep``: 0/1, already 0
    for invalid, vetoed and — when ``rejects`` — out-of-band tokens); ``vetoes``: the catastrophic
    veto applies."""

    weight: Callable[[Tensor, Tensor, float, float], Tensor]
    rejects: bool
    vetoes: bool


MODES: dict[DiscrepancyMode, ModeRule] = {
    # w = M_[low,high](r_d): in-band tokens keep weight 1 (the paper's MIS).
    DiscrepancyMode.MASK: ModeRule(lambda rd, keep, lo, hi: keep, rejects=True, vetoes=True),
    # w = r_d * M_[low,high](r_d) (IcePop).
    DiscrepancyMode.ICEPOP: ModeRule(lambda rd, keep, lo, hi: rd * keep, rejects=True, vetoes=True),
    # w = clamp(r_d, low, high) (truncated IS): nothing rejected by the band, the veto still acts.
    DiscrepancyMode.TRUNCATE: ModeRule(lambda rd, keep, lo, hi: rd.clamp(lo, hi).mul_(keep), rejects=False, vetoes=True),
    # w = 1: no repair (metrics are still computed).
    DiscrepancyMode.NONE: ModeRule(lambda rd, keep, lo, hi: keep, rejects=False, vetoes=False),
}


@dataclass(frozen=True)
class Discrepancy:
    """The discrepancy handling of one batch: ``[B, T]`` tensors (0 where invalid) and 0-dim counts."""

    weight: Tensor  # w applied to the policy-gradient term (0 where invalid or rejected)
    keep: Tensor  # 0/1: valid and not rejected (band or veto)
    below: Tensor  # count of valid tokens whose aggregated r_d < low
    above: Tensor  # count of valid tokens whose aggregated r_d > high
    veto_seq: Tensor  # [B, 1] 0/1: sequence vetoed
    rejects: bool  # the mode rejects out-of-band tokens (mask, icepop)


def discrepancy_weights(
    log_rd: Tensor,
    rd: Tensor,
    valid: Tensor,
    *,
    mode: DiscrepancyMode,
    level: DiscrepancyLevel,
    low: float,
    high: float,
    veto_below: float | None,
    turn_ids: Tensor | None = None,
    log_rd_unclamped: Tensor | None = None,
) -> Discrepancy:
    """Weights of the discrepancy ratio on the chosen level.

    Args:
        log_rd: ``[B, T]`` token ``log r_d = logp_ref - logp_mu`` clamped to ``±SAFETY_BOUND``, 0 where invalid.
        rd: ``[B, T]`` ``exp(log_rd)`` (1 where invalid), passed in to avoid a second exp.
        valid: ``[B, T]`` 0/1, tokens that count.
        mode, level: see :mod:`asyncrl.api.correction`.
        low, high: keep interval ``[low, high]`` of ``r_d`` (closed).
        veto_below: catastrophic veto on the *token-level* ``r_d`` (None disables it).
        turn_ids: ``[B, T]`` int turn ids (-1 outside turns); needed by level ``turn``.
        log_rd_unclamped: ``[B, T]`` ``log_rd`` before the clamp, 0 where invalid; only read when
            ``veto_below < exp(-SAFETY_BOUND)`` (the clamp would hide such a token).
    """
    rule = lookup(MODES, mode, "mask.mode")
    agg = lookup(LEVELS, level, "mask.level")(log_rd, valid, turn_ids)  # [B, T]
    rd_agg = rd if agg is log_rd else agg.exp()  # [B, T], 1 where invalid
    # Invalid tokens have r_d = 1 and low < 1 < high, so they are never below or above.
    scratch = ind.lt(rd_agg, low)
    below = scratch.sum()
    keep = valid - scratch if rule.rejects else valid  # below, above: disjoint subsets of valid
    ind.gt(rd_agg, high, out=scratch)
    above = scratch.sum()
    if rule.rejects:
        keep.sub_(scratch)

    if rule.vetoes and veto_below is not None:
        log_veto = math.log(veto_below)
        # The clamped ratio decides exactly when the threshold is inside the clamp; invalid tokens
        # hold log r_d = 0 > log_veto and never hit.
        src = log_rd if log_veto > -SAFETY_BOUND or log_rd_unclamped is None else log_rd_unclamped
        veto_seq = ind.lt(src, log_veto, out=scratch).amax(dim=-1, keepdim=True)  # [B, 1]
        keep = keep.mul_(1.0 - veto_seq) if rule.rejects else keep * (1.0 - veto_seq)  # never mutate `valid`
    else:
        veto_seq = torch.zeros_like(valid[:, :1])
    return Discrepancy(
        weight=rule.weight(rd_agg, keep, low, high), keep=keep, below=below, above=above,
        veto_seq=veto_seq, rejects=rule.rejects,
    )
