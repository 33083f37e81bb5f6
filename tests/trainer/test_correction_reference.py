"""A deliberately simple, independent per-token loop implementation of the correction loss.

It reuses nothing from ``asyncrl.trainer.correction``: every token is handled by Python scalars
(``math``) for the metrics and by 0-dim float64 tensors for the loss, so autograd of this loop
is the gradient oracle for the vectorised implementation. Other test modules import
``loop_loss`` from here; the tests at the bottom pin the loop itself on hand-derived values.
"""

import math
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

BOUND = 20.0  # the documented safety bound on log-ratios


@dataclass
class Case:
    """Nested lists ``[B][T]`` of Python floats/bools (advantages per token)."""

    theta: list[list[float]]
    ref: list[list[float]]
    mu: list[list[float]]
    adv: list[list[float]]
    mask: list[list[bool]]
    segments: list[list[int]] | None = None

    def tensors(self, dtype: torch.dtype = torch.float64) -> dict[str, torch.Tensor]:
        t = {
            "logp_theta": torch.tensor(self.theta, dtype=dtype),
            "logp_ref": torch.tensor(self.ref, dtype=dtype),
            "logp_mu": torch.tensor(self.mu, dtype=dtype),
            "advantages": torch.tensor(self.adv, dtype=dtype),
            "loss_mask": torch.tensor(self.mask, dtype=torch.bool),
        }
        if self.segments is not None:
            t["turn_ids"] = torch.tensor(self.segments, dtype=torch.long)
        return t


@dataclass
class Config:
    mode: str = "mask"
    level: str = "token"
    low: float = 0.5
    high: float = 2.0
    veto: float | None = 1e-4
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual: float | None = None
    agg: str = "tokenMean"

    def kwargs(self) -> dict[str, object]:
        return dict(
            mode=self.mode, level=self.level, mask_low=self.low, mask_high=self.high, veto_below=self.veto,
            clip_low=self.clip_low, clip_high=self.clip_high, dual_clip=self.dual, aggregation=self.agg,
        )


@dataclass
class LoopResult:
    loss: torch.Tensor  # 0-dim float64, autograd w.r.t. theta_leaf
    theta_leaf: torch.Tensor  # [B, T] float64 leaf
    metrics: dict[str, float] = field(default_factory=dict)


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _aggregate(case: Case, cfg: Config, valid: list[list[bool]], lrd: list[list[float]]) -> list[list[float]]:
    """Aggregated log r_d per token, one unit at a time."""
    B, T = len(valid), len(valid[0])
    out = [[0.0] * T for _ in range(B)]
    for b in range(B):
        idx = [t for t in range(T) if valid[b][t]]
        if cfg.level == "token":
            for t in idx:
                out[b][t] = lrd[b][t]
        elif cfg.level in ("sequence", "geometric"):
            s = sum(lrd[b][t] for t in idx)
            v = _clamp(s, -BOUND, BOUND) if cfg.level == "sequence" else s / max(len(idx), 1)
            for t in idx:
                out[b][t] = v
        elif cfg.level == "turn":
            assert case.segments is not None
            seg = case.segments[b]
            t = 0
            while t < T:  # walk maximal runs of one id
                end = t
                while end + 1 < T and seg[end + 1] == seg[t]:
                    end += 1
                members = [u for u in range(t, end + 1) if valid[b][u]]
                for u in members:
                    out[b][u] = sum(lrd[b][m] for m in members) / len(members) if seg[t] >= 0 else lrd[b][u]
                t = end + 1
        else:
            raise AssertionError(cfg.level)
    return out


def loop_loss(case: Case, cfg: Config) -> LoopResult:
    B, T = len(case.theta), len(case.theta[0])
    theta_leaf = torch.tensor(case.theta, dtype=torch.float64, requires_grad=True)

    def fin(*xs: float) -> bool:
        return all(math.isfinite(x) for x in xs)

    valid = [[case.mask[b][t] and fin(case.theta[b][t], case.ref[b][t], case.mu[b][t], case.adv[b][t])
              for t in range(T)] for b in range(B)]
    lrd = [[_clamp(case.ref[b][t] - case.mu[b][t], -BOUND, BOUND) if valid[b][t] else 0.0 for t in range(T)]
           for b in range(B)]
    agg = _aggregate(case, cfg, valid, lrd)

    veto_seq = [False] * B
    if cfg.veto is not None and cfg.mode != "none":
        for b in range(B):
            veto_seq[b] = any(valid[b][t] and case.ref[b][t] - case.mu[b][t] < math.log(cfg.veto) for t in range(T))

    terms: list[list[torch.Tensor]] = [[] for _ in range(B)]
    m = {k: 0.0 for k in ("kept", "below", "above", "rej_low", "rej_high", "veto", "clip_low", "clip_high",
                          "dual", "c_and_r", "c_or_r", "w", "w2", "k1", "k3", "k3_theta_ref", "rd", "rs")}
    rds: list[float] = []
    rss: list[float] = []
    for b in range(B):
        for t in range(T):
            if not valid[b][t]:
                continue
            a = case.adv[b][t]
            rd_agg = math.exp(agg[b][t])
            in_band = cfg.low <= rd_agg <= cfg.high
            if cfg.mode == "mask":
                w = 1.0 if in_band else 0.0
            elif cfg.mode == "icepop":
                w = rd_agg if in_band else 0.0
            elif cfg.mode == "truncate":
                w = _clamp(rd_agg, cfg.low, cfg.high)
            else:
                w = 1.0
            if veto_seq[b]:
                w = 0.0
            rejected = (cfg.mode in ("mask", "icepop") and not in_band) or veto_seq[b]

            log_rs = torch.clamp(theta_leaf[b, t] - case.ref[b][t], -BOUND, BOUND)
            rs = torch.exp(log_rs)
            a_t = torch.tensor(a, dtype=torch.float64)
            clipped_rs = torch.clamp(rs, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
            pg = torch.maximum(-a_t * rs, -a_t * clipped_rs)
            dual = False
            if cfg.dual is not None and a < 0:
                pg = torch.minimum(pg, -cfg.dual * a_t)
                dual = float(rs) > cfg.dual
            terms[b].append(w * pg)

            rs_f = float(rs.detach())
            c_lo = a < 0 and rs_f < 1.0 - cfg.clip_low
            c_hi = a > 0 and rs_f > 1.0 + cfg.clip_high
            saturated = abs(case.theta[b][t] - case.ref[b][t]) > BOUND
            clipped = c_lo or c_hi or dual or saturated
            m["kept"] += not rejected
            m["below"] += rd_agg < cfg.low
            m["above"] += rd_agg > cfg.high
            m["rej_low"] += cfg.mode in ("mask", "icepop") and rd_agg < cfg.low
            m["rej_high"] += cfg.mode in ("mask", "icepop") and rd_agg > cfg.high
            m["veto"] += veto_seq[b]
            m["clip_low"] += c_lo
            m["clip_high"] += c_hi
            m["dual"] += dual
            m["c_and_r"] += clipped and rejected
            m["c_or_r"] += clipped or rejected
            m["w"] += w
            m["w2"] += w * w
            rd_tok = math.exp(lrd[b][t])
            m["k1"] += -lrd[b][t]
            m["k3"] += rd_tok - 1.0 - lrd[b][t]
            lrs = float(log_rs.detach())
            m["k3_theta_ref"] += math.exp(-lrs) - 1.0 + lrs  # r = pi_ref / pi_theta: r - 1 - log r
            rds.append(rd_tok)
            rss.append(rs_f)

    n = sum(len(x) for x in terms)
    n_seqs = sum(1 for x in terms if x)
    zero = theta_leaf.sum() * 0.0  # keeps the graph for the empty batch
    if cfg.agg == "tokenMean":
        loss = sum((term for row in terms for term in row), zero) / max(n, 1)
    else:
        loss = sum((sum(row, zero) / len(row) for row in terms if row), zero) / max(n_seqs, 1)

    def frac(x: float, den: float) -> float:
        return x / den if den else 0.0

    metrics = {
        "valid_tokens": float(n),
        "valid_seqs": float(n_seqs),
        "nonfinite_tokens": float(sum(case.mask[b][t] and not valid[b][t] for b in range(B) for t in range(T))),
        "keep_ratio": frac(m["kept"], n) if n else 1.0,
        "reject_low_frac": frac(m["rej_low"], n),
        "reject_high_frac": frac(m["rej_high"], n),
        "rd_below_frac": frac(m["below"], n),
        "rd_above_frac": frac(m["above"], n),
        "veto_frac": frac(m["veto"], n),
        "veto_seq_frac": frac(sum(veto_seq), n_seqs),
        "clip_low_frac": frac(m["clip_low"], n),
        "clip_high_frac": frac(m["clip_high"], n),
        "dual_clip_frac": frac(m["dual"], n),
        "clip_and_reject_frac": frac(m["c_and_r"], n),
        "clip_or_reject_frac": frac(m["c_or_r"], n),
        "rd_mean": sum(rds) / n if n else 1.0,
        "rd_min": min(rds, default=1.0),
        "rd_max": max(rds, default=1.0),
        "rs_mean": sum(rss) / n if n else 1.0,
        "rs_min": min(rss, default=1.0),
        "rs_max": max(rss, default=1.0),
        "weight_mean": frac(m["w"], n),
        "ess": m["w"] ** 2 / (n * m["w2"]) if n and m["w2"] else 0.0,
        "kl_k1": frac(m["k1"], n),
        "kl_k3": frac(m["k3"], n),
        "kl_k3_theta_ref": frac(m["k3_theta_ref"], n),
        # the counts and sums the record carries (the fractions above are derived from them)
        "kept_tokens": m["kept"], "reject_low_tokens": m["rej_low"], "reject_high_tokens": m["rej_high"],
        "rd_below_tokens": m["below"], "rd_above_tokens": m["above"], "veto_tokens": m["veto"],
        "veto_seqs": float(sum(veto_seq)), "clip_low_tokens": m["clip_low"],
        "clip_high_tokens": m["clip_high"], "dual_clip_tokens": m["dual"], "clip_and_reject_tokens": m["c_and_r"],
        "clip_or_reject_tokens": m["c_or_r"], "rd_sum": sum(rds), "rs_sum": sum(rss), "weight_sum": m["w"],
        "weight_sq_sum": m["w2"], "kl_k1_sum": m["k1"], "kl_k3_sum": m["k3"],
        "kl_k3_theta_ref_sum": m["k3_theta_ref"],
    }
    return LoopResult(loss=loss, theta_leaf=theta_leaf, metrics=metrics)


# --- hypothesis strategies shared by the correction tests ------------------------------------------


@st.composite
def cases(
    draw: st.DrawFn, *, max_b: int = 3, max_t: int = 6, d_d: float = 1.5, d_s: float = 0.8, segments: bool = False
) -> Case:
    """Random batches: ``log mu`` in [-6, 0], ``log r_d`` in [-d_d, d_d], ``log r_s`` in [-d_s, d_s],
    advantages in [-2, 2] with exact zeros, random masks (some rows empty), optional turn ids."""
    B = draw(st.integers(1, max_b))
    T = draw(st.integers(1, max_t))
    fl = st.floats  # finite, no subnormals

    def grid(lo: float, hi: float) -> list[list[float]]:
        row = st.lists(fl(lo, hi, allow_subnormal=False), min_size=T, max_size=T)
        return draw(st.lists(row, min_size=B, max_size=B))

    mu = grid(-6.0, 0.0)
    ld = grid(-d_d, d_d)
    ls = grid(-d_s, d_s)
    ref = [[mu[b][t] + ld[b][t] for t in range(T)] for b in range(B)]
    theta = [[ref[b][t] + ls[b][t] for t in range(T)] for b in range(B)]
    adv_val = st.one_of(st.just(0.0), fl(-2.0, 2.0, allow_subnormal=False))
    adv = draw(st.lists(st.lists(adv_val, min_size=T, max_size=T), min_size=B, max_size=B))
    mask = draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B, max_size=B))
    segs = None
    if segments:
        segs = draw(st.lists(st.lists(st.integers(-1, 2), min_size=T, max_size=T), min_size=B, max_size=B))
    return Case(theta=theta, ref=ref, mu=mu, adv=adv, mask=mask, segments=segs)


def near_tie(case: Case, cfg: Config, eps: float = 1e-7) -> bool:
    """True if a ratio sits within ``eps`` (relative) of a bound, where max/min and the
    indicators could disagree by rounding; tests skip such draws."""
    bounds_s = [1.0 - cfg.clip_low, 1.0 + cfg.clip_high] + ([cfg.dual] if cfg.dual else [])
    bounds_d = [cfg.low, cfg.high]
    for b, row in enumerate(case.theta):
        for t in range(len(row)):
            rs = math.exp(case.theta[b][t] - case.ref[b][t])
            rd = math.exp(case.ref[b][t] - case.mu[b][t])
            if any(abs(rs / x - 1.0) < eps for x in bounds_s) or any(abs(rd / x - 1.0) < eps for x in bounds_d):
                return True
    if cfg.level != "token":  # aggregated ratios: check them too (cheap upper bound: any unit mean)
        return _aggregated_near_tie(case, cfg, eps)
    return False


def _aggregated_near_tie(case: Case, cfg: Config, eps: float) -> bool:
    B, T = len(case.theta), len(case.theta[0])
    valid = [[case.mask[b][t] for t in range(T)] for b in range(B)]
    lrd = [[case.ref[b][t] - case.mu[b][t] if valid[b][t] else 0.0 for t in range(T)] for b in range(B)]
    agg = _aggregate(case, cfg, valid, lrd)
    return any(abs(math.exp(agg[b][t]) / x - 1.0) < eps
               for b in range(B) for t in range(T) if valid[b][t] for x in (cfg.low, cfg.high))


# --- the loop itself, on values derived by hand ----------------------------------------------------


def test_loop_single_token_unclipped() -> None:
    # r_s = e^0.1 = 1.10517 (inside [0.8, 1.2]), A = 2 -> pg = -2 * 1.10517 = -2.21034;
    # r_d = e^0 = 1 kept with w = 1; one valid token: loss = pg, d loss / d theta = -A r_s.
    case = Case(theta=[[0.1]], ref=[[0.0]], mu=[[0.0]], adv=[[2.0]], mask=[[True]])
    res = loop_loss(case, Config())
    res.loss.backward()
    assert math.isclose(float(res.loss), -2.0 * math.exp(0.1), rel_tol=1e-14)
    assert res.theta_leaf.grad is not None
    assert math.isclose(float(res.theta_leaf.grad[0, 0]), -2.0 * math.exp(0.1), rel_tol=1e-14)


def test_loop_clip_and_mask_by_hand() -> None:
    # token 0: r_s = e^0.5 = 1.6487 > 1.2 with A = 1 > 0 -> clipped: pg = -1.2, no gradient.
    # token 1: r_d = e^(-1) = 0.3679 < 0.5 -> rejected (w = 0).
    # token 2: r_s = e^(-0.5) = 0.6065 < 0.8 with A = 1 > 0 -> not clipped: pg = -0.6065.
    # tokenMean over 3 valid tokens: (-1.2 + 0 - 0.60653) / 3 = -0.602177.
    case = Case(theta=[[0.5, -1.0, -0.5]], ref=[[0.0, -1.0, 0.0]], mu=[[0.0, 0.0, 0.0]],
                adv=[[1.0, 1.0, 1.0]], mask=[[True, True, True]])
    res = loop_loss(case, Config())
    res.loss.backward()
    assert math.isclose(float(res.loss), (-1.2 - math.exp(-0.5)) / 3, rel_tol=1e-14)
    assert res.theta_leaf.grad is not None
    g = res.theta_leaf.grad.tolist()[0]
    assert g[:2] == [0.0, 0.0] and math.isclose(g[2], -math.exp(-0.5) / 3, rel_tol=1e-14)
    assert res.metrics["clip_high_frac"] == 1 / 3 and res.metrics["reject_low_frac"] == 1 / 3
