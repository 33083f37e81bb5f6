"""Discrepancy levels (sequence, geometric, turn) and the catastrophic veto."""

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_correction_loss import check_against_loop, run
from test_correction_reference import Case, Config, cases, near_tie

SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(case=cases(d_d=0.6), level=st.sampled_from(["sequence", "geometric"]),
       mode=st.sampled_from(["mask", "icepop", "truncate", "none"]), agg=st.sampled_from(["tokenMean", "sequenceMean"]))
def test_sequence_levels_match_loop(case: Case, level: str, mode: str, agg: str) -> None:
    cfg = Config(level=level, mode=mode, agg=agg, low=0.4, high=2.5)
    assume(not near_tie(case, cfg))
    check_against_loop(case, cfg)


@SETTINGS
@given(case=cases(d_d=0.8, max_t=8, segments=True), mode=st.sampled_from(["mask", "icepop", "truncate"]))
def test_turn_level_matches_loop(case: Case, mode: str) -> None:
    cfg = Config(level="turn", mode=mode, low=0.6, high=1.6)
    assume(not near_tie(case, cfg))
    check_against_loop(case, cfg)


def test_sequence_level_product_by_hand() -> None:
    # log r_d per token: 0.5, 0.5, 0.5 -> product e^1.5 = 4.48 > 2: the whole sequence is rejected,
    # although each token (e^0.5 = 1.65) is in band. Row 1: 0.5, -0.5 -> product 1: kept.
    case = Case(theta=[[0.5] * 3, [0.5, -0.5, 0.0]], ref=[[0.5] * 3, [0.5, -0.5, 0.0]], mu=[[0.0] * 3] * 2,
                adv=[[1.0] * 3] * 2, mask=[[True] * 3, [True, True, False]])
    res, grad = run(case, Config(level="sequence"))
    assert grad[0].eq(0).all() and grad[1, :2].ne(0).all()
    assert float(res.metrics.reject_high_frac) == pytest.approx(3 / 5) and float(res.metrics.keep_ratio) == pytest.approx(2 / 5)
    # The token-level ratio summaries are not aggregated: max r_d = e^0.5.
    assert math.isclose(float(res.metrics.rd_max), math.exp(0.5), rel_tol=1e-6)


def test_geometric_level_by_hand() -> None:
    # log r_d = 0.9, 0.1 (masked: 5.0) -> geometric mean e^0.5 = 1.6487; icepop weight 1.6487 on both
    # valid tokens; A = 1, r_s = 1: loss = -(1.6487 + 1.6487) / 2 = -1.6487.
    case = Case(theta=[[0.9, 0.1, 5.0]], ref=[[0.9, 0.1, 5.0]], mu=[[0.0] * 3], adv=[[1.0] * 3],
                mask=[[True, True, False]])
    res, _ = run(case, Config(level="geometric", mode="icepop"))
    assert math.isclose(float(res.loss), -math.exp(0.5), rel_tol=1e-14)


def test_turn_level_by_hand() -> None:
    # segments: turn 0 = t0..t1, tool tokens t2 (-1, masked), turn 1 = t3..t4, t5 valid but outside
    # any turn (keeps its own ratio). log r_d: turn 0 (0.2, 1.0) -> mean 0.6 -> e^0.6 = 1.82 kept;
    # turn 1 (1.0, 0.6) -> mean 0.8 -> e^0.8 = 2.23 > 2 rejected; t5 log r_d 0.3 -> kept.
    lrd = [0.2, 1.0, 0.0, 1.0, 0.6, 0.3]
    case = Case(theta=[lrd], ref=[lrd], mu=[[0.0] * 6], adv=[[1.0] * 6],
                mask=[[True, True, False, True, True, True]], segments=[[0, 0, -1, 1, 1, -1]])
    res, grad = run(case, Config(level="turn", mode="icepop"))
    w = [math.exp(0.6), math.exp(0.6), 0.0, 0.0, 0.0, math.exp(0.3)]
    expected = torch.tensor([[-x / 5 for x in w]], dtype=torch.float64)  # A = 1, r_s = 1, 5 valid tokens
    torch.testing.assert_close(grad, expected, rtol=1e-14, atol=0.0)
    assert float(res.metrics.reject_high_frac) == pytest.approx(2 / 5)


def test_veto_rejects_whole_sequence_in_every_mode_but_none() -> None:
    # Row 0 has one token with r_d = e^-10 = 4.5e-5 < 1e-4: all of row 0 is vetoed (mask, icepop,
    # truncate), even its in-band tokens; row 1 (r_d = 1) is untouched. Mode none ignores the veto.
    case = Case(theta=[[-10.0, 0.0, 0.0], [0.0, 0.0, 0.0]], ref=[[-10.0, 0.0, 0.0], [0.0] * 3],
                mu=[[0.0] * 3] * 2, adv=[[1.0] * 3] * 2, mask=[[True] * 3] * 2)
    for mode in ("mask", "icepop", "truncate"):
        res, grad = run(case, Config(mode=mode, veto=1e-4))
        assert grad[0].eq(0).all() and grad[1].ne(0).all(), mode
        assert float(res.metrics.veto_frac) == 0.5 and float(res.metrics.veto_seq_frac) == 0.5
    res, grad = run(case, Config(mode="none", veto=1e-4))
    assert grad.ne(0).all() and float(res.metrics.veto_frac) == 0.0
    # A masked-out catastrophic token does not veto.
    case.mask[0][0] = False
    res, grad = run(case, Config(mode="mask", veto=1e-4))
    assert grad[0, 1:].ne(0).all() and float(res.metrics.veto_seq_frac) == 0.0


def test_veto_below_the_safety_bound() -> None:
    # veto 1e-10 (log = -23.03) is beyond the clamp (-20): log r_d = -25 must still veto, -22 must not.
    for lrd, vetoed in ((-25.0, True), (-22.0, False)):
        case = Case(theta=[[0.0, 0.0]], ref=[[lrd, 0.0]], mu=[[0.0, 0.0]], adv=[[1.0, 1.0]], mask=[[True, True]])
        res, grad = run(case, Config(mode="truncate", veto=1e-10))
        assert (float(res.metrics.veto_seq_frac) == 1.0) is vetoed
        assert bool(grad[0, 1] == 0) is vetoed
