"""The correction loss's diagnostics: one frozen, typed stats object and its documentation table.

Every metric is a 0-dim float tensor computed under ``no_grad`` (no ``.item()``: reading a value
is the caller's sync point). Fractions name their denominator; they are ``0`` when the
denominator is empty, except ``keep_ratio`` (``1``: nothing was rejected) and the ratio
summaries ``rd_*``/``rs_*`` (``1``: the neutral ratio). ``METRICS`` is the single source for the
metric docs (``docs/metrics.md`` can be generated from it, see :func:`metrics_markdown`).

Denominators:
- ``valid_tokens``: tokens with ``loss_mask`` True and finite ``logp_theta``, ``logp_ref``,
  ``logp_mu`` and advantage, counted *before* the discrepancy mask.
- ``valid_seqs``: sequences with at least one valid token.
"""

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from asyncrl.trainer.correction.clip import Clip
from asyncrl.trainer.correction.discrepancy import SAFETY_BOUND, Discrepancy


@dataclass(frozen=True)
class MetricDoc:
    """One metric's documentation: name, meaning, denominator (``-`` for counts)."""

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
    MetricDoc("keep_ratio", "Valid tokens the discrepancy handling keeps (mask and veto); 1 when none is valid.", "valid_tokens"),
    MetricDoc("reject_low_frac", "Valid tokens rejected because the level-aggregated r_d < mask.bounds.low (mask, icepop).", "valid_tokens"),
    MetricDoc("reject_high_frac", "Valid tokens rejected because the level-aggregated r_d > mask.bounds.high (mask, icepop).", "valid_tokens"),
    MetricDoc("rd_below_frac", "Valid tokens whose level-aggregated r_d < bounds.low, whatever the mode (truncate: clamped up).", "valid_tokens"),
    MetricDoc("rd_above_frac", "Valid tokens whose level-aggregated r_d > bounds.high, whatever the mode (truncate: clamped down).", "valid_tokens"),
    MetricDoc("veto_frac", "Valid tokens in sequences rejected by the catastrophic veto (token r_d < mask.vetoBelow).", "valid_tokens"),
    MetricDoc("veto_seq_frac", "Sequences rejected by the catastrophic veto.", "valid_seqs"),
    MetricDoc("clip_low_frac", "Valid tokens whose gradient the lower PPO clip stops: A < 0 and r_s < 1 - clip.low.", "valid_tokens"),
    MetricDoc("clip_high_frac", "Valid tokens whose gradient the upper PPO clip stops: A > 0 and r_s > 1 + clip.high.", "valid_tokens"),
    MetricDoc("dual_clip_frac", "Valid tokens whose gradient the dual clip stops: A < 0 and r_s > clip.dualClip.", "valid_tokens"),
    MetricDoc(
        "clip_and_reject_frac",
        "Valid tokens both clipped (sign-aware PPO clip, dual clip, or |log r_s| beyond the safety bound) "
        "and rejected by the discrepancy handling.",
        "valid_tokens",
    ),
    MetricDoc("clip_or_reject_frac", "Valid tokens clipped or rejected: 1 - this = tokens that carry gradient.", "valid_tokens"),
    MetricDoc("rd_mean", "Mean token-level r_d = pi_ref/mu over valid tokens (log-ratio clamped to +-20).", "valid_tokens"),
    MetricDoc("rd_min", "Minimum token-level r_d over valid tokens.", "-"),
    MetricDoc("rd_max", "Maximum token-level r_d over valid tokens.", "-"),
    MetricDoc("rs_mean", "Mean r_s = pi_theta/pi_ref over valid tokens (log-ratio clamped to +-20).", "valid_tokens"),
    MetricDoc("rs_min", "Minimum r_s over valid tokens.", "-"),
    MetricDoc("rs_max", "Maximum r_s over valid tokens.", "-"),
    MetricDoc("weight_mean", "Mean discrepancy weight w applied to the policy-gradient term (0 for rejected tokens).", "valid_tokens"),
    MetricDoc("ess", "Normalised effective sample size of w over valid tokens: (sum w)^2 / (n sum w^2); 0 if all w = 0.", "valid_tokens"),
    MetricDoc(
        "kl_k1",
        "k1 estimate of KL(mu || pi_ref) from tokens sampled under mu: mean(logp_mu - logp_ref) "
        "(log-ratio clamped to +-20).",
        "valid_tokens",
    ),
    MetricDoc(
        "kl_k3",
        "k3 estimate of KL(mu || pi_ref): mean(r_d - 1 - log r_d) with r_d = pi_ref/mu (non-negative, low variance).",
        "valid_tokens",
    ),
)


@dataclass(frozen=True)
class CorrectionStats:
    """Diagnostics of one ``correction_loss`` call; every field is a 0-dim float32 tensor.

    The meaning and denominator of each field are in :data:`METRICS` (same names, same order).
    """

    valid_tokens: Tensor
    valid_seqs: Tensor
    nonfinite_tokens: Tensor
    keep_ratio: Tensor
    reject_low_frac: Tensor
    reject_high_frac: Tensor
    rd_below_frac: Tensor
    rd_above_frac: Tensor
    veto_frac: Tensor
    veto_seq_frac: Tensor
    clip_low_frac: Tensor
    clip_high_frac: Tensor
    dual_clip_frac: Tensor
    clip_and_reject_frac: Tensor
    clip_or_reject_frac: Tensor
    rd_mean: Tensor
    rd_min: Tensor
    rd_max: Tensor
    rs_mean: Tensor
    rs_min: Tensor
    rs_max: Tensor
    weight_mean: Tensor
    ess: Tensor
    kl_k1: Tensor
    kl_k3: Tensor

    def as_dict(self, prefix: str = "") -> dict[str, Tensor]:
        """The metrics as ``{prefix + name: 0-dim tensor}`` (e.g. ``prefix="correction/"``)."""
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}


def _cell(text: str) -> str:
    """Escape ``|`` (as in ``KL(mu || pi_ref)``) so it does not split a Markdown table cell."""
    return text.replace("|", r"\|")


def metrics_markdown() -> str:
    """A Markdown table of every metric (name, meaning, denominator), generated from ``METRICS``."""
    rows = ["| metric | meaning | denominator |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {_cell(m.description)} | {m.denominator} |" for m in METRICS]
    return "\n".join(rows) + "\n"


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum()`` without the ``[B, T]`` temporary."""
    return torch.dot(a.reshape(-1), b.reshape(-1))


def compute_stats(
    *,
    mask_count: Tensor,
    valid: Tensor,
    n_tok: Tensor,
    log_rd: Tensor,
    rd_m1: Tensor,
    log_rs: Tensor,
    rs: Tensor,
    disc: Discrepancy,
    clip: Clip,
) -> CorrectionStats:
    """The metrics of one batch from the loss's intermediates (call under ``no_grad``).

    All numerators and denominators are stacked and divided once (two dozen 0-dim divisions
    would cost more than the ``[B, T]`` work). Where-free: an empty denominator comes with a zero
    numerator, which gives the documented empty values.

    Args:
        mask_count: 0-dim, tokens with ``loss_mask`` True.
        valid: ``[B, T]`` 0/1, the tokens that count; n_tok: ``[B]`` valid tokens per sequence.
        log_rd: ``[B, T]`` token-level clamped ``log r_d`` (0 where invalid); rd_m1: ``expm1(log_rd)``.
        log_rs, rs: ``[B, T]`` clamped ``log r_s`` (0 where invalid) and ``exp(log_rs)`` (1 there).
        disc, clip: the discrepancy and clip outcomes.
    """
    n = n_tok.sum()
    n_seq = n_tok.clamp(max=1.0).sum()  # n_tok is integer-valued: clamp(max=1) is "has a token"
    keep, stopped, w = disc.keep, clip.stopped, disc.weight  # stopped implies valid (A = 0 elsewhere)
    kept = keep.sum()
    below, above = disc.below, disc.above
    zero = torch.zeros_like(n)
    stopped_n = stopped.sum()
    stopped_kept = _dot(stopped, keep)
    w_sum = w.sum()
    log_rd_sum = log_rd.sum()
    # (numerator, denominator, offset): metric = numerator / denominator + offset.
    one = torch.ones_like(n)
    table: dict[str, tuple[Tensor, Tensor, float]] = {
        "valid_tokens": (n, one, 0.0),
        "valid_seqs": (n_seq, one, 0.0),
        "nonfinite_tokens": (mask_count - n, one, 0.0),
        "keep_ratio": (kept - n, n, 1.0),  # 1 - rejected / n: 1 when nothing is valid
        "reject_low_frac": (below if disc.rejects else zero, n, 0.0),
        "reject_high_frac": (above if disc.rejects else zero, n, 0.0),
        "rd_below_frac": (below, n, 0.0),
        "rd_above_frac": (above, n, 0.0),
        "veto_frac": ((n_tok * disc.veto_seq.squeeze(-1)).sum(), n, 0.0),
        "veto_seq_frac": (disc.veto_seq.sum(), n_seq, 0.0),
        "clip_low_frac": (clip.clip_low, n, 0.0),
        "clip_high_frac": (clip.clip_high, n, 0.0),
        "dual_clip_frac": (clip.dual, n, 0.0),
        "clip_and_reject_frac": (stopped_n - stopped_kept, n, 0.0),
        "clip_or_reject_frac": (n - kept + stopped_kept, n, 0.0),
        "rd_mean": (rd_m1.sum(), n, 1.0),  # mean(r_d - 1) + 1 (r_d - 1 is 0 where invalid)
        "rs_mean": (rs.sum() - valid.numel(), n, 1.0),  # invalid tokens hold r_s = 1
        "weight_mean": (w_sum, n, 0.0),
        "ess": (w_sum * w_sum, n * _dot(w, w), 0.0),
        "kl_k1": (-log_rd_sum, n, 0.0),
        # sum(expm1(x)) - sum(x): no r_d - 1 cancellation in fp32.
        "kl_k3": (rd_m1.sum() - log_rd_sum, n, 0.0),
    }
    num = torch.stack([t[0] for t in table.values()])
    den = torch.stack([t[1] for t in table.values()])
    # Wherever a denominator is 0 its numerator is 0 too (subsets of an empty set), so 0 / tiny = 0.
    values = num / den.clamp(min=1e-30) + num.new_tensor([t[2] for t in table.values()])

    # Extremes in log space: invalid tokens are pushed 4 * SAFETY_BOUND out of the way; with no
    # valid token the result is multiplied by 0, i.e. a ratio of 1.
    push = valid.mul(-4.0 * SAFETY_BOUND).add_(4.0 * SAFETY_BOUND)  # [B, T]: 80 where invalid, else 0
    tmp = torch.empty_like(push)
    ext = torch.stack([
        torch.add(log_rd, push, out=tmp).amin(), torch.sub(log_rd, push, out=tmp).amax(),
        torch.add(log_rs, push, out=tmp).amin(), torch.sub(log_rs, push, out=tmp).amax(),
    ])
    nonempty = n.clamp(max=1.0)
    ext = (ext * nonempty).exp()
    by_name = dict(zip(table, values.unbind(), strict=True))
    by_name.update(zip(("rd_min", "rd_max", "rs_min", "rs_max"), ext.unbind(), strict=True))
    return CorrectionStats(**{f.name: by_name[f.name].to(torch.float32) for f in fields(CorrectionStats)})
