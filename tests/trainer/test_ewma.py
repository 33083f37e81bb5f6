"""The PPO-EWMA controller: bias-corrected EWMA, auto decay, measured window, reset rule, checkpoints."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from asyncrl.api.correction import EwmaResetSpec, EwmaSpec
from asyncrl.trainer.correction import EwmaController


def _params(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, generator=g, dtype=torch.float64), "b": torch.randn(4, generator=g, dtype=torch.float64)}


@settings(max_examples=25, deadline=None)
@given(beta=st.floats(0.05, 0.95), steps=st.integers(1, 8))
def test_bias_corrected_ewma_equals_weighted_average(beta: float, steps: int) -> None:
    # Paper §5.2: theta_prox^(t) = sum_k beta^(t-k) theta^(k) / sum_k beta^(t-k), k = 0..t, where
    # theta^(0) are the weights at init (openai/ppo-ewma: total weight starts at 1).
    ctl = EwmaController(decay=beta, max_staleness=2, reset_enabled=False)
    history = [_params(0)]
    ctl.init(history[0])
    for t in range(1, steps + 1):
        history.append(_params(t))
        report = ctl.update(history[-1], keep_ratio=1.0)
        assert not report.reset and report.decay == beta
    weights = [beta ** (steps - k) for k in range(steps + 1)]
    for name in ("w", "b"):
        expected = torch.stack([w * h[name] for w, h in zip(weights, history, strict=True)]).sum(0) / sum(weights)
        torch.testing.assert_close(ctl.params[name], expected.float(), rtol=1e-6, atol=1e-6)
    assert math.isclose(ctl.total_weight, sum(weights), rel_tol=1e-12)


def test_one_step_by_hand() -> None:
    # beta = 0.5, total 1 -> new_total = 1.5: p = (0.5 * 1 / 1.5) * 2 + 5 / 1.5 = 0.6667 + 3.3333 = 4.
    ctl = EwmaController(decay=0.5, max_staleness=2)
    ctl.init({"p": torch.tensor([2.0])})
    ctl.update({"p": torch.tensor([5.0])})
    assert math.isclose(float(ctl.params["p"]), 4.0, rel_tol=1e-7) and ctl.total_weight == 1.5


@pytest.mark.parametrize(("w", "beta"), [(0, 0.0), (1, 1 / 3), (2, 0.5), (3, 0.6), (6, 0.75)])
def test_auto_decay_from_configured_window(w: int, beta: float) -> None:
    # g = W/2, beta = g / (g + 1) = W / (W + 2): W = 3 -> 3/5 = 0.6; W = 6 -> 6/8 = 0.75 (centre of mass 3 back).
    ctl = EwmaController.from_spec(EwmaSpec(), max_staleness=w)
    assert math.isclose(ctl.decay, beta, rel_tol=1e-15)
    if w > 0:
        assert math.isclose(ctl.decay / (1 - ctl.decay), w / 2, rel_tol=1e-12)


def test_decay_zero_tracks_current_weights() -> None:
    ctl = EwmaController(decay="auto", max_staleness=0)
    ctl.init(_params(0))
    ctl.update(_params(1))
    torch.testing.assert_close(ctl.params["w"], _params(1)["w"].float(), rtol=0, atol=0)


def test_measured_window() -> None:
    ctl = EwmaController.from_spec(EwmaSpec(window="measured"), max_staleness=4)
    assert ctl.decay == 4 / 6  # no observation yet: g = W/2 = 2 -> 2/3, the configured rule
    ctl.observe_staleness(1.0)
    ctl.observe_staleness(torch.tensor(2.0))
    # g = (0.95 * 1 + 2) / (0.95 + 1) = 2.95 / 1.95 = 1.512821; beta = g / (g + 1) = 2.95 / 4.9 = 0.602041
    assert math.isclose(ctl.expected_gap, 2.95 / 1.95, rel_tol=1e-15)
    assert math.isclose(ctl.decay, 2.95 / 4.9, rel_tol=1e-15)
    configured = EwmaController.from_spec(EwmaSpec(), max_staleness=4)
    configured.observe_staleness(1.0)
    assert configured.decay == 4 / 6
    with pytest.raises(ValueError, match="staleness must be a number >= 0"):
        ctl.observe_staleness(float("nan"))


@pytest.mark.parametrize("gap", [0.5, 1.0, 1.7, 3.0])
def test_measured_decay_puts_the_centre_of_mass_at_the_measured_gap(gap: float) -> None:
    # Issue 10: with a constant measured gap m the average's centre of mass sum_k k beta^k / sum_k beta^k
    # = beta / (1 - beta) must be m (beta = m / (m + 1)); the old beta = m / (m + 2) put it at m / 2.
    ctl = EwmaController.from_spec(EwmaSpec(window="measured"), max_staleness=8)
    for _ in range(5):
        ctl.observe_staleness(gap)
    beta = ctl.decay
    assert math.isclose(beta, gap / (gap + 1), rel_tol=1e-12)
    ages = torch.arange(4000, dtype=torch.float64)  # beta^4000 is far below double precision
    weights = beta**ages
    assert math.isclose(float((ages * weights).sum() / weights.sum()), gap, rel_tol=1e-9)
    # The same centre of mass, measured on the controller's own weights: feed theta^(k) = k (a scalar that
    # grows by one per version) for many versions; theta_t - theta_prox is then the centre of mass.
    ctl.init({"p": torch.tensor([0.0], dtype=torch.float64)})
    for k in range(1, 400):
        ctl.update({"p": torch.tensor([float(k)], dtype=torch.float64)})
    assert math.isclose(399.0 - float(ctl.params["p"]), gap, rel_tol=1e-4)


def test_measured_gap_forgets_old_batches() -> None:
    # A run whose staleness drops from 4 to 1: a whole-run mean would stay near (30*4 + 60*1) / 90 = 2;
    # the forgetting window follows: after 60 batches at gap 1 the weight left on the old gap is
    # 0.95^60 = 0.046, so g = 1 + 3 * 0.95^60 * (1 - 0.95^30) / (1 - 0.95^90) = 1.108.
    ctl = EwmaController.from_spec(EwmaSpec(window="measured"), max_staleness=8)
    for _ in range(30):
        ctl.observe_staleness(4.0)
    assert math.isclose(ctl.expected_gap, 4.0, rel_tol=1e-12)
    for _ in range(60):
        ctl.observe_staleness(1.0)
    old = 0.95**60 * (1 - 0.95**30) / (1 - 0.95**90)
    assert math.isclose(ctl.expected_gap, 1.0 + 3.0 * old, rel_tol=1e-9) and ctl.expected_gap < 1.11


def test_state_dict_before_the_forgetting_window_loads() -> None:
    # A checkpoint of the whole-run mean (staleness_sum/count) resumes as one observation of that mean.
    a = EwmaController.from_spec(EwmaSpec(window="measured"), max_staleness=3)
    a.init(_params(0))
    state = {k: v for k, v in a.state_dict().items() if k not in ("gap_sum", "gap_weight")}
    a.load_state_dict({**state, "staleness_sum": 6.0, "staleness_count": 4})
    assert a.expected_gap == 1.5
    a.load_state_dict({**state, "staleness_sum": 0.0, "staleness_count": 0})
    assert a.expected_gap == 1.5  # no observation: W / 2


def test_reset_after_k_consecutive_low_steps() -> None:
    spec = EwmaSpec(decay=0.9, reset=EwmaResetSpec(rule="paper", keep_ratio_below=0.8, consecutive_steps=3))
    ctl = EwmaController.from_spec(spec, max_staleness=2)
    ctl.init(_params(0))
    ratios = [0.9, 0.7, 0.7, 0.95, 0.7, 0.79, torch.tensor(0.5), 0.7]
    reports = [ctl.update(_params(i + 1), keep_ratio=r) for i, r in enumerate(ratios)]
    assert [r.streak for r in reports] == [0, 1, 2, 0, 1, 2, 3, 1]
    assert [r.reset for r in reports] == [False] * 6 + [True, False]
    assert reports[6].reason == "keep_ratio_collapse" and reports[6].decay == 0.0 and reports[6].step == 7
    assert ctl.resets == 1 and ctl.last_reset_reason == "keep_ratio_collapse"
    # Just after the reset, theta_prox was exactly the weights of step 7; step 8 blended one update.
    assert reports[6].total_weight == 1.0 and math.isclose(reports[7].total_weight, 1.9, rel_tol=1e-12)
    expected = (0.9 * 1.0 * _params(7)["w"] + _params(8)["w"]) / 1.9
    torch.testing.assert_close(ctl.params["w"], expected.float(), rtol=1e-6, atol=1e-6)


def test_reset_disabled_and_unobserved_steps() -> None:
    ctl = EwmaController(decay=0.5, max_staleness=2, reset_enabled=False, consecutive_steps=1)
    ctl.init(_params(0))
    assert [ctl.update(_params(1), keep_ratio=0.1).streak for _ in range(3)] == [1, 2, 3]
    assert ctl.resets == 0
    assert ctl.update(_params(1), keep_ratio=None).streak == 3  # not observed: streak kept


def test_manual_reset() -> None:
    ctl = EwmaController(decay=0.5, max_staleness=2)
    ctl.init(_params(0))
    ctl.update(_params(1), keep_ratio=0.1)
    report = ctl.reset(_params(5))
    assert report.reset and report.reason == "manual" and report.streak == 1 and ctl.streak == 0
    torch.testing.assert_close(ctl.params["b"], _params(5)["b"].float(), rtol=0, atol=0)


def test_state_dict_round_trip_continues_identically() -> None:
    a = EwmaController.from_spec(EwmaSpec(window="measured", reset=EwmaResetSpec(rule="paper")), max_staleness=3)
    a.init(_params(0))
    a.observe_staleness(2.0)
    a.update(_params(1), keep_ratio=0.5)
    b = EwmaController.from_spec(EwmaSpec(window="measured", reset=EwmaResetSpec(rule="paper")), max_staleness=3)
    b.load_state_dict(a.state_dict())
    for ctl in (a, b):
        ctl.observe_staleness(1.0)
        ctl.update(_params(2), keep_ratio=0.5)
    assert a.state_dict()["streak"] == b.state_dict()["streak"] == 2
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k])


def test_module_helpers_and_fp32_storage() -> None:
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(2)
    model = nn.Sequential(nn.Linear(3, 2), bn).to(torch.bfloat16)
    ctl = EwmaController(decay=0.5, max_staleness=2)
    ctl.init(model)
    assert ctl.params["0.weight"].dtype == torch.float32
    assert ctl.params["1.num_batches_tracked"].dtype == torch.long  # non-float buffers follow the current value
    before = {k: v.clone() for k, v in ctl.params.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
        assert bn.num_batches_tracked is not None
        bn.num_batches_tracked.fill_(7)
    ctl.update(model)
    # beta 0.5: p_ewma = (0.5 / 1.5) p0 + (p0 + 1) / 1.5 = p0 + 2/3
    torch.testing.assert_close(ctl.params["0.weight"], before["0.weight"] + 2 / 3, rtol=1e-2, atol=1e-2)
    assert int(ctl.params["1.num_batches_tracked"]) == 7
    lin = nn.Linear(3, 2)
    target = nn.Sequential(lin, nn.BatchNorm1d(2)).to(torch.bfloat16)
    ctl.load_into(target)
    assert lin.weight.dtype == torch.bfloat16
    torch.testing.assert_close(lin.weight.float(), ctl.params["0.weight"], rtol=1e-2, atol=1e-2)


def test_parameter_lists() -> None:
    # A list of tensors (e.g. an optimizer's parameters) is keyed "0", "1", ... in order.
    ctl = EwmaController(decay=0.5, max_staleness=2)
    ctl.init([torch.zeros(2), torch.ones(3)])
    ctl.update([torch.full((2,), 3.0), torch.ones(3)])
    assert list(ctl.params) == ["0", "1"] and ctl.params["0"].tolist() == [2.0, 2.0]  # (0.5*0 + 3)/1.5


def test_errors() -> None:
    ctl = EwmaController(decay=0.5, max_staleness=2)
    with pytest.raises(RuntimeError, match="init"):
        ctl.update(_params(0))
    ctl.init(_params(0))
    with pytest.raises(ValueError, match=r"missing \['b'\]"):
        ctl.update({"w": torch.zeros(3, 4)})
    with pytest.raises(ValueError, match=r"w: \(3, 4\) vs \(4, 3\)"):
        ctl.update({"w": torch.zeros(4, 3), "b": torch.zeros(4)})
    with pytest.raises(ValueError, match="decay must be"):
        EwmaController(decay=1.0, max_staleness=2)
