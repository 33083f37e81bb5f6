"""The weights the ``recentre`` reset averages, kept as bfloat16 residuals of the EWMA (issue 36, memory).

The recentre target (:mod:`asyncrl.trainer.correction.ewma_reset`) at version ``t`` is
``sum_v c_v theta_v / sum_v c_v`` over the versions ``v`` in ``[t - W, t]`` that will sample the next batch.
Keeping those versions as fp32 copies (the first implementation kept ``W + 2``: 20 bytes a parameter at
``W = 3``) made the default EWMA as heavy as the exact snapshot, which defeats its one weight copy. But the
EWMA update already holds them, up to a small term. With ``N_u`` the bias-correction total after the blend
of version ``u`` (``keep = beta * total / N_u = 1 - 1 / N_u``, :mod:`ewma_controller`)::

    theta_prox_u = keep * theta_prox_{u-1} + theta_u / N_u = theta_prox_{u-1} + e_u / N_u,
    e_u = theta_u - theta_prox_{u-1}                                   (the blend's innovation)

so, from ``theta_prox_{t-1}`` (held anyway: a reset fires before version ``t`` is blended in), walking back::

    theta_u        = theta_prox_u + (1 - 1 / N_u) e_u
    theta_prox_{u-1} = theta_prox_u - e_u / N_u

and ``theta_t`` is the live weights. :class:`ResidualHistory` keeps ``e_u`` of the last ``W`` versions in
bfloat16: ``2 W`` bytes a parameter (``W / 2`` fp32 copies: 1.5 at ``W = 3``), in memory and in checkpoints
(a resume is exact). A version where ``theta_prox`` was set to the weights themselves (``init``, a reset to
``theta``) is a start: ``theta_u = theta_prox_u``, no residual, and the walk stops there. A recentre reset
clears the history: its own version is not ``theta_prox`` and, by the ``W``-version cooldown, the next reset
comes at least ``W + k`` versions later, so it only ever averages versions recorded after it.

Why residuals, not the weights in bfloat16: a weight's bf16 rounding (``|theta| 2^-9``: 1e-4 for a weight of
0.05) is as large as a whole version's update at lr 1e-4, which would swamp the differences the target
averages; the residual's rounding is relative to the residual, about two versions of movement.

Error bound (the stated tolerance; ``tests/trainer/test_ewma_history.py`` checks it against a float64
reference): the coefficient of each ``e_u`` in the target is at most 1 in absolute value, and bf16 rounds to
nearest with relative error at most ``2^-8`` (8 significant bits), so elementwise
``|target - target_exact| <= 2^-8 sum_u |e_u|`` plus fp32 rounding (a few ``2^-24 |theta|`` per version).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

RESIDUAL_DTYPE = torch.bfloat16
# Relative rounding error of RESIDUAL_DTYPE (round to nearest, 8 significant bits): the tolerance's factor.
RESIDUAL_UNIT_ROUNDOFF = 2.0 ** -8


@dataclass
class _Entry:
    """Version ``u``: ``total`` = ``N_u``; ``residual`` = ``e_u`` by name (floating tensors only), or None for a
    start (``theta_u = theta_prox_u``)."""

    total: float
    residual: dict[str, Tensor] | None


class ResidualHistory:
    """The last ``window`` versions' EWMA residuals; rebuilds their token-weighted centroid on demand."""

    def __init__(self, window: int, dtype: torch.dtype = RESIDUAL_DTYPE) -> None:
        if window < 0:
            raise ValueError(f"window (W) must be >= 0; got {window}")
        self.window = window
        self.dtype = dtype
        self.entries: dict[int, _Entry] = {}

    def clear(self) -> None:
        self.entries = {}

    def start(self, version: int) -> None:
        """``theta_prox`` was just set to the weights of ``version``: forget the rest, the walk stops here."""
        self.entries = {int(version): _Entry(1.0, None)}

    @torch.no_grad()
    def record(self, version: int, current: Mapping[str, Tensor], prox_before: Mapping[str, Tensor],
               new_total: float) -> None:
        """Before the blend of ``version``: ``e = current - prox_before`` (fp32, then rounded), ``N = new_total``;
        keeps the last ``window`` versions (those a reset at the next version can average)."""
        v = int(version)
        if self.window == 0:  # W = 0: a reset averages the live weights alone
            self.entries.clear()
            return
        residual = {k: (current[k].detach().to(device=p.device, dtype=torch.float32) - p).to(self.dtype)
                    for k, p in prox_before.items() if p.is_floating_point()}
        self.entries[v] = _Entry(float(new_total), residual)
        for old in [u for u in self.entries if u <= v - self.window]:
            del self.entries[old]

    def chain(self, version: int) -> list[int]:
        """The versions below ``version`` the walk back from ``theta_prox_{version-1}`` reaches, newest first."""
        out: list[int] = []
        u = int(version) - 1
        while u in self.entries:
            out.append(u)
            if self.entries[u].residual is None:
                break
            u -= 1
        return out

    def held(self, version: int) -> set[int]:
        """Versions whose weights can be rebuilt at a reset at ``version`` (``version`` itself: the live weights)."""
        return {int(version), *self.chain(version)}

    @torch.no_grad()
    def centroid_into(self, prox: dict[str, Tensor], current: Mapping[str, Tensor], counts: Mapping[int, float],
                      version: int) -> bool:
        """``prox`` (``theta_prox_{version-1}``, overwritten) <- ``sum_v c_v theta_v / sum_v c_v`` over the
        versions of ``counts`` that :meth:`held` has (fp32; non-floating tensors take ``current``'s value);
        False, ``prox`` untouched, when it has none of them. One tensor at a time: two fp32 temporaries of the
        largest tensor, never a whole copy."""
        t = int(version)
        chain = self.chain(t)
        held = {v: float(c) for v, c in counts.items() if c > 0 and (v == t or v in chain)}
        if not held:
            return False
        total = sum(held.values())
        walk = [u for u in chain if u >= min(held)]
        for k, p in prox.items():
            if not p.is_floating_point():
                p.copy_(current[k])
                continue
            running = p.clone()  # theta_prox_u, from u = t - 1 down
            acc = torch.zeros_like(p)
            if t in held:
                acc.add_(current[k].detach().to(device=p.device, dtype=torch.float32), alpha=held[t] / total)
            for u in walk:
                entry = self.entries[u]
                w = held.get(u, 0.0) / total
                if entry.residual is None:  # a start: theta_u = theta_prox_u
                    acc.add_(running, alpha=w)
                    break
                e = entry.residual[k].to(torch.float32)
                if w:
                    acc.add_(running, alpha=w).add_(e, alpha=w * (1.0 - 1.0 / entry.total))
                running.sub_(e, alpha=1.0 / entry.total)
            p.copy_(acc)
        return True

    def nbytes(self) -> int:
        """Bytes held (the residual tensors)."""
        return sum(t.numel() * t.element_size() for e in self.entries.values() if e.residual is not None
                   for t in e.residual.values())

    # --- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"totals": {v: e.total for v, e in self.entries.items()},
                "residuals": {v: {k: t.clone() for k, t in e.residual.items()}
                              for v, e in self.entries.items() if e.residual is not None}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        residuals = {int(v): r for v, r in state["residuals"].items()}
        self.entries = {
            int(v): _Entry(float(n), None if int(v) not in residuals else {k: t.clone() for k, t in residuals[int(v)].items()})
            for v, n in state["totals"].items()}
