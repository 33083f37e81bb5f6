"""The staleness clip on ``r_s = pi_theta / pi_ref``: sign-aware PPO clip plus optional dual clip.

Per token (paper §3.1 Eq. 2 written as a loss; inclusionAI/AReaL
``areal/utils/functional/functional.py::ppo_actor_loss_fn``, volcengine/verl
``verl/trainer/ppo/core_algos.py::compute_policy_loss_vanilla``)::

    pg1 = -A * r_s,   pg2 = -A * clip(r_s, 1 - eps_low, 1 + eps_high),   pg = max(pg1, pg2)
    pg  = min(pg, c * |A|)        with dual clip c > 1 (binds only for A < 0: pg <= 0 when A > 0)

The clip *stops the gradient* exactly where ``pg2 > pg1`` (AReaL's ``clip_mask``), which is the
sign-aware indicator of paper Eq. 3: ``A > 0 and r_s > 1 + eps_high`` or ``A < 0 and r_s <
1 - eps_low`` (the two can differ only by a rounding tie at the bound, where both values are
equal). The dual clip stops it where ``pg > c * |A|``, i.e. ``A < 0 and r_s > c``. Elsewhere
``d pg / d log pi_theta = -A * r_s``. Runs under ``no_grad``: the gradient is assembled
analytically in :mod:`.loss`.
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
    minus_adv = -adv
    cap = None if dual_clip is None else minus_adv.abs().mul_(dual_clip)
    return clip_minus_adv(rs, minus_adv, cap, eps_low=eps_low, eps_high=eps_high, extra_stop=extra_stop)


def clip_minus_adv(
    rs: Tensor,
    minus_adv: Tensor,
    cap: Tensor | None,
    *,
    eps_low: float,
    eps_high: float,
    extra_stop: Tensor | None = None,
    adv_rows: Tensor | None = None,
) -> Clip:
    """:func:`ppo_clip` on ``-A`` with the dual-clip cap ``c |A|`` precomputed (the loss builds both
    from its advantages); ``cap`` None: no dual clip.

    Args:
        rs: ``[B, T]`` safety-clamped ``r_s``.
        minus_adv: ``[B, T]`` ``-A``, 0 where the token does not count (read only).
        cap: ``[B, T]`` or ``[B, 1]`` ``c |A|`` (read only, >= 0), or None. It may be nonzero where
            ``minus_adv`` is 0: there ``pg = 0 <= cap`` and the dual clip cannot bind.
        eps_low, eps_high, extra_stop: as :func:`ppo_clip`.
        adv_rows: ``[B, 1]`` finite per-sequence advantages when ``A`` is constant along each row:
            then a row's clipped tokens are all on one side (upper for ``A > 0``), and the upper
            count is a dot product of per-row counts instead of an indicator pass over ``[B, T]``.
    """
    lo, hi = 1.0 - eps_low, 1.0 + eps_high
    # Four fresh [B, T] buffers (pg1 becomes the gradient, pg the loss); each line is one pass.
    pg1 = minus_adv * rs  # -A r_s: the loss where the gradient flows, and that gradient
    pg = rs.clamp(lo, hi).mul_(minus_adv)  # pg2 = -A clip(r_s)
    stopped = ind.gt(pg, pg1)  # the clip binds: sign-aware (see the module docstring)
    torch.maximum(pg1, pg, out=pg)
    if adv_rows is None:
        n_clipped = stopped.sum()
        # r_s > 1 on the clipped side means the upper bound (A > 0), r_s < 1 the lower one (A < 0).
        scratch = ind.gt(rs, 1.0)
        clip_high = _dot(stopped, scratch)
    else:
        per_row = stopped.sum(dim=-1)  # [B]
        n_clipped = per_row.sum()
        clip_high = _dot(per_row, ind.gt(adv_rows, 0.0))  # rows with A > 0 clip at the upper bound
        scratch = None
    clip_low = n_clipped - clip_high
    if extra_stop is not None:
        torch.maximum(stopped, extra_stop, out=stopped)
    if cap is not None:
        dual_ind = ind.gt(pg, cap, out=scratch)  # A < 0 and r_s > c (into the scratch buffer, if any)
        dual = dual_ind.sum()
        torch.minimum(pg, cap, out=pg)
        torch.maximum(stopped, dual_ind, out=stopped)
    else:
        dual = torch.zeros_like(clip_high)
    grad = pg1.addcmul_(pg1, stopped, value=-1.0)  # -A r_s (1 - stopped); pg1 is not used after this
    return Clip(pg=pg, grad=grad, stopped=stopped, clip_low=clip_low, clip_high=clip_high, dual=dual)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return torch.dot(a.reshape(-1), b.reshape(-1))
