"""The loss's metrics: values against the loop, documentation table, sign-aware clip counts."""

import math
from dataclasses import FrozenInstanceError, fields

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_correction_loss import run
from test_correction_reference import Case, Config, cases, loop_loss, near_tie

from asyncrl.api.correction import CorrectionSpec
from asyncrl.trainer.correction import METRICS, CorrectionStats, correction_loss, metrics_markdown
from asyncrl.trainer.correction.stats import DERIVED


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(d_d=1.2), mode=st.sampled_from(["mask", "icepop", "truncate", "none"]),
       level=st.sampled_from(["token", "geometric"]), dual=st.sampled_from([None, 1.6]))
def test_metrics_match_loop(case: Case, mode: str, level: str, dual: float | None) -> None:
    cfg = Config(mode=mode, level=level, dual=dual, low=0.7, high=1.5, veto=0.3)
    assume(not near_tie(case, cfg))
    res, _ = run(case, cfg)
    expected = loop_loss(case, cfg).metrics
    got = res.metrics.record()
    assert got.keys() == expected.keys()
    for k in got:
        assert math.isclose(got[k], expected[k], rel_tol=1e-6, abs_tol=1e-6), (k, got[k], expected[k])
    counts = [f.name for f in fields(CorrectionStats) if f.name.endswith(("_tokens", "_seqs"))]
    assert all(got[k] == expected[k] for k in counts)  # counts are exact, not fractions multiplied back


def test_table_and_dataclass_agree() -> None:
    assert [f.name for f in fields(CorrectionStats)] == [m.name for m in METRICS]
    assert all(isinstance(getattr(CorrectionStats, d.name), property) for d in DERIVED)
    for m in METRICS:
        assert m.description and m.denominator == "-", m
    for m in DERIVED:
        assert m.description and m.denominator in ("valid_tokens", "valid_seqs"), m
    doc = metrics_markdown()
    assert "`clip_and_reject_tokens`" in doc and "`clip_and_reject_frac`" in doc
    rows = [r for r in doc.splitlines() if r.startswith("| `")]
    assert len(rows) == len(METRICS) + len(DERIVED)
    for row in rows[: len(METRICS)]:  # pipes inside a cell are escaped: 3 column separators per row
        assert row.replace("\\|", "").count("|") == 3, row
    for row in rows[len(METRICS):]:
        assert row.replace("\\|", "").count("|") == 4, row


def test_record_round_trip_and_empty_values() -> None:
    # An all-masked batch: nothing valid. keep_ratio and the ratio means are 1, other fractions 0.
    z = torch.zeros(2, 3)
    m = correction_loss(z, z, z, torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), CorrectionSpec()).metrics
    rec = m.record()
    assert rec["keep_ratio"] == rec["rd_mean"] == rec["rs_mean"] == 1.0 and rec["clip_low_frac"] == 0.0
    back = CorrectionStats.from_record({**rec, "step": 3})
    assert back == m.to_floats() and back.record() == rec
    with pytest.raises(KeyError, match="missing kept_tokens"):
        CorrectionStats.from_record({k: v for k, v in rec.items() if k != "kept_tokens"})


def test_metrics_are_frozen_0dim_tensors_without_grad() -> None:
    torch.manual_seed(0)
    theta = (-torch.rand(2, 5)).requires_grad_(True)
    res = correction_loss(theta, -torch.rand(2, 5), -torch.rand(2, 5), torch.randn(2), torch.ones(2, 5, dtype=torch.bool),
                          CorrectionSpec())
    assert res.metrics.as_dict(prefix="correction/").keys() == {"correction/" + m.name for m in METRICS}
    for name, v in res.metrics.as_dict(prefix="correction/").items():
        assert name.startswith("correction/") and v.dim() == 0 and v.dtype == torch.float32 and not v.requires_grad
    with pytest.raises(FrozenInstanceError):
        res.metrics.kept_tokens = torch.tensor(0.0)  # type: ignore[misc]


def test_clip_fractions_are_sign_aware_by_hand() -> None:
    # r_s: e^0.5 = 1.65 (above 1.2), e^-0.5 = 0.61 (below 0.8), and 1.0; advantages of both signs.
    #   (r_s 1.65, A +1) clipped high   (r_s 1.65, A -1) not clipped (gradient flows)
    #   (r_s 0.61, A -1) clipped low    (r_s 0.61, A +1) not clipped
    #   (r_s 1.00, A  0) nothing        (r_s 3.0 = e^1.0986, A -1) dual clip c = 2.5
    # 6 valid tokens: clip_high 1/6, clip_low 1/6, dual 1/6. A naive |r_s - 1| > eps count would say 5/6.
    ls = [0.5, 0.5, -0.5, -0.5, 0.0, math.log(3.0)]
    case = Case(theta=[ls], ref=[[0.0] * 6], mu=[[0.0] * 6], adv=[[1.0, -1.0, -1.0, 1.0, 0.0, -1.0]],
                mask=[[True] * 6])
    res, grad = run(case, Config(dual=2.5))
    m = res.metrics
    assert float(m.clip_high_frac) == float(m.clip_low_frac) == float(m.dual_clip_frac) == pytest.approx(1 / 6)
    assert grad[0].ne(0).tolist() == [False, True, False, True, False, False]
    # dual clip value: -c * A = 2.5 for the last token.
    terms = [-1.2, 1.0 * math.exp(0.5), 0.8, -math.exp(-0.5), 0.0, 2.5]
    assert math.isclose(float(res.loss), sum(terms) / 6, rel_tol=1e-14)


def test_clip_reject_overlap_by_hand() -> None:
    # t0: clipped (A 1, r_s e^0.5) and rejected (r_d e^1 > 2); t1: clipped only; t2: rejected only;
    # t3: neither. clip_and_reject = 1/4, clip_or_reject = 3/4.
    case = Case(theta=[[1.5, 0.5, 1.0, 0.0]], ref=[[1.0, 0.0, 1.0, 0.0]], mu=[[0.0] * 4], adv=[[1.0] * 4],
                mask=[[True] * 4])
    m = run(case, Config())[0].metrics
    assert float(m.clip_and_reject_frac) == 0.25 and float(m.clip_or_reject_frac) == 0.75


def test_kl_estimators_by_hand() -> None:
    # log r_d = log(pi_ref / mu) = 0.2 and -0.4: k1 = mean(log mu - log pi_ref) = (-0.2 + 0.4) / 2 = 0.1;
    # k3 = mean(r - 1 - log r) = ((e^0.2 - 1.2) + (e^-0.4 - 0.6)) / 2 = (0.021403 + 0.070320) / 2.
    case = Case(theta=[[0.2, -0.4]], ref=[[0.2, -0.4]], mu=[[0.0, 0.0]], adv=[[1.0, 1.0]], mask=[[True, True]])
    m = run(case, Config())[0].metrics
    assert math.isclose(float(m.kl_k1), 0.1, rel_tol=1e-6)
    assert math.isclose(float(m.kl_k3), ((math.exp(0.2) - 1.2) + (math.exp(-0.4) - 0.6)) / 2, rel_tol=1e-6)


def test_kl_k3_theta_ref_by_hand() -> None:
    # log r_s = log(pi_theta / pi_ref) = 0.3 and -0.1; r = pi_ref / pi_theta = e^-0.3, e^0.1:
    # k3 = mean(r - 1 - log r) = ((e^-0.3 - 1 + 0.3) + (e^0.1 - 1 - 0.1)) / 2 = (0.040818 + 0.005171) / 2.
    case = Case(theta=[[0.3, -0.1]], ref=[[0.0, 0.0]], mu=[[0.0, 0.0]], adv=[[1.0, 1.0]], mask=[[True, True]])
    m = run(case, Config())[0].metrics
    expected = ((math.exp(-0.3) - 0.7) + (math.exp(0.1) - 1.1)) / 2
    assert math.isclose(float(m.kl_k3_theta_ref), expected, rel_tol=1e-6)
    assert float(m.kl_k3) == 0.0  # pi_ref = mu here


def test_kl_k3_precise_in_fp32_for_tiny_discrepancy() -> None:
    # log r_d = 1e-3 on 4096 tokens: k3 = e^x - 1 - x = 5.0017e-7 each. fp32 r_d - 1 would round it
    # to a multiple of 1.19e-7; the expm1 path keeps ~1e-4 relative accuracy.
    x = 1e-3
    n = 4096
    z = torch.zeros(1, n)
    m = correction_loss(z, z + x, z, torch.ones(1), torch.ones(1, n, dtype=torch.bool), CorrectionSpec()).metrics
    expected = math.expm1(x) - x
    assert math.isclose(float(m.kl_k3), expected, rel_tol=1e-3)


def test_ess_by_hand() -> None:
    # icepop weights r_d = e^0.5 and 1 (both in band) and one rejected (0): ESS = (sum w)^2 / (n sum w^2)
    # = (1.6487 + 1)^2 / (3 * (2.7183 + 1)) = 7.0157 / 11.1548 = 0.62894.
    case = Case(theta=[[0.5, 0.0, 2.0]], ref=[[0.5, 0.0, 2.0]], mu=[[0.0] * 3], adv=[[1.0] * 3], mask=[[True] * 3])
    m = run(case, Config(mode="icepop", veto=None))[0].metrics
    w = [math.exp(0.5), 1.0, 0.0]
    assert math.isclose(float(m.ess), sum(w) ** 2 / (3 * sum(v * v for v in w)), rel_tol=1e-6)
