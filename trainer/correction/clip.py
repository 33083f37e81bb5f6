"""The staleness clip on ``r_s = pi_theta / pi_ref``: sign-aware PPO clip plus optional dual clip.

Per token (paper §3.1 Eq. 2 written as a loss; AReaL ``ppo_actor_loss_fn``, verl
``compute_policy_loss_vanilla``)::

    pg = max(-A * r_s, -A * clip(r_s, 1 - eps_low, 1 + eps_high))
    pg = min(pg, -c * A)          if A < 0 and dual clip c > 1 is set

The clip *stops the gradient* only on the side the advantage pushes towards (the sign-aware
indicator of paper Eq. 3): ``A > 0 and r_s > 1 + eps_high`` or ``A < 0 and r_s < 1 - eps_low``.
The dual clip stops it when ``A < 0 and r_s > c``. Elsewhere ``d pg / d log pi_theta = -A * r_s``.
Runs under ``no_grad``: the gradient is assembled analytically in :mod:`.loss`.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.trainer.correction import indicators as ind


@dataclass(frozen=True)
class Clip:
    """The clip of one batch: ``[B, T]`` tensors (0 where ``A = 0``, e.g. invalid) and 0-dim counts."""

    pg: Tensor  # per-token loss value before the discrepancy weight
    grad: Tensor  # d pg / d log pi_theta: -A * r_s where the gradient flows, 0 where stopped
    stopped: Tensor  # 0/1: clip_low or clip_high or dual or extra_stop
    clip_low: Tensor  # count of A < 0 and r_s < 1 - eps_low
    clip_high: Tensor  # count of A > 0 and r_s > 1 + eps_high
    dual: Tensor  # count of A < 0 and r_s > c (0 without dual clip)


def ppo_clip(
    rs: Tensor,
    adv: Tensor,
    *,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None,
    extra_stop: Tensor | None = None,
) -> Clip:
    """Sign-aware PPO clip (and dual clip) of the staleness ratio.

    Args:
        rs: ``[B, T]`` ``r_s = exp(log pi_theta - log pi_ref)`` (safety-clamped).
        adv: ``[B, T]`` advantages, 0 where the token does not count.
        eps_low, eps_high: clip interval ``[1 - eps_low, 1 + eps_high]``.
        dual_clip: ``c > 1`` or None.
        extra_stop: ``[B, T]`` 0/1, further tokens whose gradient is stopped (the safety clamp).
    """
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    # Five [B, T] buffers in all; `scratch` and `neg` are reused once their value is counted.
    neg = ind.lt(adv, 0.0)
    clipped = ind.gt(adv, 0.0)
    scratch = ind.gt(rs, hi)
    clipped.mul_(scratch)  # A > 0 and r_s > hi
    clip_high = clipped.sum()
    clip_low_ind = ind.lt(rs, lo, out=scratch).mul_(neg)  # A < 0 and r_s < lo
    clip_low = clip_low_ind.sum()
    clipped.add_(clip_low_ind)  # disjoint
    minus_adv = -adv
    # max(-A r, -A clip(r)) is -A * clip(r) exactly where the sign-aware indicator fires; lerp
    # with weight 0/1 returns either end exactly.
    pg = rs.clamp(lo, hi)
    pg = torch.lerp(rs, pg, clipped, out=pg).mul_(minus_adv)
    stopped = clipped if extra_stop is None else torch.maximum(clipped, extra_stop, out=clipped)
    if dual_clip is not None:
        dual_ind = ind.gt(rs, dual_clip, out=scratch).mul_(neg)  # disjoint from clip_low and clip_high
        dual = dual_ind.sum()
        pg.lerp_(torch.mul(minus_adv, dual_clip, out=neg), dual_ind)
        stopped = torch.maximum(stopped, dual_ind, out=stopped)
    else:
        dual = torch.zeros_like(clip_high)
    grad = minus_adv.mul_(rs)  # -A * r_s (minus_adv is not used after this)
    grad.addcmul_(grad, stopped, value=-1.0)  # ... times (1 - stopped)
    return Clip(pg=pg, grad=grad, stopped=stopped, clip_low=clip_low, clip_high=clip_high, dual=dual)
