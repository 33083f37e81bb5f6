"""Proposition 1 of the paper as a tool: the effective bounds on the total ratio.

With an interpolated reference the decoupled ratios are deterministic functions of the total
ratio ``r = pi_theta / mu_old`` (paper §4.2, Appendix A). For a token with version gap ``n`` the
behaviour weight is ``alpha = 1/(n+1)`` and

- log-linear: ``log pi_ref = alpha log mu + (1-alpha) log pi_theta``, so ``r_d = r^(1-alpha)`` and
  ``r_s = r^alpha``; a mask ``[a, b]`` on ``r_d`` is ``[a^(1/(1-alpha)), b^(1/(1-alpha))]`` on ``r``
  and a clip ``[c, d]`` on ``r_s`` is ``[c^(1/alpha), d^(1/alpha)]`` on ``r``.
- linear: ``pi_ref = alpha mu + (1-alpha) pi_theta``, so ``r_d = alpha + (1-alpha) r`` and
  ``r_s = r / (alpha + (1-alpha) r)`` (increasing in r, bounded by ``1/(1-alpha)``); hence
  ``r_d = a  <=>  r = (a - alpha)/(1 - alpha)`` and ``r_s = c  <=>  r = c alpha / (1 - c (1-alpha))``.

Gap 0 (``alpha = 1``) means the reference *is* mu: ``r_d = 1`` (any mask that contains 1 keeps
everything) and ``r_s = r`` (the clip applies unchanged). Bounds that no finite ``r`` reaches
come out as ``0`` below and ``inf`` above. Pure Python: no torch.
"""

import math
from dataclasses import dataclass
from typing import Literal

Interp = Literal["linear", "loglinear"]


@dataclass(frozen=True)
class EffectiveBounds:
    """Effective intervals on ``r = pi_theta / mu_old``; ``inf`` = unbounded."""

    mask: tuple[float, float]
    clip: tuple[float, float]

    def as_json(self) -> dict[str, list[float | None]]:
        """JSON has no infinity: an unbounded side is ``null``."""

        def side(x: float) -> float | None:
            return None if math.isinf(x) else x

        return {"mask": [side(v) for v in self.mask], "clip": [side(v) for v in self.clip]}


def behaviour_weight(gap: int) -> float:
    """``alpha = 1/(n+1)``: the weight of mu in the interpolated reference for version gap ``n``."""
    if gap < 0:
        raise ValueError(f"version gap must be >= 0, got {gap}")
    return 1.0 / (gap + 1)


def _check_interval(name: str, lo: float, hi: float) -> None:
    if not (0.0 < lo < 1.0 < hi):
        raise ValueError(f"--{name} needs 0 < LO < 1 < HI (bounds on a ratio), got LO={lo} HI={hi}")


def effective_bounds(
    mask: tuple[float, float], clip: tuple[float, float], gap: int, interp: Interp
) -> EffectiveBounds:
    """Effective mask and clip intervals on the total ratio for one version gap.

    Args:
        mask: ``(lo, hi)`` keep interval on ``r_d`` (ratio bounds, ``lo < 1 < hi``).
        clip: ``(lo, hi)`` clip interval on ``r_s`` (ratio bounds, e.g. ``(1-eps_low, 1+eps_high)``).
        gap: version gap ``n >= 0`` of the token.
        interp: ``linear`` or ``loglinear``.
    """
    _check_interval("mask", *mask)
    _check_interval("clip", *clip)
    alpha = behaviour_weight(gap)
    if gap == 0:
        return EffectiveBounds(mask=(0.0, math.inf), clip=(clip[0], clip[1]))
    if interp == "loglinear":
        em = tuple(b ** (1.0 / (1.0 - alpha)) for b in mask)
        ec = tuple(b ** (1.0 / alpha) for b in clip)
        return EffectiveBounds(mask=(em[0], em[1]), clip=(ec[0], ec[1]))
    if interp == "linear":

        def mask_to_r(a: float) -> float:
            return max(0.0, (a - alpha) / (1.0 - alpha))

        def clip_to_r(c: float) -> float:
            denom = 1.0 - c * (1.0 - alpha)
            return math.inf if denom <= 0.0 else c * alpha / denom

        return EffectiveBounds(
            mask=(mask_to_r(mask[0]), mask_to_r(mask[1])), clip=(clip_to_r(clip[0]), clip_to_r(clip[1]))
        )
    raise ValueError(f"unknown interpolation {interp!r}; valid: linear, loglinear")
