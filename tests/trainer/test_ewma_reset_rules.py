"""The EWMA reset rules (paper, paperCooldown, recentre), the recentre target and the reset outcomes.

Expectations are derived by hand from the rules in trainer/correction/ewma_reset.py's docstring; the
threshold and the target are checked against independent re-computations (explicit weighted sums).
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from asyncrl.api.correction import EwmaResetSpec, EwmaSpec
from asyncrl.trainer.correction import EwmaController
from asyncrl.trainer.correction.ewma_reset import LEVEL_MEMORY, ResetRule, next_batch_versions


def _fires(rule: ResetRule, ratios: list[float]) -> list[int]:
    return [i for i, r in enumerate(ratios) if rule.observe(r).fire]


def test_paper_rule_cascades_every_k_versions_while_low() -> None:
    # tau 0.8, k 3: low from version 0 on -> fires at 2, 5, 8 (the "another exactly k later" cascade).
    rule = ResetRule("paper", keep_ratio_below=0.8, consecutive_steps=3, window=3)
    assert _fires(rule, [0.5] * 9) == [2, 5, 8]


def test_paper_cooldown_does_not_count_the_w_versions_after_a_reset() -> None:
    # W = 5, k = 3, low throughout: fires at 2; versions 3..7 (the W after it) are not counted, 8, 9, 10
    # are: fires at 10, then 18. The soonest next reset is W + k versions later.
    rule = ResetRule("paperCooldown", keep_ratio_below=0.8, consecutive_steps=3, window=5)
    assert _fires(rule, [0.5] * 19) == [2, 10, 18]
    # W = k = 3: the paper's rule fires every 3 versions, the cooldown every 6.
    assert _fires(ResetRule("paperCooldown", window=3), [0.5] * 15) == [2, 8, 14]
    assert _fires(ResetRule("paper", window=3), [0.5] * 15) == [2, 5, 8, 11, 14]


def test_paper_rule_a_high_version_breaks_the_streak() -> None:
    rule = ResetRule("paper", keep_ratio_below=0.8, consecutive_steps=3, window=3)
    assert _fires(rule, [0.7, 0.7, 0.8, 0.7, 0.7, 0.79]) == [5]  # 0.8 is not below 0.8


@settings(max_examples=40, deadline=None)
@given(ratios=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30), window=st.integers(0, 5),
       margin=st.floats(0.01, 0.5))
def test_recentre_threshold_is_the_level_of_earlier_ratios_minus_margin(ratios: list[float], window: int,
                                                                         margin: float) -> None:
    # Independent reference: sum_j m^(t-1-j) x_j / sum_j m^(t-1-j) over the ratios before t, minus margin;
    # none (nan) before W + 1 observations. With k huge the rule never fires, so the level is undisturbed.
    rule = ResetRule("recentre", consecutive_steps=10_000, window=window, margin=margin)
    for t, x in enumerate(ratios):
        step = rule.observe(x)
        if t < window + 1:
            assert math.isnan(step.threshold) and not step.low
            continue
        w = [LEVEL_MEMORY ** (t - 1 - j) for j in range(t)]
        expect = sum(wi * xi for wi, xi in zip(w, ratios[:t], strict=True)) / sum(w) - margin
        assert step.threshold == pytest.approx(expect, rel=1e-12, abs=1e-12)
        assert step.low == (x < step.threshold)


def test_recentre_fires_on_a_drop_below_its_own_level_not_on_a_steady_low_level() -> None:
    # A run whose in-bounds ratio sits steadily at 0.45 (current's level at lr 3e-4) never resets under
    # recentre, where the paper's tau 0.8 would fire every 3 versions.
    steady = [0.45 + 0.02 * (-1) ** i for i in range(30)]
    assert _fires(ResetRule("recentre", window=3), steady) == []
    assert len(_fires(ResetRule("paper", window=3), steady)) == 10
    # A collapse from 0.8 to 0.4 at version 10 fires after 3 low versions (level at 10..12 still ~0.7).
    drop = [0.8] * 10 + [0.4] * 10
    assert _fires(ResetRule("recentre", window=3), drop)[0] == 12


def test_outcome_recovered_when_one_of_the_next_w_versions_clears_the_threshold() -> None:
    rule = ResetRule("paper", keep_ratio_below=0.8, consecutive_steps=1, window=3)
    steps = [rule.observe(x) for x in [0.5, 0.6, 0.7, 0.85, 0.9, 0.9, 0.9]]
    # fires at 0 (pending, 3 versions); 1 and 2 fire too under paper (k = 1). Reset 0 sees 0.6, 0.7, 0.85:
    # recovered, decided at 3; reset 1 sees 0.7, 0.85, 0.9: recovered (4); reset 2 sees 0.85..: recovered (5).
    assert [s.fire for s in steps] == [True, True, True, False, False, False, False]
    assert [s.outcomes for s in steps] == [(), (), (), ("recovered",), ("recovered",), ("recovered",), ()]
    assert (rule.recovered, rule.unrecovered) == (3, 0)


def test_outcome_unrecovered_and_pending_at_the_end() -> None:
    rule = ResetRule("paperCooldown", keep_ratio_below=0.8, consecutive_steps=2, window=3)
    steps = [rule.observe(x) for x in [0.5] * 12]
    # fires at 1; 2..4 not counted; 5, 6 low: fires at 6; 7..9 not counted; fires at 11. Resets 1 and 6 are
    # unrecovered (decided at 4 and 9), reset 11 pending.
    assert [i for i, s in enumerate(steps) if s.fire] == [1, 6, 11]
    assert [(i, s.outcomes) for i, s in enumerate(steps) if s.outcomes] == [(4, ("unrecovered",)), (9, ("unrecovered",))]
    assert (rule.recovered, rule.unrecovered, len(rule.pending)) == (0, 2, 1)


def test_unobserved_versions_run_the_outcome_clock() -> None:
    rule = ResetRule("paper", consecutive_steps=1, window=2)
    assert rule.observe(0.1).fire
    assert rule.observe(None).outcomes == ()
    assert rule.observe(None).outcomes == ("unrecovered",)


def test_rule_state_round_trip() -> None:
    a = ResetRule("recentre", window=2)
    for x in [0.9, 0.9, 0.9, 0.5, 0.5, 0.5, 0.6]:
        a.observe(x)
    b = ResetRule("recentre", window=2)
    b.load_state_dict(a.state_dict())
    assert [a.observe(x) for x in [0.4, 0.95, 0.3]] == [b.observe(x) for x in [0.4, 0.95, 0.3]]


def test_bad_rule_settings() -> None:
    with pytest.raises(ValueError, match="reset rule must be one of"):
        ResetRule("sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="margin must be in"):
        ResetRule("recentre", margin=1.5)


def test_next_batch_versions_shift_one_and_cap_at_current() -> None:
    assert next_batch_versions({4: 10, 6: 5, 7: 3, 5: 0}, current=7) == {5: 10.0, 7: 8.0}


def _w(v: int) -> dict[str, torch.Tensor]:
    # Weights that move a little per version, as training's do (the recentre history keeps bf16 residuals of
    # the EWMA, whose rounding is relative to that movement: trainer/correction/ewma_history.py).
    g = torch.Generator().manual_seed(v)
    return {"w": torch.linspace(-1, 1, 6).reshape(3, 2) + 1e-3 * v + 1e-4 * torch.randn(3, 2, generator=g),
            "n": torch.tensor([v])}


# The stated tolerance of the rebuilt weights at this scale: 2^-8 x (W residuals of at most ~2e-3) plus fp32.
TOL = 2.0 ** -8 * 3 * 2e-3 + 1e-6


def test_controller_recentre_reset_moves_to_the_sampling_versions_and_keeps_w_residuals() -> None:
    spec = EwmaSpec(decay=0.6, reset=EwmaResetSpec(rule="recentre", consecutive_steps=1, margin=0.1))
    ctl = EwmaController.from_spec(spec, max_staleness=2)
    ctl.init(_w(0), version=0)
    for v in range(1, 4):  # ratios 0.9 build the level (W + 1 = 3 observations)
        assert not ctl.update(_w(v), 0.9, version=v, token_versions={v - 1: 4}).reset
    assert ctl.history is not None and sorted(ctl.history.entries) == [2, 3]  # the last W residuals
    assert ctl.history.held(4) == {2, 3, 4}  # a reset at 4 averages versions >= 4 - W (4 itself: live)
    report = ctl.update(_w(4), 0.5, version=4, token_versions={1: 6, 2: 2})  # 0.5 < 0.9 - 0.1
    assert report.reset and report.threshold == pytest.approx(0.8)
    assert ctl.history.entries == {}  # theta_prox is no version's weights after a recentre reset
    # next batch one version younger: {2: 6, 3: 2}
    torch.testing.assert_close(ctl.params["w"], (6 * _w(2)["w"] + 2 * _w(3)["w"]) / 8, rtol=0, atol=TOL)
    assert ctl.total_weight == pytest.approx(1 / (1 - 0.6))
    # the next version blends in with weight 1 - beta, as in the steady state
    ctl.update(_w(5), 0.9, version=5, token_versions={3: 8})
    torch.testing.assert_close(ctl.params["w"], 0.6 * (6 * _w(2)["w"] + 2 * _w(3)["w"]) / 8 + 0.4 * _w(5)["w"],
                               rtol=0, atol=TOL)


def test_controller_recentre_without_token_versions_falls_back_to_current() -> None:
    ctl = EwmaController(decay=0.5, max_staleness=0, rule="recentre", consecutive_steps=1)
    ctl.init(_w(0), version=0)
    ctl.update(_w(1), 0.9, version=1)
    assert ctl.update(_w(2), 0.1, version=2).reset
    torch.testing.assert_close(ctl.params["w"], _w(2)["w"])
    assert ctl.total_weight == 1.0


def test_controller_state_dict_keeps_rule_and_history() -> None:
    spec = EwmaSpec(decay=0.5, reset=EwmaResetSpec(rule="recentre", consecutive_steps=1))
    a = EwmaController.from_spec(spec, max_staleness=1)
    a.init(_w(0), version=0)
    for v, x in enumerate([0.9, 0.9, 0.2], start=1):
        a.update(_w(v), x, version=v, token_versions={v - 1: 3})
    b = EwmaController.from_spec(spec, max_staleness=1)
    b.load_state_dict(a.state_dict())
    assert a.history is not None and b.history is not None
    assert sorted(b.history.entries) == sorted(a.history.entries) and b.rule.state_dict() == a.rule.state_dict()
    ra, rb = (c.update(_w(9), 0.95, version=4, token_versions={3: 1}) for c in (a, b))
    assert ra == rb and torch.equal(a.params["w"], b.params["w"])


def test_spec_rule_and_margin() -> None:
    assert EwmaResetSpec().rule == "recentre"  # the default since issue 36's confirmatory experiment
    assert EwmaResetSpec.model_validate({"rule": "recentre", "margin": 0.05}).margin == 0.05
    with pytest.raises(ValidationError, match="rule"):
        EwmaResetSpec.model_validate({"rule": "often"})
    with pytest.raises(ValidationError, match="margin"):
        EwmaResetSpec.model_validate({"margin": 0.0})
