"""The confirmatory analysis (bench/paper/confirm_report.py) and the page's new statistics (stats.welch, holm,
pearson), against hand-derived values; records at another scale are refused."""

import math
from types import ModuleType

import pytest

from tests.support.helpers import paper_module


@pytest.fixture(scope="module")
def st() -> ModuleType:
    return paper_module("stats")


@pytest.fixture(scope="module")
def cr() -> ModuleType:
    return paper_module("confirm_report")


def test_holm_by_hand(st: ModuleType) -> None:
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04) = 0.06
    assert st.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], abs=1e-15)
    assert st.holm([0.5, 0.9]) == [1.0, 1.0]
    out = st.holm([0.02, math.nan])
    assert out[0] == 0.02 and math.isnan(out[1])  # a NaN is not a member of the family


def test_welch_by_hand(st: ModuleType) -> None:
    # a = 1, 2, 3: mean 2, var 1; b = 2, 4, 6, 8: mean 5, var 20/3. se^2 = 1/3 + 5/3 = 2, t = -3 / sqrt 2;
    # dof = 2^2 / ((1/3)^2 / 2 + (5/3)^2 / 3) = 4 / (1/18 + 25/27) = 216 / 53
    w = st.welch([1, 2, 3], [2, 4, 6, 8])
    assert w.diff == -3.0 and w.t == pytest.approx(-3 / math.sqrt(2), rel=1e-12)
    assert w.dof == pytest.approx(216 / 53, rel=1e-12)
    assert st.t_two_sided_p(w.t, 5) < w.p < st.t_two_sided_p(w.t, 4)  # between the integer dofs around 4.08
    assert w.half_width == pytest.approx(st.t_quantile_975(216 / 53) * math.sqrt(2), rel=1e-9)


def test_pearson_by_hand(st: ModuleType) -> None:
    # deviations (-1, 0, 1) and (-7/3, -1/3, 8/3): r = 5 / sqrt(2 * 114 / 9)
    assert st.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9), rel=1e-12)
    assert math.isnan(st.pearson([1, 2], [3, 4]))


def _rec(curve: dict[int, float], *, lr: float = 3e-4, actor: object = 3e-4, steps: int = 40, arm: str = "exact",
         seed: int = 10, reset_versions: tuple[int, ...] = (), outcomes: dict[int, str] | None = None) -> dict:
    stp = [{"version": v, "in_bounds_ratio": 0.5, **({"ewma_reset": 1} if v in reset_versions else {}),
            **({"ewma_reset_outcome": (outcomes or {})[v]} if v in (outcomes or {}) else {})} for v in range(1, steps + 1)]
    return {"eval_curve": [{"version": v, "success": s} for v, s in curve.items()], "scale": {"steps": steps, "learning_rate": lr},
            "actor_learning_rate": actor, "steps": stp, "arm": arm, "seed": seed, "keep_ratio_mean": 0.5,
            "load_avg_start": [1.0, 1.0, 1.0], "load_avg_end": [1.0, 1.0, 1.0], "wall_s": 30.0}


def test_primary_endpoint_is_the_second_half_mean_minus_v0(cr: ModuleType) -> None:
    # versions >= 20 of 40: (0.5 + 0.6 + 0.7) / 3 - 0.3 = 0.3
    assert cr.endpoint(_rec({0: 0.3, 10: 0.9, 20: 0.5, 30: 0.6, 40: 0.7})) == pytest.approx(0.3, abs=1e-12)


def test_the_test_is_paired_only_when_the_arms_correlate(cr: ModuleType) -> None:
    a = {10: 0.10, 11: 0.20, 12: 0.30, 13: 0.40}
    assert cr.compare(a, {k: v - 0.05 for k, v in a.items()}).name == "paired t"  # r = 1
    anti = {10: 0.40, 11: 0.30, 12: 0.20, 13: 0.10}
    t = cr.compare(a, anti)
    assert t.name == "Welch t" and t.r == pytest.approx(-1.0)


def test_reading_rules(cr: ModuleType) -> None:
    t = cr.Test("Welch t", 0.001, -0.015, 0.017, 0.1, 20.0, 0.9, 12, 12, 0.0)
    assert cr.reading(t, 0.9, +1) == "no effect at this scale"
    wide = cr.Test("Welch t", 0.03, -0.01, 0.07, 1.5, 20.0, 0.15, 12, 12, 0.0)
    assert cr.reading(wide, 0.3, +1) == "not resolved"
    assert cr.reading(wide, 0.01, +1) == "held" and cr.reading(wide, 0.01, -1) == "reversed"


def test_a_record_at_another_learning_rate_is_refused(cr: ModuleType) -> None:
    cr.check_scale(_rec({0: 0.3}), 3e-4, "ok")
    with pytest.raises(cr.ScaleMismatch, match="learning rate"):
        cr.check_scale(_rec({0: 0.3}, lr=1e-4, actor=1e-4), 3e-4, "x")
    with pytest.raises(cr.ScaleMismatch, match="optimizer"):
        cr.check_scale(_rec({0: 0.3}, actor=1e-3), 3e-4, "x")  # the spec said 3e-4, the optimizer ran 1e-3
    with pytest.raises(cr.ScaleMismatch, match="interrupted"):
        bad = _rec({0: 0.3})
        bad["steps"] = bad["steps"][:5]
        cr.check_scale(bad, 3e-4, "x")


def test_reset_events(cr: ModuleType) -> None:
    r = _rec({0: 0.3}, reset_versions=(4, 7, 20), outcomes={7: "unrecovered", 10: "unrecovered", 23: "recovered"})
    assert cr.reset_events(r) == {"resets": 3, "recovered": 1, "unrecovered": 2, "followed": 1}


def test_deviations_name_the_second_campaign_and_its_code(cr: ModuleType, tmp_path) -> None:
    import json

    # seed 16 is not in the first campaign: its recentre run used the bf16-residual history
    runs = {a: {s: _rec({0: 0.3, 20: 0.4}, arm=a, seed=s) for s in (10, 16)} for a in cr.ARMS}
    runs["exact"][16]["load_avg_start"] = [40.0, 1.0, 1.0]
    for a in cr.ARMS:  # staleness 2.5 in every first-campaign run, 3.0 in every second-campaign run
        runs[a][10]["steps"] = [{**s, "staleness_mean": 2.5} for s in runs[a][10]["steps"]]
        runs[a][16]["steps"] = [{**s, "staleness_mean": 3.0} for s in runs[a][16]["steps"]]
    errors = [{"W": 3, "lr": 1e-4, "residuals_bf16": 2e-7, "movement": 1e-4},
              {"W": 3, "lr": 1e-3, "residuals_bf16": 3e-6, "movement": 1e-3},
              {"W": 2, "lr": 1e-3, "residuals_bf16": 9e-6, "movement": 1e-3}]  # another W: not counted
    (tmp_path / "ewma_history_memory.json").write_text(json.dumps({"errors": errors}))
    assert cr.history_error(tmp_path) == pytest.approx((3e-6, 3e-3))  # max of 2e-3 and 3e-3 of a version's movement
    text = cr.deviations(runs, tmp_path)
    assert "2 of the registered 12 (10, 16)" in text and "the registered 12 were not reached" in text
    assert "a second campaign ran the 5 missing runs (seeds 16)" in text
    assert "load average 1.0–40.0" in text  # the second campaign's own load
    assert "mean staleness (versions) 2.50 in the first campaign's runs, 3.00 in the second's" in text
    assert "`ewma_recentre` runs of seeds 16 ran after commit 46ae51f" in text and "3.0e-06" in text and "0.3%" in text
    assert "`ewma_reset_off` runs of seeds 16 ran after commit 5a96c84" in text
    assert cr._load_cell([runs["exact"][10], runs["exact"][16]]) == "1.0 (1.0–40.0)"


def test_deviations_count_only_the_reset_comparisons_own_later_runs(cr: ModuleType, tmp_path) -> None:
    import json

    def reset_rec(seed: int, lr: float, **extra: object) -> dict:
        rec = _rec({0: 0.3, 20: 0.4}, lr=lr, actor=lr, seed=seed)
        return {**rec, "config": {"correction": {"ewma": {"reset": {"rule": "recentre"}}}}, **extra}

    folder = tmp_path / "reset_rules"
    folder.mkdir()
    for name, rec in {"a": reset_rec(10, 1e-4), "b": reset_rec(12, 1e-4), "c": reset_rec(12, 1e-3),
                      "d": reset_rec(12, 3e-4, reused_from="ewma_recentre-s12.json")}.items():
        (folder / f"{name}.json").write_text(json.dumps(rec))
    runs = {a: {10: _rec({0: 0.3, 20: 0.4}, arm=a, seed=10)} for a in cr.ARMS}  # first campaign only
    text = cr.deviations(runs, tmp_path)
    # the reused lr 3e-4 record is the confirmatory arm's first-campaign run: not named as later code
    assert "The reset comparison's own `recentre` runs of seed 12 at lr 1e-4 and 1e-3 ran after commit 46ae51f" in text
    assert "ran seeds 10, 12 (registered: 10, 11, 12; seed 12 in the second campaign)" in text
    assert "second campaign ran the" not in text  # no confirmatory run outside the first campaign


def test_the_default_rule_counts_a_reused_confirmatory_run_once(cr: ModuleType, tmp_path) -> None:
    import json

    arm = _rec({0: 0.3, 20: 0.4}, arm="ewma_recentre", seed=11, reset_versions=(5,), outcomes={8: "recovered"})
    copy = {**arm, "config": {"correction": {"ewma": {"reset": {"rule": "recentre"}}}}, "kind": "reset_rules",
            "reused_from": "ewma_recentre-s11.json"}
    (tmp_path / "reset_rules").mkdir()
    (tmp_path / "reset_rules" / "ewma_recentre-lr3e-4-s11.json").write_text(json.dumps(copy))
    (tmp_path / "confirmatory").mkdir()
    for a in cr.ARMS:
        for seed in (11, 12):
            # endpoints 0.1 and 0.1001 in every arm: H3 = 0 with a narrow CI, so the plan's criterion holds
            rec = arm if (a, seed) == ("ewma_recentre", 11) else _rec({0: 0.3, 20: 0.4 + (seed - 11) / 1e4}, arm=a, seed=seed)
            (tmp_path / "confirmatory" / f"{a}-s{seed}.json").write_text(json.dumps(rec))
    text = cr.default_decision(tmp_path)
    assert "lr 0.0003: recentre recovered 1 of 1 decided resets (1 fired in 2 runs)" in text  # not 2 fired in 3 runs
