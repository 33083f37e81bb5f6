"""``--quick`` of bench/paper/gaps.py and bench/paper/external.py end to end (slow): real actor, real engines,
the driver's loop; each writes its records, and its docs section comes from those records alone."""

import json
from pathlib import Path

import pytest

from tests.support.helpers import paper_module


@pytest.mark.slow
def test_gaps_quick_measures_each_source_and_renders_from_records(tmp_path: Path) -> None:
    gaps = paper_module("gaps")
    data = tmp_path / "data"
    rc = gaps.main(["--quick", "--sources", "fp32", "bf16", "int8", "noise-0.05", "--rl-steps", "2",
                    "--data", str(data), "--out", str(tmp_path / "out")])
    assert rc == 0
    rec = {p.stem: json.loads(p.read_text()) for p in (data / "gaps").glob("*.json")}
    assert set(rec) == {"measure-fp32", "measure-bf16", "measure-int8", "measure-noise-0.05", "rl-fp32-s0", "rl-bf16-s0"}
    q = {k[len("measure-"):]: r["abs_log_rd"] for k, r in rec.items() if k.startswith("measure-")}
    for s, v in q.items():
        assert rec[f"measure-{s}"]["tokens"] > 0 and v["p50"] <= v["p99"] <= v["max"], s
    # fp32 engine vs fp32 actor: kernel order only (measured ~1e-7); bf16 rounds (~1e-3): orders apart
    assert q["fp32"]["mean"] < 1e-5 < q["bf16"]["mean"]
    assert q["bf16"]["mean"] < q["noise-0.05"]["mean"]  # sigma 0.05 on every logit is larger than bf16 rounding
    assert rec["measure-noise-0.05"]["synthetic"] and not rec["measure-bf16"]["synthetic"]
    for k in ("rl-fp32-s0", "rl-bf16-s0"):
        r = rec[k]
        assert r["config"]["correction"]["mask"]["bounds"] == {"low": 0.99, "high": 1.01}
        assert len(r["steps"]) == 2 and 0.0 <= r["keep_ratio_min"] <= r["keep_ratio_mean"] <= 1.0
        assert r["wall_s"] > 0 and len(r["load_avg"]) == 3
    first = gaps.section(data)
    assert first == gaps.section(data)  # from the records alone: the same text twice
    assert "| bf16 |" in first and "noise-0.05 (synthetic)" in first
    assert [p.name for p in gaps.figures(data, tmp_path / "fig")] == ["gaps_logrd.png", "gaps_keep.png"]


@pytest.mark.slow
def test_external_quick_runs_the_methods_and_renders_from_records(tmp_path: Path) -> None:
    external = paper_module("external")
    data = tmp_path / "data"
    rc = external.main(["--quick", "--methods", "sync", "exact", "--data", str(data), "--out", str(tmp_path / "out")])
    assert rc == 0
    runs = external.records(data)
    assert list(runs) == ["sync", "exact"] and all(len(v) == 1 for v in runs.values())
    for name, (r,) in runs.items():
        assert r["config"]["task"]["environment"] == "asyncrl.rollout.envs.reasoning_gym_task:ReasoningGymEnv"
        assert r["config"]["correction"]["clip"] == {"low": 0.003, "high": 0.004}
        assert r["config"]["async"]["maxStaleness"] == (0 if name == "sync" else 3)
        assert [c["version"] for c in r["eval_curve"]] == [0, 1, 2]  # eval every version at quick scale
        assert all(0.0 <= c["success"] <= 1.0 for c in r["eval_curve"])
    text = external.section(data)
    assert text == external.section(data)
    assert "| sync | 1 |" in text and "| exact | 1 |" in text


def test_the_statistics_of_the_sections() -> None:
    external = paper_module("external")
    # [1, 3]: mean 2, sd sqrt(2), half-width t(0.975, 1) * sqrt(2) / sqrt(2) = 12.706
    assert external.mean_ci([1.0, 3.0]) == (2.0, pytest.approx(12.706, abs=1e-12), 2)
    # the table's own critical values give p = 0.05 back (df 1 and 4), t = 0 gives 1
    assert external.t_two_sided_p(12.706, 1) == pytest.approx(0.05, abs=1e-5)
    assert external.t_two_sided_p(2.776, 4) == pytest.approx(0.05, abs=1e-4)
    assert external.t_two_sided_p(0.0, 3) == 1.0
    # differences 0.1, 0.2, 0.3 (seed 9 unpaired): mean 0.2, sd 0.1, t = 0.2 / (0.1 / sqrt 3) = 3.464, df 2
    d, p, n = external.paired({0: 0.5, 1: 0.6, 2: 0.7, 9: 1.0}, {0: 0.4, 1: 0.4, 2: 0.4})
    assert (round(d, 12), n) == (0.2, 3) and p == pytest.approx(external.t_two_sided_p(0.2 / (0.1 / 3**0.5), 2))
    assert 0.07 < p < 0.08  # t(0.975, 2) = 4.303 > 3.464 > t(0.95, 2) = 2.920
    gaps = paper_module("gaps")
    # 1..100 with linear interpolation: p50 = 50.5, p99 = 99.01
    q = gaps.quantiles([float(i) for i in range(1, 101)])
    assert (q["mean"], q["p50"], q["max"]) == (50.5, 50.5, 100.0) and q["p99"] == pytest.approx(99.01, abs=1e-9)
