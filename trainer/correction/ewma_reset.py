"""When the EWMA reference resets, to what, and whether each reset worked (issue 36).

Three rules (``spec.correction.ewma.reset.rule``), all fed once per policy version with the batch's
in-bounds ratio of ``r_d`` (the share of valid tokens with ``r_d`` inside ``mask.bounds``):

``paper`` (paper §6.5)
    A version is *low* when the ratio is below ``tau = keepRatioBelow``; after ``k = consecutiveSteps``
    low versions in a row ``theta_prox`` is set to the current weights.
``paperCooldown``
    The same, but the ``W`` versions after a reset (``W = async.maxStaleness``, at least 1) are not counted:
    their batches still carry tokens sampled before it, so the next reset comes ``W + k`` versions later at
    the soonest. (The paper's rule at ``W = k = 3`` fires again exactly ``k`` versions after a reset.)
``recentre``
    The threshold is the reference's own level: ``tau_t = level_t - margin``, where ``level_t`` is a
    bias-corrected exponential average (memory :data:`LEVEL_MEMORY` per version) of the ratios observed
    *before* version ``t``; no threshold (so no reset) before ``W + 1`` observations. ``k`` low versions
    in a row fire a reset, with the ``W``-version cooldown. The reset moves ``theta_prox`` to the
    token-weighted average of the weights of the versions that sampled the batch's tokens
    (:meth:`asyncrl.trainer.correction.ewma_history.ResidualHistory.centroid_into`, which rebuilds them from
    bfloat16 residuals of the EWMA: ``W / 2`` fp32 copies' worth), shifted one version forward (the next batch is one version younger),
    instead of to the current weights: the behaviour policies themselves, so the new reference is never
    further from the tokens' weight centroid than the one it replaces (it *is* that centroid; L2 in
    parameter space). The EWMA's bias-correction total is then set to its steady state ``1 / (1 - beta)``
    so the next version blends in with its usual weight ``1 - beta`` rather than a half.

Every reset gets an outcome ``W`` versions later (at least 1): *recovered* when the in-bounds ratio of at
least one of the ``W`` versions after it is at or above the threshold in force when it fired, else
*unrecovered*. A run that ends sooner leaves it pending (counted nowhere). The outcomes feed the step
report (``ewma_reset_outcome``), ``asyncrl_ewma_reset_outcomes_total{outcome}``, the status and the
records; ``AsyncRLEwmaResetStorm`` fires on unrecovered resets only.

Everything here is pure state on floats; the weights are averaged by :mod:`ewma_history`.
"""

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Rule = Literal["paper", "paperCooldown", "recentre"]
RULES: tuple[Rule, ...] = ("paper", "paperCooldown", "recentre")
Outcome = Literal["recovered", "unrecovered"]
# Memory of the recentre rule's level: weight LEVEL_MEMORY**age per version, centre of mass
# LEVEL_MEMORY / (1 - LEVEL_MEMORY) = 9 versions back.
LEVEL_MEMORY = 0.9


@dataclass(frozen=True)
class RuleStep:
    """What one :meth:`ResetRule.observe` decided.

    ``threshold``: the threshold the ratio was compared with (nan: none yet, the recentre rule's
    warm-up); ``low``: the ratio was below it; ``fire``: reset now; ``outcomes``: the outcomes of earlier
    resets decided at this version (usually none, at most one per earlier reset).
    """

    threshold: float
    low: bool
    streak: int
    fire: bool
    outcomes: tuple[Outcome, ...] = ()


@dataclass(frozen=True)
class ResetStatus:
    """What the step report carries of the reset rule: the threshold in force, the outcome decided at this
    version ("" when none; the last one if several), and the outcome counters."""

    threshold: float = math.nan
    outcome: str = ""
    recovered_total: int = 0
    unrecovered_total: int = 0


@dataclass
class _Pending:
    threshold: float
    left: int
    cleared: bool = False


@dataclass
class ResetRule:
    """The reset decision and the outcome bookkeeping of one EWMA reference (pure; checkpointable)."""

    rule: Rule = "paper"
    keep_ratio_below: float = 0.8
    consecutive_steps: int = 3
    window: int = 3  # W = async.maxStaleness
    margin: float = 0.1
    enabled: bool = True
    streak: int = 0
    since_reset: int | None = None  # versions since the last reset (None: none yet)
    level_sum: float = 0.0
    level_weight: float = 0.0
    observations: int = 0
    recovered: int = 0
    unrecovered: int = 0
    pending: list[_Pending] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"reset rule must be one of {RULES}; got {self.rule!r}")
        if self.consecutive_steps < 1:
            raise ValueError(f"consecutive_steps (k) must be >= 1; got {self.consecutive_steps}")
        if not 0.0 < self.margin < 1.0:
            raise ValueError(f"margin must be in (0, 1); got {self.margin}")

    @property
    def horizon(self) -> int:
        """``W`` versions, at least 1: the cooldown and the outcome window."""
        return max(1, self.window)

    @property
    def level(self) -> float:
        """The recentre rule's level (nan before any observation)."""
        return self.level_sum / self.level_weight if self.level_weight > 0 else math.nan

    def threshold(self) -> float:
        """The threshold the next ratio is compared with (nan: none yet)."""
        if self.rule != "recentre":
            return self.keep_ratio_below
        if self.observations < self.window + 1:
            return math.nan
        return self.level - self.margin

    def observe(self, ratio: float | None) -> RuleStep:
        """One policy version with in-bounds ratio ``ratio`` (None: not observed; nothing changes but the
        outcome clocks)."""
        tau = self.threshold()
        outcomes: list[Outcome] = []
        if self.since_reset is not None:
            self.since_reset += 1
        still: list[_Pending] = []
        for p in self.pending:
            if ratio is not None and ratio >= p.threshold:
                p.cleared = True
            p.left -= 1
            if p.left > 0:
                still.append(p)
            else:
                outcomes.append("recovered" if p.cleared else "unrecovered")
        self.pending = still
        self.recovered += outcomes.count("recovered")
        self.unrecovered += outcomes.count("unrecovered")
        if ratio is None:
            return RuleStep(tau, False, self.streak, False, tuple(outcomes))
        low = not math.isnan(tau) and ratio < tau
        # The cooldown: the W versions after a reset still train tokens sampled before it, so they are not
        # counted at all (the streak restarts after them): the next reset comes W + k versions later at the soonest.
        cooling = self.rule != "paper" and self.since_reset is not None and self.since_reset <= self.horizon
        self.streak = self.streak + 1 if low and not cooling else 0
        self.level_sum = LEVEL_MEMORY * self.level_sum + float(ratio)
        self.level_weight = LEVEL_MEMORY * self.level_weight + 1.0
        self.observations += 1
        fire = self.enabled and self.streak >= self.consecutive_steps
        if fire:
            self.fired(tau)
        return RuleStep(tau, low, self.streak if not fire else self.consecutive_steps, fire, tuple(outcomes))

    def fired(self, threshold: float) -> None:
        """Count a reset (automatic, or manual with the threshold in force) and start its outcome clock."""
        self.streak = 0
        self.since_reset = 0
        if not math.isnan(threshold):
            self.pending.append(_Pending(threshold, self.horizon))

    # --- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"streak": self.streak, "since_reset": self.since_reset, "level_sum": self.level_sum,
                "level_weight": self.level_weight, "observations": self.observations,
                "recovered": self.recovered, "unrecovered": self.unrecovered,
                "pending": [[p.threshold, p.left, p.cleared] for p in self.pending]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.streak = int(state["streak"])
        self.since_reset = None if state["since_reset"] is None else int(state["since_reset"])
        self.level_sum, self.level_weight = float(state["level_sum"]), float(state["level_weight"])
        self.observations = int(state["observations"])
        self.recovered, self.unrecovered = int(state["recovered"]), int(state["unrecovered"])
        self.pending = [_Pending(float(t), int(n), bool(c)) for t, n, c in state["pending"]]


def next_batch_versions(token_versions: Mapping[int, int], current: int) -> dict[int, float]:
    """The version histogram the next batch is expected to carry: this batch's token counts per sampling
    version, one version younger (capped at ``current``, the version now live)."""
    out: dict[int, float] = {}
    for v, n in token_versions.items():
        if n > 0:
            w = min(int(v) + 1, current)
            out[w] = out.get(w, 0.0) + float(n)
    return out
