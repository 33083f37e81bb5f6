"""``spec.correction``: how the two off-policy corrections are configured.

Notation (docs/architecture.md, notation, paper §3.2): ``r_d = pi_ref / mu_old`` is the train–inference
*discrepancy* ratio, handled by a symmetric mask that ignores the advantage sign;
``r_s = pi_theta / pi_ref`` is the *staleness* ratio, clipped PPO-style with an
advantage-sign-aware indicator. ``reference`` chooses what stands in for ``pi_ref``.
"""

from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializerFunctionWrapHandler, field_validator, model_serializer, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import (
    CelRule,
    RuleError,
    at_defaults_cel,
    cel_literal,
    changed_from_defaults,
    on_field,
    raise_all,
)


class ReferencePolicy(StrEnum):
    """What stands in for the training-side old policy ``pi_ref`` (docs/architecture.md, notation)."""

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
    - ``turn``: geometric mean over each assistant turn (a run of tokens with one ``turn_id``).
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


class RoutingReplay(StrEnum):
    """Which expert routes a mixture-of-experts actor replays (docs/architecture.md, routing replay).

    - ``none``: every forward routes by its own router (route flips count as discrepancy).
    - ``rollout`` (R3): the routes the rollout engine sampled each token through are replayed in the
      reference/old-logit forward and in the training forward.
    - ``oldLogits`` (R2): the routes of the old-logit forward (the reference or exact scoring forward) are
      recorded there and replayed in the training forward.
    """

    NONE = "none"
    ROLLOUT = "rollout"
    OLD_LOGITS = "oldLogits"


# A ratio bound beyond this keeps every token a float32 ratio can hold: no repair at all (use mode: none).
MAX_RATIO_BOUND = 1000.0
BOUNDS_FORM_MESSAGE = (
    "bounds is either {low, high} or {factor: c}: set low and high together, or factor alone "
    "(e.g. bounds: {low: 0.5, high: 2.0} or bounds: {factor: 2.0})"
)
BOUNDS_ORDER_MESSAGE = "bounds needs 0 < low < 1 < high (a ratio of 1 means no discrepancy and is always kept)"
BOUNDS_FACTOR_MESSAGE = "bounds factor c means [1/c, c] and needs c > 1"


class Bounds(SpecModel):
    """A ratio interval ``[low, high]`` with ``0 < low < 1 < high``.

    In YAML either ``{low: 0.5, high: 2.0}`` or ``{factor: c}`` with ``c > 1`` meaning ``[1/c, c]``;
    code reads the resolved interval through :attr:`low` and :attr:`high` whichever form was given.
    """

    given_low: float | None = Field(
        default=None, alias="low", description="Lower bound of the ratio interval (0 < low < 1); with high."
    )
    given_high: float | None = Field(
        default=None, alias="high", le=MAX_RATIO_BOUND,
        description=f"Upper bound of the ratio interval (1 < high <= {MAX_RATIO_BOUND:g}); with low.",
    )
    factor: float | None = Field(
        default=None, le=MAX_RATIO_BOUND,
        description=f"Symmetric form instead of low/high: c > 1 (at most {MAX_RATIO_BOUND:g}) means the interval "
        "[1/c, c].",
    )

    # Typed object: the CRD checks both forms with CEL rules on this node (the API server cannot
    # evaluate rules on untyped "number or object" nodes).
    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "has(self.factor) ? (!has(self.low) && !has(self.high)) : (has(self.low) && has(self.high))",
            BOUNDS_FORM_MESSAGE,
        ),
        CelRule(
            "!has(self.low) || !has(self.high) || (self.low > 0.0 && self.low < 1.0 && self.high > 1.0)",
            BOUNDS_ORDER_MESSAGE,
        ),
        CelRule("!has(self.factor) || self.factor > 1.0", BOUNDS_FACTOR_MESSAGE),
    )

    @model_validator(mode="before")
    @classmethod
    def _not_a_number(cls, data: Any) -> Any:
        if isinstance(data, bool | int | float):
            raise ValueError(
                f"bounds is an object, not a number: write bounds: {{factor: {data}}} for [1/c, c] "
                "(e.g. bounds: {factor: 2.0}), or bounds: {low: 0.5, high: 2.0}"
            )
        return data

    @model_validator(mode="after")
    def _one_form_around_one(self) -> "Bounds":
        low, high, factor = self.given_low, self.given_high, self.factor
        if factor is not None:
            if low is not None or high is not None:
                raise ValueError(f"{BOUNDS_FORM_MESSAGE}; got low={low}, high={high}, factor={factor}")
            if not factor > 1.0:
                raise ValueError(f"{BOUNDS_FACTOR_MESSAGE}; got factor={factor}")
            return self
        if low is None or high is None:
            raise ValueError(f"{BOUNDS_FORM_MESSAGE}; got low={low}, high={high}")
        if not (0.0 < low < 1.0 < high):
            raise ValueError(f"{BOUNDS_ORDER_MESSAGE}; got low={low}, high={high}")
        return self

    @model_serializer(mode="wrap")
    def _given_form_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Written back as the user gave it ({low, high} or {factor}), so a dump validates again.
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def low(self) -> float:
        """The resolved lower bound (``1/factor`` for the symmetric form)."""
        return 1.0 / self.factor if self.factor is not None else float(self.given_low or 0.0)

    @property
    def high(self) -> float:
        """The resolved upper bound (``factor`` for the symmetric form)."""
        return self.factor if self.factor is not None else float(self.given_high or 0.0)


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
        description="Keep interval of r_d: {low, high} with 0 < low < 1 < high, or {factor: c} meaning [1/c, c].",
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
        default=0.2, gt=0.0, le=10.0, description="Upper clip epsilon, in (0, 10]: r_s is clipped above at 1 + high."
    )
    dual_clip: float | None = Field(
        default=None,
        gt=1.0,
        le=100.0,
        description="Dual-clip constant c > 1: for negative advantages the loss is bounded by -c*A "
        "(null disables dual clip).",
    )


class EwmaResetSpec(SpecModel):
    """Automatic reset of the EWMA reference (paper §6.5; ``rule`` chooses when and to what).

    The statistic is the batch's *in-bounds ratio*: the share of valid tokens whose (level-aggregated)
    ``r_d = pi_prox / mu`` lies inside ``mask.bounds``. Under ``mask.mode: mask`` it is the keep ratio
    (vetoed sequences aside); it is computed the same under ``icepop``, ``truncate`` and ``none``, where
    nothing is rejected and a keep ratio would stay at 1, so the reset can fire whatever the mode.
    """

    enabled: bool = Field(default=True, description="Whether the in-bounds-ratio reset rule is active.")
    keep_ratio_below: float = Field(
        default=0.8,
        gt=0.0,
        lt=1.0,
        description="tau: a policy version whose batch has fewer than this share of valid tokens with r_d "
        "inside mask.bounds counts as a low step (the keep ratio under mask.mode mask; measured the same "
        "under every mode).",
    )
    consecutive_steps: int = Field(
        default=3, ge=1, le=10_000, description="k: reset after this many consecutive low policy versions (batches)."
    )
    rule: Literal["paper", "paperCooldown", "recentre"] = Field(
        default="recentre",
        description="paper: k versions below keepRatioBelow reset theta_prox to the current weights (paper "
        "section 6.5); paperCooldown: the same, but the async.maxStaleness versions after a reset do not count "
        "toward the next streak; recentre: the threshold is the reference's own running in-bounds level minus "
        "margin (keepRatioBelow unused), with the same cooldown, and "
        "the reset moves theta_prox to the average of the weights that sampled the batch's tokens "
        "(keeps the last maxStaleness versions as bfloat16 residuals of the EWMA: maxStaleness/2 weight copies).",
    )
    margin: float = Field(
        default=0.1,
        gt=0.0,
        lt=1.0,
        description="recentre: a version is low when its in-bounds ratio is below the running level (an "
        "exponential average of the ratios before it, about 9 versions back) minus this margin.",
    )


DECAY_AUTO_HINT = "omit decay for the automatic g/(g+1), g the expected version gap"
DECAY_MESSAGE = f"decay must be strictly between 0 and 1 ({DECAY_AUTO_HINT})"


class EwmaSpec(SpecModel):
    """The PPO-EWMA reference: a bias-corrected parameter EWMA ``theta_prox`` (paper §5.2).

    ``theta_prox`` folds in the weights once per policy version (after all updates of a batch) and is
    held fixed while a batch trains. The automatic decay ``beta = g / (g + 1)`` puts the average's centre
    of mass ``beta / (1 - beta)`` at ``g`` versions back, the expected version gap of a trained token:
    ``g = W / 2`` for ``window: configured`` (W = async.maxStaleness; gaps spread over 0..W, so
    ``beta = W / (W + 2)``, paper Appendix B) and the measured mean gap for ``window: measured``.
    """

    decay: float | None = Field(
        default=None,
        description="EWMA decay beta in (0, 1) per policy version; omit it for the automatic g/(g+1), which "
        "puts the EWMA's centre of mass g versions back: g = W/2 (so W/(W+2), paper Appendix B) or the "
        "measured mean gap (see window).",
        json_schema_extra=on_field(CelRule("self > 0.0 && self < 1.0", DECAY_MESSAGE)),
    )
    window: Literal["configured", "measured"] = Field(
        default="configured",
        description="For the automatic decay, the expected version gap g: configured = async.maxStaleness/2; "
        "measured = the trained tokens' mean version gap, averaged over about the last 20 batches "
        "(async.maxStaleness/2 until the first batch).",
    )
    reset: EwmaResetSpec = Field(
        default_factory=EwmaResetSpec,
        description="Reset theta_prox to theta when the batch's in-bounds ratio of r_d collapses.",
    )

    @field_validator("decay", mode="before")
    @classmethod
    def _decay_number(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "auto":
            raise ValueError(f"decay is a number in (0, 1), not {v!r}: {DECAY_AUTO_HINT}")
        return v

    @field_validator("decay")
    @classmethod
    def _decay_open_interval(cls, v: float | None) -> float | None:
        if v is not None and not (0.0 < v < 1.0):
            raise ValueError(
                f"{DECAY_MESSAGE}; got {v} (0 would make the reference the current policy: use "
                "reference: current instead)"
            )
        return v


AUDIT_EXACT_MESSAGE = (
    "correction.audit measures a cheap reference against exact pi_old; with reference: exact there is nothing "
    "to audit: remove correction.audit (or set everyNSteps: 0), or choose a cheap reference"
)
DEFAULT_AUDIT_FRACTION = 0.25
AUDIT_FRACTION_UNUSED_MESSAGE = (
    "audit.fraction is only used when audit.everyNSteps > 0; set everyNSteps (e.g. 10) or remove fraction"
)


class AuditSpec(SpecModel):
    """Live audit of a cheap reference (behavior, current, linear, loglinear, ewma) against exact ``pi_old``.

    On every ``everyNSteps``-th step a ``fraction`` of the batch rows is also scored under the exact
    version that generated each token, and the distance of the cheap ``pi_ref`` from it is exported
    (mean and p99 of ``|log pi_ref - log pi_old|``, and how often the keep/clip decisions differ).
    """

    every_n_steps: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Audit every Nth optimizer step; 0 = off. While on, the actor keeps weight snapshots for "
        "the audit: up to async.maxStaleness + 1 (W+1) extra copies of the weights in host memory.",
    )
    fraction: float = Field(
        default=DEFAULT_AUDIT_FRACTION,
        gt=0.0,
        le=1.0,
        description="Share of the batch rows of an audited step also scored with exact pi_old, in (0, 1] "
        "(the extra forward's cost scales with it).",
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            f"!has(self.fraction) || self.fraction == {cel_literal(DEFAULT_AUDIT_FRACTION)} || "
            "(has(self.everyNSteps) && self.everyNSteps > 0)",
            AUDIT_FRACTION_UNUSED_MESSAGE,
            ".fraction",
        ),
    )

    @model_validator(mode="after")
    def _fraction_only_when_on(self) -> "AuditSpec":
        if self.every_n_steps == 0 and self.fraction != DEFAULT_AUDIT_FRACTION:
            raise RuleError([("fraction", f"{AUDIT_FRACTION_UNUSED_MESSAGE} (got fraction={self.fraction})")])
        return self

    @property
    def enabled(self) -> bool:
        """Whether any step is audited."""
        return self.every_n_steps > 0


class StartupCheckSpec(SpecModel):
    """The start-up discrepancy probe: before the first step every rollout engine samples ``rollouts``
    held-out problems, the actor scores them, and the job refuses to start (exit code 2, the likely cause
    named) when ``|log r_d| = |log pi_theta - log mu|`` is above either limit (``trainer/driver/loop/startup_probe.py``)."""

    enabled: bool = Field(default=True, description="Run the probe before training.")
    rollouts: int = Field(
        default=16, ge=1, le=1024, description="Held-out rollouts each engine samples for the probe (never trained on)."
    )
    max_mean_abs_log_ratio: float = Field(
        default=0.05,
        gt=0.0,
        le=10.0,  # |log r_d| = 10 is a ratio of e^10: no engine that far off should start
        description="Refuse to start when an engine's mean |log r_d| over the probe's sampled tokens is above this "
        "(measured: ~1e-3 to 4e-3 for a bfloat16 engine against the float32 actor, ~2e-7 for float32).",
    )
    max_p99_abs_log_ratio: float = Field(
        default=0.5,
        gt=0.0,
        le=10.0,  # |log r_d| = 10 is a ratio of e^10: no engine that far off should start
        description="Refuse to start when an engine's 99th percentile of |log r_d| is above this (measured: "
        "~5e-3 to 1.5e-2 for a bfloat16 engine).",
    )


EWMA_UNUSED_MESSAGE = (
    "correction.ewma is only used with correction.reference: ewma; remove correction.ewma or set "
    "reference: ewma"
)


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
    audit: AuditSpec = Field(
        default_factory=AuditSpec,
        description="Live audit of a cheap reference against exact pi_old on sampled steps (off by default; "
        "costs up to W+1 host weight copies while on). Not with reference: exact.",
    )
    routing_replay: RoutingReplay = Field(
        default=RoutingReplay.NONE,
        description="Mixture-of-experts models only: none, rollout (R3: replay the experts the rollout engine "
        "routed each token through, in every actor forward that scores it) or oldLogits (R2: replay the "
        "routes of the old-logit forward in the training forward). Transformers rollout engine only.",
    )
    startup_check: StartupCheckSpec = Field(
        default_factory=StartupCheckSpec,
        description="Before training, measure each rollout engine's train–inference log-ratio on a few "
        "held-out rollouts and refuse to start above its limits, naming the likely cause (temperature, "
        "dtype, chat template, family mapping).",
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.ewma) || (has(self.reference) ? self.reference : 'ewma') == 'ewma' || "
            f"({at_defaults_cel(EwmaSpec, 'self.ewma')})",
            EWMA_UNUSED_MESSAGE,
            ".ewma",
        ),
        CelRule(
            "!has(self.audit) || !has(self.reference) || self.reference != 'exact' || "
            f"({at_defaults_cel(AuditSpec, 'self.audit')})",
            AUDIT_EXACT_MESSAGE,
            ".audit",
        ),
    )

    @model_validator(mode="after")
    def _sections_match_the_reference(self) -> "CorrectionSpec":
        problems: list[tuple[str, str]] = []
        if self.reference is not ReferencePolicy.EWMA:
            changed = changed_from_defaults(self.ewma)
            if changed:
                problems.append((
                    "ewma",
                    f"{EWMA_UNUSED_MESSAGE} (reference is '{self.reference.value}'; set here: {', '.join(changed)})",
                ))
        if self.reference is ReferencePolicy.EXACT:
            changed = changed_from_defaults(self.audit)
            if changed:
                problems.append(("audit", f"{AUDIT_EXACT_MESSAGE} (set here: {', '.join(changed)})"))
        raise_all(problems)
        return self
