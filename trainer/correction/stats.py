"""The correction loss's diagnostics: one frozen, typed record of counts and sums, and its documentation.

The record carries what was counted -- token and sequence counts, sums over valid tokens, extremes --
never a fraction: a fraction of one step cannot be summed over steps, its counts can
(``rate(kept) / rate(valid)`` in Prometheus). Fractions and means are derived properties with the
names the logs use (``keep_ratio``, ``clip_low_frac``, ``kl_k3``, ...): they are ``0`` when the
denominator is empty, except ``keep_ratio`` (``1``: nothing was rejected) and the ratio means
``rd_mean``/``rs_mean`` (``1``: the neutral ratio).

One record from the loss to the exporter: ``correction_loss`` returns ``CorrectionStats[Tensor]``
(0-dim float32 tensors computed under ``no_grad``; no ``.item()``, reading a value is the caller's
sync point), :meth:`CorrectionStats.to_floats` turns it into ``CorrectionStats[float]`` with one
sync, :meth:`CorrectionStats.record` flattens it for a log line (fields and derived values, keyed by
their own names) and :meth:`CorrectionStats.from_record` reads it back from such a line.
``METRICS`` (fields) and ``DERIVED`` (properties) are the single source of the metric docs
(``docs/correction-metrics.md``, see :func:`metrics_markdown`).

Denominators:
- ``valid_tokens``: tokens with ``loss_mask`` True and finite ``logp_theta``, ``logp_ref``,
  ``logp_mu`` and advantage, counted *before* the discrepancy mask.
- ``valid_seqs``: sequences with at least one valid token.
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Generic, TypeVar

import torch
from torch import Tensor

from asyncrl.trainer.correction.clip import Clip
from asyncrl.trainer.correction.discrepancy import Discrepancy

S = TypeVar("S", Tensor, float)


@dataclass(frozen=True)
class MetricDoc:
    """One metric's documentation: name, meaning, denominator (``-`` for counts, sums and extremes)."""

    name: str
    description: str
    denominator: str


METRICS: tuple[MetricDoc, ...] = (
    MetricDoc("valid_tokens", "Tokens that count: loss_mask True and every input finite (before the discrepancy mask).", "-"),
    MetricDoc("valid_seqs", "Sequences with at least one valid token.", "-"),
    MetricDoc(
        "nonfinite_tokens",
        "loss_mask tokens dropped because logp_theta, logp_ref, logp_mu or the advantage is NaN/Inf "
        "(or a log-ratio of them overflows).",
        "-",
    ),
    MetricDoc("kept_tokens", "Valid tokens the discrepancy handling keeps (mask and veto).", "-"),
    MetricDoc("reject_low_tokens", "Valid tokens rejected because the level-aggregated r_d < mask.bounds.low (mask, icepop).", "-"),
    MetricDoc("reject_high_tokens", "Valid tokens rejected because the level-aggregated r_d > mask.bounds.high (mask, icepop).", "-"),
    MetricDoc("rd_below_tokens", "Valid tokens whose level-aggregated r_d < bounds.low, whatever the mode (truncate: clamped up).", "-"),
    MetricDoc("rd_above_tokens", "Valid tokens whose level-aggregated r_d > bounds.high, whatever the mode (truncate: clamped down).", "-"),
    MetricDoc("veto_tokens", "Valid tokens in sequences rejected by the catastrophic veto (token r_d < mask.vetoBelow).", "-"),
    MetricDoc("veto_seqs", "Sequences rejected by the catastrophic veto.", "-"),
    MetricDoc("clip_low_tokens", "Valid tokens whose gradient the lower PPO clip stops: A < 0 and r_s < 1 - clip.low.", "-"),
    MetricDoc("clip_high_tokens", "Valid tokens whose gradient the upper PPO clip stops: A > 0 and r_s > 1 + clip.high.", "-"),
    MetricDoc("dual_clip_tokens", "Valid tokens whose gradient the dual clip stops: A < 0 and r_s > clip.dualClip.", "-"),
    MetricDoc(
        "clip_and_reject_tokens",
        "Valid tokens both clipped (sign-aware PPO clip, dual clip, or |log r_s| beyond the safety bound) "
        "and rejected by the discrepancy handling.",
        "-",
    ),
    MetricDoc("clip_or_reject_tokens", "Valid tokens clipped or rejected (the others carry gradient).", "-"),
    MetricDoc("rd_sum", "Sum of token-level r_d = pi_ref/mu over valid tokens (log-ratio clamped to +-20).", "-"),
    MetricDoc("rs_sum", "Sum of r_s = pi_theta/pi_ref over valid tokens (log-ratio clamped to +-20).", "-"),
    MetricDoc("weight_sum", "Sum of the discrepancy weight w applied to the policy-gradient term (0 for rejected tokens).", "-"),
    MetricDoc("weight_sq_sum", "Sum of w^2 over valid tokens (with weight_sum: the effective sample size).", "-"),
    MetricDoc("kl_k1_sum", "Sum over valid tokens of logp_mu - logp_ref (log-ratio clamped to +-20).", "-"),
    MetricDoc("kl_k3_sum", "Sum over valid tokens of r_d - 1 - log r_d (r_d = pi_ref/mu; non-negative).", "-"),
    MetricDoc(
        "kl_k3_theta_ref_sum",
        "Sum over valid tokens of 1/r_s - 1 + log r_s (r_s = pi_theta/pi_ref; non-negative).", "-",
    ),
    MetricDoc("rd_min", "Minimum token-level r_d over valid tokens (1 when none is valid).", "-"),
    MetricDoc("rd_max", "Maximum token-level r_d over valid tokens (1 when none is valid).", "-"),
    MetricDoc("rs_min", "Minimum r_s over valid tokens (1 when none is valid).", "-"),
    MetricDoc("rs_max", "Maximum r_s over valid tokens (1 when none is valid).", "-"),
)

DERIVED: tuple[MetricDoc, ...] = (
    MetricDoc("keep_ratio", "kept_tokens / valid_tokens; 1 when none is valid.", "valid_tokens"),
    MetricDoc("reject_low_frac", "reject_low_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("reject_high_frac", "reject_high_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("rd_below_frac", "rd_below_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("rd_above_frac", "rd_above_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("veto_frac", "veto_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("veto_seq_frac", "veto_seqs / valid_seqs.", "valid_seqs"),
    MetricDoc("clip_low_frac", "clip_low_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("clip_high_frac", "clip_high_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("dual_clip_frac", "dual_clip_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("clip_and_reject_frac", "clip_and_reject_tokens / valid_tokens.", "valid_tokens"),
    MetricDoc("clip_or_reject_frac", "clip_or_reject_tokens / valid_tokens: 1 - this = tokens that carry gradient.", "valid_tokens"),
    MetricDoc("rd_mean", "Mean r_d: rd_sum / valid_tokens; 1 when none is valid.", "valid_tokens"),
    MetricDoc("rs_mean", "Mean r_s: rs_sum / valid_tokens; 1 when none is valid.", "valid_tokens"),
    MetricDoc("weight_mean", "Mean discrepancy weight: weight_sum / valid_tokens.", "valid_tokens"),
    MetricDoc(
        "ess",
        "Normalised effective sample size of w: weight_sum^2 / (valid_tokens * weight_sq_sum); 0 if all w = 0.",
        "valid_tokens",
    ),
    MetricDoc("kl_k1", "k1 estimate of KL(mu || pi_ref) from tokens sampled under mu: kl_k1_sum / valid_tokens.", "valid_tokens"),
    MetricDoc(
        "kl_k3",
        "k3 estimate of KL(mu || pi_ref): kl_k3_sum / valid_tokens (non-negative, low variance).",
        "valid_tokens",
    ),
    MetricDoc(
        "kl_k3_theta_ref",
        "k3 estimate of KL(pi_theta || pi_ref): kl_k3_theta_ref_sum / valid_tokens (tokens sampled under mu, "
        "which the clip keeps close to pi_theta).",
        "valid_tokens",
    ),
)


def _div(num: S, den: S) -> S:
    """``num / den``; every numerator here is 0 when its denominator is (subsets of an empty set)."""
    if isinstance(den, Tensor):
        return num / den.clamp(min=1e-30)
    return num / max(den, 1e-30)


@dataclass(frozen=True)
class CorrectionStats(Generic[S]):
    """What one ``correction_loss`` call counted: 0-dim float32 tensors (``S = Tensor``) in the loss,
    floats (``S = float``) once read (:meth:`to_floats`).

    The meaning of each field is in :data:`METRICS` (same names, same order), of each derived
    property in :data:`DERIVED`.
    """

    valid_tokens: S
    valid_seqs: S
    nonfinite_tokens: S
    kept_tokens: S
    reject_low_tokens: S
    reject_high_tokens: S
    rd_below_tokens: S
    rd_above_tokens: S
    veto_tokens: S
    veto_seqs: S
    clip_low_tokens: S
    clip_high_tokens: S
    dual_clip_tokens: S
    clip_and_reject_tokens: S
    clip_or_reject_tokens: S
    rd_sum: S
    rs_sum: S
    weight_sum: S
    weight_sq_sum: S
    kl_k1_sum: S
    kl_k3_sum: S
    kl_k3_theta_ref_sum: S
    rd_min: S
    rd_max: S
    rs_min: S
    rs_max: S

    # -- derived (DERIVED documents them, in this order) ------------------------------------------
    @property
    def keep_ratio(self) -> S:
        return _div(self.kept_tokens - self.valid_tokens, self.valid_tokens) + 1.0  # 1 - rejected / n

    @property
    def reject_low_frac(self) -> S:
        return _div(self.reject_low_tokens, self.valid_tokens)

    @property
    def reject_high_frac(self) -> S:
        return _div(self.reject_high_tokens, self.valid_tokens)

    @property
    def rd_below_frac(self) -> S:
        return _div(self.rd_below_tokens, self.valid_tokens)

    @property
    def rd_above_frac(self) -> S:
        return _div(self.rd_above_tokens, self.valid_tokens)

    @property
    def veto_frac(self) -> S:
        return _div(self.veto_tokens, self.valid_tokens)

    @property
    def veto_seq_frac(self) -> S:
        return _div(self.veto_seqs, self.valid_seqs)

    @property
    def clip_low_frac(self) -> S:
        return _div(self.clip_low_tokens, self.valid_tokens)

    @property
    def clip_high_frac(self) -> S:
        return _div(self.clip_high_tokens, self.valid_tokens)

    @property
    def dual_clip_frac(self) -> S:
        return _div(self.dual_clip_tokens, self.valid_tokens)

    @property
    def clip_and_reject_frac(self) -> S:
        return _div(self.clip_and_reject_tokens, self.valid_tokens)

    @property
    def clip_or_reject_frac(self) -> S:
        return _div(self.clip_or_reject_tokens, self.valid_tokens)

    @property
    def rd_mean(self) -> S:
        return _div(self.rd_sum - self.valid_tokens, self.valid_tokens) + 1.0  # 1 when empty

    @property
    def rs_mean(self) -> S:
        return _div(self.rs_sum - self.valid_tokens, self.valid_tokens) + 1.0

    @property
    def weight_mean(self) -> S:
        return _div(self.weight_sum, self.valid_tokens)

    @property
    def ess(self) -> S:
        return _div(self.weight_sum * self.weight_sum, self.valid_tokens * self.weight_sq_sum)

    @property
    def kl_k1(self) -> S:
        return _div(self.kl_k1_sum, self.valid_tokens)

    @property
    def kl_k3(self) -> S:
        return _div(self.kl_k3_sum, self.valid_tokens)

    @property
    def kl_k3_theta_ref(self) -> S:
        return _div(self.kl_k3_theta_ref_sum, self.valid_tokens)

    # -- conversions ------------------------------------------------------------------------------
    def as_dict(self, prefix: str = "") -> dict[str, S]:
        """The fields as ``{prefix + name: value}`` (e.g. ``prefix="correction/"``)."""
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}

    def to_floats(self) -> "CorrectionStats[float]":
        """The same record with Python floats (one device sync for all fields)."""
        values = [getattr(self, f.name) for f in fields(self)]
        floats = torch.stack(values).tolist() if isinstance(values[0], Tensor) else [float(v) for v in values]
        return CorrectionStats(**dict(zip((f.name for f in fields(self)), floats, strict=True)))

    def record(self) -> dict[str, float]:
        """Fields and derived values as floats, keyed by their own names (a step record, a log line)."""
        out = self.to_floats()
        return {**out.as_dict(), **{d.name: float(getattr(out, d.name)) for d in DERIVED}}

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> "CorrectionStats[float]":
        """The record back from a :meth:`record` mapping (extra keys, e.g. a step's others, are ignored)."""
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in record]
        if missing:
            raise KeyError(
                f"not a correction record: missing {', '.join(missing)}; build it with CorrectionStats.record()"
            )
        return CorrectionStats(**{n: float(record[n]) for n in names})  # type: ignore[arg-type]


def _cell(text: str) -> str:
    """Escape ``|`` (as in ``KL(mu || pi_ref)``) so it does not split a Markdown table cell."""
    return text.replace("|", r"\|")


def metrics_markdown() -> str:
    """Markdown tables of the record's fields and its derived values, generated from ``METRICS`` and ``DERIVED``."""
    rows = ["| field | meaning |", "|---|---|"]
    rows += [f"| `{m.name}` | {_cell(m.description)} |" for m in METRICS]
    rows += ["", "Derived (properties of the record, also in every step record):", ""]
    rows += ["| derived | meaning | denominator |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {_cell(m.description)} | {m.denominator} |" for m in DERIVED]
    return "\n".join(rows) + "\n"


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum()`` without the ``[B, T]`` temporary."""
    return torch.dot(a.reshape(-1), b.reshape(-1))


# The raw values one call reduces (each one kernel over the batch, or read off the clip and the
# discrepancy), in the order :func:`compute_stats` stacks them ...
RAW: tuple[str, ...] = (
    "n", "n_seq", "mask_count", "kept", "below", "above", "veto_tokens", "veto_seqs", "clip_low", "clip_high",
    "dual", "stopped", "stopped_kept", "weight_sum", "weight_sq_sum", "k3_theta_div_sum",
    "log_rs_sum", "log_rd_sum", "rs_m1_sum", "rd_m1_sum", "rd_min", "rd_max", "rs_min", "rs_max",
)
# ... and every field of the record as a signed sum of them (``rejects``: the mode rejects
# out-of-band tokens, else reject_* are 0). One matrix-vector product turns the raw vector into the
# record: no per-field scalar op on the hot path.
FIELD_FROM_RAW: dict[str, dict[str, float]] = {
    "valid_tokens": {"n": 1}, "valid_seqs": {"n_seq": 1}, "nonfinite_tokens": {"mask_count": 1, "n": -1},
    "kept_tokens": {"kept": 1}, "reject_low_tokens": {"below": 1}, "reject_high_tokens": {"above": 1},
    "rd_below_tokens": {"below": 1}, "rd_above_tokens": {"above": 1},
    "veto_tokens": {"veto_tokens": 1}, "veto_seqs": {"veto_seqs": 1},
    "clip_low_tokens": {"clip_low": 1}, "clip_high_tokens": {"clip_high": 1}, "dual_clip_tokens": {"dual": 1},
    "clip_and_reject_tokens": {"stopped": 1, "stopped_kept": -1},
    "clip_or_reject_tokens": {"n": 1, "kept": -1, "stopped_kept": 1},
    "rd_sum": {"rd_m1_sum": 1, "n": 1},  # r_d - 1 is 0 where invalid
    "rs_sum": {"rs_m1_sum": 1, "n": 1},
    "weight_sum": {"weight_sum": 1}, "weight_sq_sum": {"weight_sq_sum": 1},
    "kl_k1_sum": {"log_rd_sum": -1},
    "kl_k3_sum": {"rd_m1_sum": 1, "log_rd_sum": -1},  # sum(expm1(x)) - sum(x): no r_d - 1 cancellation in fp32
    # k3 of KL(pi_theta || pi_ref), r = 1 / r_s: r - 1 - log r = -(r_s - 1) / r_s + log r_s
    "kl_k3_theta_ref_sum": {"log_rs_sum": 1, "k3_theta_div_sum": -1},
    "rd_min": {"rd_min": 1}, "rd_max": {"rd_max": 1}, "rs_min": {"rs_min": 1}, "rs_max": {"rs_max": 1},
}
_FIELDS = tuple(f.name for f in fields(CorrectionStats))
_MAPS: dict[tuple[bool, torch.dtype, torch.device], Tensor] = {}


def _field_map(rejects: bool, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[fields, raw]`` matrix of :data:`FIELD_FROM_RAW` (cached per mode kind, dtype and device)."""
    key = (rejects, dtype, device)
    if key not in _MAPS:
        m = torch.zeros(len(_FIELDS), len(RAW), dtype=dtype)
        for i, name in enumerate(_FIELDS):
            if not rejects and name in ("reject_low_tokens", "reject_high_tokens"):
                continue
            for raw, coef in FIELD_FROM_RAW[name].items():
                m[i, RAW.index(raw)] = coef
        _MAPS[key] = m.to(device)
    return _MAPS[key]


def compute_stats(
    *,
    mask_count: Tensor,
    valid: Tensor,
    n_tok: Tensor,
    logs: Tensor,
    ratios_m1: Tensor,
    ratios: Tensor,
    disc: Discrepancy,
    clip: Clip,
    scratch: tuple[Tensor, Tensor],
) -> "CorrectionStats[Tensor]":
    """The counts and sums of one batch from the loss's intermediates (call under ``no_grad``).

    No division here: fractions are derived where they are read. Every sum the loss already has a
    tensor for is one reduction, and the two ratios share theirs (``[2, B, T]`` in, 2 values out);
    counts that follow from others (``nonfinite``, ``clip_or_reject``, the sums of ``r``, the KL
    sums) come out of one matrix-vector product (:data:`FIELD_FROM_RAW`), never another pass.

    Args:
        mask_count: 0-dim, tokens with ``loss_mask`` True.
        valid: ``[B, T]`` 0/1, the tokens that count; n_tok: ``[B]`` valid tokens per sequence.
        logs: ``[2, B, T]`` token-level clamped ``[log r_s, log r_d]``, 0 where invalid.
        ratios_m1: ``[2, B, T]`` ``expm1(logs)`` (0 where invalid); ratios: ``ratios_m1 + 1``.
        disc, clip: the discrepancy and clip outcomes.
        scratch: two ``[B, T]`` buffers the loss no longer reads; overwritten here, as is ``logs``
            (its last reader), so the statistics allocate no ``[B, T]`` buffer of their own.
    """
    n = n_tok.sum()
    keep, stopped, w = disc.keep, clip.stopped, disc.weight  # stopped implies valid (A = 0 elsewhere)
    log_sums = logs.sum(dim=(1, 2))  # [log_rs_sum, log_rd_sum]
    # r - 1 = -(r_s - 1) / r_s keeps the expm1 precision for small |log r_s| in fp32 (k3 of KL(pi_theta || pi_ref)).
    k3_div = torch.div(ratios_m1[0], ratios[0], out=scratch[0]).sum()

    # Extremes in log space, both ratios in one min and one max reduction: every invalid token takes its
    # ratio's mean over the valid tokens, which lies between their extremes (up to the rounding of
    # one division), so it never wins; with no valid token all are 0, i.e. a ratio of 1.
    means = (log_sums / n.clamp(min=1.0)).view(2, 1, 1)
    invalid = torch.mul(valid, -1.0, out=scratch[1]).add_(1.0)  # [B, T] 1 - valid
    ratio_sums = ratios_m1.sum(dim=(1, 2))  # [rs_m1_sum, rd_m1_sum], before logs changes below
    pushed = logs.addcmul_(invalid, means).view(2, -1)  # logs is not read after this
    lo, hi = pushed.amin(dim=1), pushed.amax(dim=1)  # (aminmax with a dim is 30x slower on CPU)
    raw = torch.cat([
        torch.stack([
            n, n_tok.clamp(max=1.0).sum(), mask_count, keep.sum(), disc.below, disc.above,
            _dot(n_tok, disc.veto_seq), disc.veto_seq.sum(), clip.clip_low, clip.clip_high, clip.dual,
            stopped.sum(), _dot(stopped, keep), w.sum(), _dot(w, w), k3_div,
        ]),
        log_sums, ratio_sums, torch.stack([lo[1], hi[1], lo[0], hi[0]]).exp(),
    ])
    values = torch.mv(_field_map(disc.rejects, raw.dtype, raw.device), raw).to(torch.float32)
    return CorrectionStats(*values.unbind())
