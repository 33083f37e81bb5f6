"""``spec.correction``: how the two off-policy corrections are configured.

Notation (ARCHITECTURE §1, paper §3.2): ``r_d = pi_ref / mu_old`` is the train–inference
*discrepancy* ratio, handled by a symmetric mask that ignores the advantage sign;
``r_s = pi_theta / pi_ref`` is the *staleness* ratio, clipped PPO-style with an
advantage-sign-aware indicator. ``reference`` chooses what stands in for ``pi_ref``.
"""

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from asyncrl.api.base import SpecModel


class ReferencePolicy(StrEnum):
    """What stands in for the training-side old policy ``pi_ref`` (ARCHITECTURE §1)."""

    BEHAVIOR = "behavior"
    CURRENT = "current"
    LINEAR = "linear"
    LOGLINEAR = "loglinear"
    EWMA = "ewma"
    EXACT = "exact"


class DiscrepancyMode(StrEnum):
    """How ``r_d`` acts on a token's policy-gradient term (w = weight, M = keep mask).

    - ``mask``: ``w = M_[low,high](r_d)`` (rejection: in-band tokens keep weight 1; the paper's MIS).
    - ``icepop``: ``w = r_d * M_[low,high](r_d)`` (masked importance weight, IcePop).
    - ``truncate``: ``w = clamp(r_d, low, high)`` (truncated IS, TIS: nothing is rejected).
    - ``none``: ``w = 1`` (no discrepancy repair; metrics are still computed).
    """

    MASK = "mask"
    TRUNCATE = "truncate"
    ICEPOP = "icepop"
    NONE = "none"


class DiscrepancyLevel(StrEnum):
    """On what unit ``r_d`` is aggregated before the mode acts on it.

    - ``token``: each token's own ratio.
    - ``sequence``: product of the ratios over the sequence's valid tokens.
    - ``geometric``: geometric mean over the sequence's valid tokens.
    - ``turn``: geometric mean over each assistant turn (a run of tokens with one ``segment_id``).
    """

    TOKEN = "token"
    SEQUENCE = "sequence"
    GEOMETRIC = "geometric"
    TURN = "turn"


class LossAggregation(StrEnum):
    """How per-token loss terms are reduced to the scalar loss.

    - ``tokenMean``: sum over tokens / number of valid tokens *before* the discrepancy mask, so
      masking tokens out never inflates the gradient of the remaining ones.
    - ``sequenceMean``: mean over tokens within each sequence (same pre-mask denominators), then
      mean over sequences that have at least one valid token.
    """

    TOKEN_MEAN = "tokenMean"
    SEQUENCE_MEAN = "sequenceMean"


class Bounds(SpecModel):
    """A ratio interval ``[low, high]`` with ``low < 1 < high``.

    In YAML either ``{low: 0.5, high: 2.0}`` or a single number ``c > 1`` meaning ``[1/c, c]``.
    """

    low: float = Field(gt=0.0, description="Lower bound of the ratio interval (0 < low < 1).")
    high: float = Field(gt=0.0, description="Upper bound of the ratio interval (high > 1).")

    # The CRD cannot type "number or object" structurally: the generator emits this node with
    # x-kubernetes-preserve-unknown-fields and lets the CEL rule below check both forms.
    crd_scalar_shorthand: ClassVar[bool] = True
    cel_rules: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "type(self) == map ? (has(self.low) && has(self.high) && double(self.low) > 0.0 && "
            "double(self.low) < 1.0 && double(self.high) > 1.0) : double(self) > 1.0",
            "bounds must be {low, high} with 0 < low < 1 < high, or a single number c > 1 meaning [1/c, c]",
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _from_number(cls, data: Any) -> Any:
        if isinstance(data, bool):
            raise ValueError("bounds must be a number c > 1 or {low, high}, not a boolean")
        if isinstance(data, int | float):
            if data <= 1.0:
                raise ValueError(f"a single-number bound c means [1/c, c] and needs c > 1; got {data}")
            return {"low": 1.0 / float(data), "high": float(data)}
        return data

    @model_validator(mode="after")
    def _around_one(self) -> "Bounds":
        if not (self.low < 1.0 < self.high):
            raise ValueError(
                f"needs low < 1 < high; got low={self.low}, high={self.high} "
                "(a ratio of 1 means no discrepancy and must always be kept)"
            )
        return self


class MaskSpec(SpecModel):
    """The train–inference discrepancy handling of ``r_d = pi_ref / mu_old`` (symmetric)."""

    mode: DiscrepancyMode = Field(
        default=DiscrepancyMode.MASK,
        description="How r_d acts on a token: mask (reject outside bounds), icepop (r_d-weighted, "
        "reject outside bounds), truncate (clamp r_d into bounds), none.",
    )
    level: DiscrepancyLevel = Field(
        default=DiscrepancyLevel.TOKEN,
        description="Aggregation unit of r_d: token, sequence (product), geometric (geometric mean "
        "per sequence), turn (geometric mean per assistant turn).",
    )
    bounds: Bounds = Field(
        default_factory=lambda: Bounds(low=0.5, high=2.0),
        description="Keep interval of r_d: {low, high} with low < 1 < high, or one number c meaning [1/c, c].",
    )
    veto_below: float | None = Field(
        default=1e-4,
        gt=0.0,
        lt=1.0,
        description="Catastrophic veto: a sequence with any valid token whose token-level r_d is below "
        "this value is rejected whole (null disables it).",
    )


class ClipSpec(SpecModel):
    """The PPO clip on the staleness ratio ``r_s = pi_theta / pi_ref`` (advantage-sign aware)."""

    low: float = Field(
        default=0.2, gt=0.0, lt=1.0, description="Lower clip epsilon: r_s is clipped below at 1 - low."
    )
    high: float = Field(
        default=0.2, gt=0.0, description="Upper clip epsilon: r_s is clipped above at 1 + high."
    )
    dual_clip: float | None = Field(
        default=None,
        gt=1.0,
        description="Dual-clip constant c > 1: for negative advantages the loss is bounded by -c*A "
        "(null disables dual clip).",
    )


class EwmaResetSpec(SpecModel):
    """Automatic reset of the EWMA reference to the current weights (paper §6.5)."""

    enabled: bool = Field(default=True, description="Whether the keep-ratio reset rule is active.")
    keep_ratio_below: float = Field(
        default=0.8,
        gt=0.0,
        lt=1.0,
        description="tau: a step whose discrepancy-mask keep ratio is below this counts as a low step.",
    )
    consecutive_steps: int = Field(
        default=3, ge=1, description="k: reset after this many consecutive low steps."
    )


class EwmaSpec(SpecModel):
    """The PPO-EWMA reference: a bias-corrected parameter EWMA ``theta_prox`` (paper §5.2)."""

    decay: float | Literal["auto"] = Field(
        default="auto",
        description="EWMA decay beta in (0, 1), or auto = W/(W+2) where W is the staleness window "
        "(places the EWMA's centre of mass W/2 versions back, paper Appendix B).",
    )
    window: Literal["configured", "measured"] = Field(
        default="configured",
        description="For decay auto: W is async.maxStaleness (configured) or the running mean of the "
        "measured per-token staleness (measured).",
    )
    reset: EwmaResetSpec = Field(
        default_factory=EwmaResetSpec, description="Reset theta_prox to theta when the keep ratio collapses."
    )

    cel_rules: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "!has(self.decay) || (type(self.decay) == string ? self.decay == 'auto' : "
            "(double(self.decay) > 0.0 && double(self.decay) < 1.0))",
            "decay must be 'auto' or a number strictly between 0 and 1",
        ),
    )

    @model_validator(mode="after")
    def _decay_open_interval(self) -> "EwmaSpec":
        if self.decay != "auto" and not (0.0 < float(self.decay) < 1.0):
            raise ValueError(
                f"decay must be in (0, 1) or 'auto'; got {self.decay} "
                "(0 would make the reference the current policy: use reference: current instead)"
            )
        return self


class CorrectionSpec(SpecModel):
    """``spec.correction``: reference policy, discrepancy mask, staleness clip, loss reduction."""

    reference: ReferencePolicy = Field(
        default=ReferencePolicy.EWMA,
        description="What stands in for the training-side old policy pi_ref: behavior (mu), current "
        "(actor weights when the batch arrives), linear/loglinear (interpolation by version gap), "
        "ewma (PPO-EWMA), exact (true pi_old via oldLogits.strategy).",
    )
    mask: MaskSpec = Field(default_factory=MaskSpec, description="Train–inference discrepancy handling of r_d.")
    clip: ClipSpec = Field(default_factory=ClipSpec, description="PPO clip of the staleness ratio r_s.")
    ewma: EwmaSpec = Field(default_factory=EwmaSpec, description="PPO-EWMA settings (reference: ewma).")
    loss_aggregation: LossAggregation = Field(
        default=LossAggregation.TOKEN_MEAN,
        description="tokenMean (denominator: valid tokens before the discrepancy mask) or sequenceMean.",
    )
