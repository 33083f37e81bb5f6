"""The correction loss against the independent loop (values and gradients), plus its edge cases."""

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_correction_reference import Case, Config, cases, loop_loss, near_tie

from asyncrl.api.correction import ClipSpec, CorrectionSpec, MaskSpec
from asyncrl.trainer.correction import correction_loss, decoupled_pg_loss

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODES = st.sampled_from(["mask", "icepop", "truncate", "none"])
AGGS = st.sampled_from(["tokenMean", "sequenceMean"])


def run(case: Case, cfg: Config, dtype: torch.dtype = torch.float64):
    t = case.tensors(dtype)
    theta = t.pop("logp_theta").requires_grad_(True)
    res = decoupled_pg_loss(theta, **t, **cfg.kwargs())
    res.loss.backward()
    assert theta.grad is not None
    return res, theta.grad


def check_against_loop(case: Case, cfg: Config) -> None:
    res, grad = run(case, cfg)
    ref = loop_loss(case, cfg)
    ref.loss.backward()
    assert ref.theta_leaf.grad is not None
    torch.testing.assert_close(res.loss, ref.loss.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad, ref.theta_leaf.grad, rtol=1e-12, atol=1e-14)


@SETTINGS
@given(case=cases(), mode=MODES, agg=AGGS, dual=st.sampled_from([None, 1.5, 3.0]),
       clip=st.tuples(st.sampled_from([0.1, 0.2, 0.28]), st.sampled_from([0.2, 0.28, 1.0])))
def test_token_level_matches_loop(case: Case, mode: str, agg: str, dual: float | None, clip: tuple[float, float]) -> None:
    cfg = Config(mode=mode, agg=agg, dual=dual, clip_low=clip[0], clip_high=clip[1], low=0.6, high=1.7)
    assume(not near_tie(case, cfg))
    check_against_loop(case, cfg)


@SETTINGS
@given(case=cases(d_d=12.0), mode=MODES)
def test_veto_matches_loop(case: Case, mode: str) -> None:
    # Wide log r_d so that some tokens fall below the veto (log 1e-4 = -9.21).
    cfg = Config(mode=mode, veto=1e-4)
    assume(not near_tie(case, cfg))
    check_against_loop(case, cfg)


def test_gradient_paths_by_hand() -> None:
    # One sequence, tokenMean over 5 valid tokens (the 6th is masked out by loss_mask):
    #   t0 kept, unclipped (A = 1, r_s = e^0.1)        -> grad = -1 * e^0.1 / 5
    #   t1 clipped above  (A = 1, r_s = e^0.5 > 1.2)   -> grad 0
    #   t2 clipped below  (A = -1, r_s = e^-0.5 < 0.8) -> grad 0
    #   t3 rejected       (r_d = e^-1 < 0.5)           -> grad 0
    #   t4 kept, unclipped on the other side (A = -1, r_s = e^0.5) -> grad = +1 * e^0.5 / 5
    #   t5 loss_mask False                              -> grad 0
    mu = [0.0] * 6
    ref = [0.0, 0.0, 0.0, -1.0, 0.0, 0.0]
    theta = [0.1, 0.5, -0.5, -1.0, 0.5, 3.0]
    case = Case(theta=[theta], ref=[ref], mu=[mu], adv=[[1.0, 1.0, -1.0, 1.0, -1.0, 1.0]],
                mask=[[True] * 5 + [False]])
    _, grad = run(case, Config())
    expected = [-math.exp(0.1) / 5, 0.0, 0.0, 0.0, math.exp(0.5) / 5, 0.0]
    torch.testing.assert_close(grad, torch.tensor([expected], dtype=torch.float64), rtol=1e-14, atol=0.0)
    assert grad[0, 1:4].eq(0).all() and grad[0, 5] == 0  # exactly zero, not tiny


def test_icepop_gradient_carries_rd() -> None:
    # icepop: w = r_d = e^0.3 (in [0.5, 2]); A = 1, r_s = e^0.1 -> grad = -e^0.3 * e^0.1 (one token).
    case = Case(theta=[[0.4]], ref=[[0.3]], mu=[[0.0]], adv=[[1.0]], mask=[[True]])
    res, grad = run(case, Config(mode="icepop"))
    assert math.isclose(float(grad), -math.exp(0.3) * math.exp(0.1), rel_tol=1e-14)
    assert math.isclose(float(res.loss), -math.exp(0.3) * math.exp(0.1), rel_tol=1e-14)


def test_token_mean_denominator_counts_rejected_tokens() -> None:
    # 4 valid tokens, 3 rejected by the mask (r_d = e^2 > 2): the kept token's gradient is divided
    # by 4 (valid before the mask), not by 1: -A * r_s / 4 = -1 * 1 / 4.
    case = Case(theta=[[2.0, 2.0, 2.0, 0.0]], ref=[[2.0, 2.0, 2.0, 0.0]], mu=[[0.0] * 4],
                adv=[[1.0] * 4], mask=[[True] * 4])
    res, grad = run(case, Config(veto=None))
    assert grad.tolist() == [[0.0, 0.0, 0.0, -0.25]]
    assert float(res.loss) == -0.25
    assert float(res.metrics.keep_ratio) == 0.25


def test_sequence_mean_by_hand() -> None:
    # row 0: two valid tokens with pg = -1 (r_s = 1, A = 1) -> mean -1; row 1: one token pg = -2
    # (A = 2) -> mean -2; row 2: no valid token (not counted). Loss = (-1 - 2) / 2 = -1.5.
    # Gradients: row 0 tokens -1 / (2 * 2) = -0.25; row 1 token -2 / (1 * 2) = -1.
    case = Case(theta=[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], ref=[[0.0] * 2] * 3, mu=[[0.0] * 2] * 3,
                adv=[[1.0, 1.0], [2.0, 2.0], [1.0, 1.0]], mask=[[True, True], [True, False], [False, False]])
    res, grad = run(case, Config(agg="sequenceMean"))
    assert float(res.loss) == -1.5
    assert grad.tolist() == [[-0.25, -0.25], [-1.0, 0.0], [0.0, 0.0]]


def test_empty_batch_gives_zero_loss_with_grad() -> None:
    for agg in ("tokenMean", "sequenceMean"):
        case = Case(theta=[[0.3, -0.2]], ref=[[0.0, 0.0]], mu=[[0.0, 0.0]], adv=[[1.0, -1.0]], mask=[[False, False]])
        res, grad = run(case, Config(agg=agg))
        assert res.loss.requires_grad and float(res.loss) == 0.0
        assert grad.eq(0).all()
        m = res.metrics
        assert float(m.valid_tokens) == 0 and float(m.keep_ratio) == 1.0 and float(m.rd_mean) == 1.0
        assert all(math.isfinite(float(v)) for v in m.as_dict().values())


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["logp_theta", "logp_ref", "logp_mu", "advantages"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nonfinite_inputs_are_masked_and_counted(bad: float, where: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    B, T = 3, 5
    t = {
        "logp_theta": -torch.rand(B, T, dtype=dtype),
        "logp_ref": -torch.rand(B, T, dtype=dtype),
        "logp_mu": -torch.rand(B, T, dtype=dtype),
        "advantages": torch.randn(B, T, dtype=dtype),
        "loss_mask": torch.ones(B, T, dtype=torch.bool),
    }
    t["loss_mask"][2, 4] = False
    clean = {k: v.clone() for k, v in t.items()}
    t[where][0, 1] = bad
    t[where][1, 3] = bad
    t[where][2, 4] = bad  # already outside loss_mask: not counted
    theta = t.pop("logp_theta").requires_grad_(True)
    res = correction_loss(theta, **t, spec=CorrectionSpec())
    res.loss.backward()
    assert theta.grad is not None and theta.grad.isfinite().all() and res.loss.isfinite()
    assert theta.grad[0, 1] == 0 and theta.grad[1, 3] == 0
    assert float(res.metrics.nonfinite_tokens) == 2 and float(res.metrics.valid_tokens) == 12  # 15 - 1 masked - 2 non-finite
    assert all(math.isfinite(float(v)) for v in res.metrics.as_dict().values())
    # Same as dropping those tokens through loss_mask.
    clean["loss_mask"][0, 1] = clean["loss_mask"][1, 3] = False
    clean_theta = clean.pop("logp_theta").requires_grad_(True)
    expected = correction_loss(clean_theta, **clean, spec=CorrectionSpec())
    expected.loss.backward()
    torch.testing.assert_close(res.loss, expected.loss, rtol=0, atol=0)
    torch.testing.assert_close(theta.grad, clean_theta.grad, rtol=0, atol=0)


def test_safety_bound_stops_gradient() -> None:
    # log r_s = 25 > 20 with A = -1 (no dual clip): the ratio is clamped to e^20 and the token's
    # gradient is 0, as autograd of exp(clamp(.)) gives; the loss stays finite.
    case = Case(theta=[[25.0, 0.0]], ref=[[0.0, 0.0]], mu=[[0.0, 0.0]], adv=[[-1.0, -1.0]], mask=[[True, True]])
    res, grad = run(case, Config())
    assert grad[0, 0] == 0 and float(grad[0, 1]) == 0.5
    assert math.isclose(float(res.loss), (math.exp(20.0) + 1.0) / 2, rel_tol=1e-14)
    check_against_loop(case, Config())


def test_advantages_per_sequence_broadcast() -> None:
    torch.manual_seed(1)
    B, T = 3, 7
    lp = [-torch.rand(B, T, dtype=torch.float64) for _ in range(3)]
    adv = torch.randn(B, dtype=torch.float64)
    mask = torch.rand(B, T) < 0.8
    a = correction_loss(lp[0], lp[1], lp[2], adv, mask, CorrectionSpec())
    b = correction_loss(lp[0], lp[1], lp[2], adv.unsqueeze(-1).expand(B, T), mask, CorrectionSpec())
    torch.testing.assert_close(a.loss, b.loss, rtol=0, atol=0)
    torch.testing.assert_close(a.metrics.as_dict(), b.metrics.as_dict(), rtol=0, atol=0)


def test_spec_adapter_and_constants_detached() -> None:
    torch.manual_seed(2)
    B, T = 2, 9
    theta = (-torch.rand(B, T)).requires_grad_(True)
    ref = (-torch.rand(B, T)).requires_grad_(True)
    mu = (-torch.rand(B, T)).requires_grad_(True)
    adv = torch.randn(B, T)
    mask = torch.ones(B, T, dtype=torch.bool)
    spec = CorrectionSpec(mask=MaskSpec(mode="icepop", bounds={"factor": 3.0}), clip=ClipSpec(low=0.1, high=0.3, dual_clip=2.0),
                          loss_aggregation="sequenceMean")
    res = correction_loss(theta, ref, mu, adv, mask, spec)
    direct = decoupled_pg_loss(theta, ref, mu, adv, mask, mode="icepop", level="token", mask_low=1 / 3,
                               mask_high=3.0, veto_below=1e-4, clip_low=0.1, clip_high=0.3, dual_clip=2.0,
                               aggregation="sequenceMean")
    torch.testing.assert_close(res.loss, direct.loss, rtol=0, atol=0)
    res.loss.backward()
    assert theta.grad is not None and ref.grad is None and mu.grad is None


def test_low_precision_inputs() -> None:
    # bf16 log-probs are upcast before subtracting; the gradient comes back in bf16.
    torch.manual_seed(3)
    B, T = 2, 16
    mu = -torch.rand(B, T)
    ref = mu + 0.05 * torch.randn(B, T)
    theta32 = ref + 0.05 * torch.randn(B, T)
    theta = theta32.to(torch.bfloat16).requires_grad_(True)
    adv, mask = torch.randn(B), torch.ones(B, T, dtype=torch.bool)
    res = correction_loss(theta, ref.to(torch.bfloat16), mu.to(torch.bfloat16), adv, mask, CorrectionSpec())
    res.loss.backward()
    assert res.loss.dtype == torch.float32 and theta.grad is not None and theta.grad.dtype == torch.bfloat16


def test_shape_and_type_errors_print_shapes() -> None:
    B, T = 2, 3
    ok = dict(logp_theta=torch.zeros(B, T), logp_ref=torch.zeros(B, T), logp_mu=torch.zeros(B, T),
              advantages=torch.zeros(B), loss_mask=torch.ones(B, T, dtype=torch.bool))
    spec = CorrectionSpec()
    with pytest.raises(ValueError, match=r"logp_mu \(2, 4\).*logp_theta \(2, 3\)|logp_theta \(2, 3\).*logp_mu \(2, 4\)"):
        correction_loss(**{**ok, "logp_mu": torch.zeros(B, 4)}, spec=spec)
    with pytest.raises(ValueError, match=r"advantages \(3,\)"):
        correction_loss(**{**ok, "advantages": torch.zeros(3)}, spec=spec)
    with pytest.raises(ValueError, match=r"\[B, T\]; got shape \(6,\)"):
        correction_loss(**{**ok, "logp_theta": torch.zeros(6)}, spec=spec)
    with pytest.raises(TypeError, match="loss_mask must be bool"):
        correction_loss(**{**ok, "loss_mask": torch.ones(B, T)}, spec=spec)
    with pytest.raises(ValueError, match="turn_ids"):
        correction_loss(**ok, spec=CorrectionSpec(mask=MaskSpec(level="turn")))


def test_bad_scalars_are_reported_together() -> None:
    z = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"0 < low < 1 < high; got low=1.2.*dual_clip must be > 1"):
        decoupled_pg_loss(z, z, z, z, torch.ones(1, 2, dtype=torch.bool), mode="mask", level="token", mask_low=1.2,
                          mask_high=2.0, veto_below=None, clip_low=0.2, clip_high=0.2, dual_clip=0.5,
                          aggregation="tokenMean")


def test_registry_errors_list_valid_keys() -> None:
    B, T = 1, 2
    args = [torch.zeros(B, T)] * 4 + [torch.ones(B, T, dtype=torch.bool)]
    kw = dict(level="token", mask_low=0.5, mask_high=2.0, veto_below=None, clip_low=0.2, clip_high=0.2,
              dual_clip=None, aggregation="tokenMean")
    with pytest.raises(ValueError, match="unknown mask.mode 'tis'; valid: mask, icepop, truncate, none"):
        decoupled_pg_loss(*args, mode="tis", **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown mask.level 'segment'; valid: token, sequence, geometric, turn"):
        decoupled_pg_loss(*args, mode="mask", **{**kw, "level": "segment"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown loss_aggregation 'sum'; valid: tokenMean, sequenceMean"):
        decoupled_pg_loss(*args, mode="mask", **{**kw, "aggregation": "sum"})  # type: ignore[arg-type]
