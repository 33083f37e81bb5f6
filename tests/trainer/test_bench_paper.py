"""bench/paper/: the harness's arithmetic on hand-made curves, the seed statistics against hand-derived values,
the record's derived fields, and Proposition 1's exact per-token check on one batch (fast); and every
experiment in its ``--quick`` form (slow): each writes its records and renders its section. No timing or
learning outcome is asserted: the quick scale is a smoke test."""

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.helpers import ROOT, paper_module

PAPER = ROOT / "bench" / "paper"
EXPERIMENTS = ("methods", "ewma", "thresholds", "prop1", "system_cost")




harness, stats, records = paper_module("harness"), paper_module("stats"), paper_module("records")


def test_curve_metrics_by_hand() -> None:
    curve = [{"version": 0, "success": 0.2, "loop_s": 0.0}, {"version": 10, "success": 0.4, "loop_s": 5.0},
             {"version": 20, "success": 0.8, "loop_s": 11.0}]
    m = harness.eval_metrics(curve, level=0.4)
    # trapezoid: (10 * 0.3 + 10 * 0.6) / 20 = 0.45
    assert m == {"final": 0.8, "auc": pytest.approx(0.45), "versions_to_level": 10.0, "seconds_to_level": 5.0}
    never = harness.eval_metrics(curve, level=0.9)
    assert math.isnan(never["versions_to_level"]) and math.isnan(never["seconds_to_level"])


def test_student_t_against_tables() -> None:
    # Printed t tables: t_{0.975}(4) = 2.776, t_{0.975}(9) = 2.262, t_{0.975}(1) = 12.706.
    assert stats.t_quantile_975(4) == pytest.approx(2.776445, abs=1e-5)
    assert stats.t_quantile_975(9) == pytest.approx(2.262157, abs=1e-5)
    assert stats.t_quantile_975(1) == pytest.approx(12.706205, abs=1e-4)
    # t(1) is Cauchy: P(|T| > 1) = 1 - 2 atan(1) / pi = 0.5 exactly.
    assert stats.t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)
    # t(2): P(|T| > t) = 1 - t / sqrt(2 + t^2); t = 2 -> 1 - 2 / sqrt(6) = 0.183503.
    assert stats.t_two_sided_p(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6), abs=1e-12)


def test_paired_test_by_hand() -> None:
    # differences 0.5, 0.3, 0.8, 0.1, 0.9: mean 0.52, sd = sqrt(0.448 / 4) = 0.33466, t = 0.52 / (0.33466 / sqrt 5) = 3.4744
    p = stats.paired([1.0, 2.0, 3.0, 4.0, 5.0], [0.5, 1.7, 2.2, 3.9, 4.1])
    assert p.n == 5 and p.diff == pytest.approx(0.52)
    assert p.t == pytest.approx(0.52 / (math.sqrt(0.448 / 4) / math.sqrt(5)), rel=1e-9)
    assert p.half_width == pytest.approx(2.776445 * math.sqrt(0.448 / 4) / math.sqrt(5), rel=1e-5)
    assert p.p < 0.05 and p.verdict(+1) == "held" and p.verdict(-1) == "reversed"
    flat = stats.paired([0.5, 0.6, 0.4], [0.6, 0.5, 0.4])  # differences -0.1, 0.1, 0: t = 0
    assert flat.t == 0.0 and flat.p == pytest.approx(1.0) and flat.verdict(+1) == "not resolved"
    with pytest.raises(ValueError, match="same seeds on both sides"):
        stats.paired([1.0], [1.0, 2.0])
    # 95 % interval of 1, 2, 3: mean 2, sd 1, half-width t(2) / sqrt(3) = 4.302653 / 1.7320508 = 2.484138
    iv = stats.interval([1.0, 2.0, 3.0])
    assert iv.mean == 2.0 and iv.half_width == pytest.approx(2.484138, abs=1e-5) and iv.cell(2) == "2.00 ± 2.48"


def test_low_streaks_and_rounding() -> None:
    # below 0.8 at positions 1, 2, 4, 5, 6 (None is not below): two streaks, the longest 3
    s = records.low_streaks([0.9, 0.7, 0.79, 0.85, 0.5, 0.6, 0.1, None, 0.95], 0.8)
    assert s == {"tau": 0.8, "versions_below": 5, "streaks": 2, "longest": 3}
    assert records.sig(0.123456) == 0.1235 and records.sig(float("nan")) is None and records.sig(7) == 7
    assert records.reset_rule({"ewma": {"reset": {"enabled": False}}}) == (0.8, 3, False)


def test_shared_runs_have_one_key_and_the_paper_cells_are_there() -> None:
    # The methods table's exact and ewma runs are the other experiments' shared cells.
    thresholds, ewma = paper_module("thresholds"), paper_module("ewma")
    assert harness.method("exact").key() == thresholds.grid()[0].key()
    assert harness.method("ewma").key() == ewma.cfg("decay auto, reset").key()
    assert len({c.key() for c in harness.METHODS}) == len(harness.METHODS)
    assert len({c.key() for c in ewma.grid()}) == 8
    # the fast and stress blocks are their own runs (their rate is in the key), not the base scale's
    blocks = [*ewma.fast_grid(), *ewma.stress_grid()]
    assert len({c.key() for c in blocks} - {c.key() for c in [*harness.METHODS, *ewma.grid()]}) == 10
    assert {c.spec()["learning_rate"] for c in ewma.fast_grid()} == {ewma.FAST_LR}
    paper = thresholds.grid()[0].correction
    assert paper["mask"]["bounds"] == {"low": 0.99, "high": 1.01} and paper["clip"] == {"low": 0.003, "high": 0.004}
    # [0.996, 1.006] as a spec clip: low = 1 - 0.996, high = 1.006 - 1
    assert thresholds.grid()[3].correction["clip"] == {"low": 0.004, "high": 0.006}
    with pytest.raises(KeyError, match="valid: sync, behavior"):
        harness.method("ppo")


def test_a_reruns_final_success_is_judged_at_least_by_one_evaluations_sampling_noise() -> None:
    cell = paper_module("cell")
    assert cell.sampling_bound("final", 300) == pytest.approx(1.96 * (0.5 / 300) ** 0.5)  # 0.080
    assert cell.sampling_bound("auc", 300) is None  # an average of evaluations: the measured spread alone


def test_record_round_trip(tmp_path: Path) -> None:
    cfg = harness.method("ewma")
    summary = {"eval_curve": [{"version": 0, "success": 0.25, "loop_s": 0.0}, {"version": 2, "success": 0.5, "loop_s": 1.5}],
               "wall_s": 9.0, "eval_s": 1.0, "loop": {"wall_s": 8.0},
               "startup_check": {"engines": [{"engine": "rollout-0", "version": 0, "tokens": 40, "mean_abs_log_ratio": 2e-3,
                                              "p50_abs_log_ratio": 5e-4, "p99_abs_log_ratio": 2e-2, "max_abs_log_ratio": 5e-2}]}}
    steps = [{"step": 1}, {"version": 1, "in_bounds_ratio": 0.9, "keep_ratio": 0.9, "ewma_reset": 0, "learning_rate": 1e-4},
             {"version": 2, "in_bounds_ratio": 0.7, "keep_ratio": 0.7, "ewma_reset": 1, "learning_rate": 1e-4,
              "ewma_reset_outcome": "unrecovered"}]
    rec = records.build(key=cfg.key(), seed=3, tag="", config=cfg.spec(), scale=harness.scale_record(harness.QUICK),
                        summary=summary, steps=steps, bench_s=12.34, load_avg=(1.0, 2.0))
    path = records.write(tmp_path, rec)
    assert path.name == f"{cfg.key()}-s3.json"
    back = records.read(path)
    assert back == json.loads(json.dumps(rec))
    assert back["resets"] == {"count": 1, "versions": [2]} and back["loop_s"] == 7.0  # 8.0 - 1.0 of evaluation
    assert back["actor_learning_rate"] == 1e-4  # the optimizer's own rate, from the step lines
    assert back["reset_outcomes"] == {"recovered": 0, "unrecovered": 1}
    assert back["low_streak"] == {"tau": 0.8, "versions_below": 1, "streaks": 1, "longest": 1, "k": 3}
    assert back["log_rd"]["p50"] == 5e-4 and back["eval"]["success"] == [0.25, 0.5]
    assert records.Store(tmp_path).seeds_of(cfg.key()) == [3]
    path.write_text(path.read_text().replace('"schema": 1', '"schema": 0'))
    with pytest.raises(ValueError, match="record schema 0, this code reads 1; rerun the cell"):
        records.read(path)


def test_a_warm_start_fingerprint_is_its_weights_and_a_rerun_from_another_start_is_flagged(tmp_path: Path) -> None:
    cell = paper_module("cell")
    a, b = tmp_path / "a", tmp_path / "b"
    for d, meta in ((a, '{"saved": 1}'), (b, '{"saved": 2}')):  # two identical warm starts saved at other times
        (d / "rank0").mkdir(parents=True)
        (d / "rank0" / "shard.pt").write_bytes(b"weights")
        (d / "meta.json").write_text(meta)
    fa, fb = harness.warm_fingerprint(a, 100, 0), harness.warm_fingerprint(b, 100, 0)
    assert fa == fb and fa["seed"] == 0 and fa["steps"] == 100 and len(fa["sha256"]) == 16
    (b / "rank0" / "shard.pt").write_bytes(b"weightz")
    fc = harness.warm_fingerprint(b, 100, 0)
    assert fc["sha256"] != fa["sha256"]

    def run(warm: dict | None, v0: float) -> dict:
        return {"eval": {"success": [v0, 0.5]}, **({} if warm is None else {"warm_start": warm})}

    same, line = cell.warm_start_note(run(fa, 0.4), run(fb, 0.43))
    assert same and fa["sha256"] in line
    same, line = cell.warm_start_note(run(fa, 0.4), run(fc, 0.4))
    assert not same and "DIFFERENT" in line and "not comparable" in line
    same, line = cell.warm_start_note(run(None, 0.3933), run(fa, 0.4333))
    assert not same and "0.3933" in line and "0.4333" in line and "no fingerprint" in line


def test_the_warm_start_section_names_the_spread_and_which_start_the_cells_used(tmp_path: Path) -> None:
    ws = paper_module("warm_starts")
    (tmp_path / "warm_starts").mkdir()
    (tmp_path / "cells").mkdir()
    for seed, v0, sha in ((0, 0.4333, "aaaa"), (1, 0.1167, "bbbb")):
        (tmp_path / "warm_starts" / f"seed-{seed}.json").write_text(json.dumps(
            {"seed": seed, "v0_success": v0, "sha256": sha, "log_rd": {"mean": 3e-3}}))
    cell = {"eval": {"success": [0.3933, 0.7]}}
    (tmp_path / "cells" / "cfg-x-s0.json").write_text(json.dumps(cell))
    text = ws.section(tmp_path)
    assert "| 0 | 0.4333 | 3.00e-03 | `aaaa` |" in text and "| 1 | 0.1167 |" in text
    assert "ranges 0.117–0.433 over 2 warm-start seeds" in text
    assert "0.3933" in text and "none of these seeds'" in text
    (tmp_path / "cells" / "cfg-x-s0.json").write_text(json.dumps({**cell, "warm_start": {"sha256": "bbbb"}}))
    assert "started from the warm start of seed 1" in ws.section(tmp_path)


@pytest.mark.slow
def test_warm_starts_quick_writes_a_record_per_seed(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(PAPER / "warm_starts.py"), "--quick", "--work", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    recs = [json.loads(p.read_text()) for p in sorted((tmp_path / "quick" / "warm_starts").glob("seed-*.json"))]
    assert [r["seed"] for r in recs] == [0, 1] and all(0.0 <= r["v0_success"] <= 1.0 for r in recs)
    assert len({r["sha256"] for r in recs}) == 2  # another seed, another warm start
    assert "How much the warm start decides" in proc.stdout


def test_prop1_keep_decisions_identical_on_one_batch() -> None:
    prop1 = paper_module("prop1")
    bad, n = prop1.keep_disagreements([0, 1, 2, 3], B=32, T=16)
    assert n == 512 and bad == 0


@pytest.mark.slow
def test_quick_mode_writes_every_record_and_section(tmp_path: Path) -> None:
    # bench/paper/quick.py: every experiment's --quick in one process, one working folder (later experiments
    # reuse the methods runs, as at full scale), one import and one Ray for all five
    proc = subprocess.run([sys.executable, str(PAPER / "quick.py"), "--out", str(tmp_path), *EXPERIMENTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-4000:])
    assert [line for line in proc.stdout.splitlines() if line.startswith("== ")] == [
        f"== {name} --quick ==" for name in EXPERIMENTS]
    for name in EXPERIMENTS:
        if name != "system_cost":
            assert (tmp_path / "quick" / f"{name}.md").read_text().count("| ") > 10, name
        png = tmp_path / "quick" / f"{name}.png"
        assert png.exists() and 0 < png.stat().st_size < 200_000, name
    recs = sorted((tmp_path / "quick" / "records").glob("cfg-*-s0.json"))
    # 7 methods + 7 new EWMA cells + 4 new threshold cells + 1 single-ratio cell (the EWMA blocks at other rates:
    # full scale only; the base grid's cells at another rate)
    assert len(recs) == 19, [p.name for p in recs]
    assert all(records.read(p)["log_rd"] is not None for p in recs)
    # every run started from the one warm start, made at the harness's seed whatever seed ran first
    starts = {json.dumps(records.read(p)["warm_start"], sort_keys=True) for p in recs}
    assert len(starts) == 1 and json.loads(starts.pop())["seed"] == harness.WARM_SEED
    _check_old_logits_quick(proc.stdout, json.loads((tmp_path / "quick" / "system_cost.json").read_text())["data"])


def _check_old_logits_quick(stdout: str, result: dict[str, Any]) -> None:
    """``bench/old_logits.py --quick`` as system_cost runs it (one rollout worker): one row per strategy at W=1 with
    every column, the targets block, and the exact strategies' r_d at 1 (this ran as a test of its own before)."""
    paper_module("system_cost")  # puts bench/ on the path, as the script does
    import old_logits as bench  # bench/old_logits.py
    lines = stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("strategy"))
    table = lines[header + 2: header + 2 + len(bench.STRATEGIES)]
    assert [line.split()[0] for line in table] == list(bench.STRATEGIES)
    assert all(line.split()[1] == "1" for line in table)
    assert "targets:" in lines
    rows = {r["strategy"]: r for r in result["rows"]}
    assert set(rows) == set(bench.STRATEGIES)
    assert rows["behavior"]["extra_step_s"] == 0.0 and rows["behavior"]["extra_memory_bytes"] == 0
    # the EWMA reference holds theta_prox plus, under the default recentre rule, its W bf16 residuals: 1 + W/2 copies
    assert rows["ewma"]["extra_memory_bytes"] == result["ewma_bytes"] > result["weight_bytes"]
    (held,) = [t for t in result["targets"] if t["name"].startswith("ewma holds exactly")]
    assert held["met"] is True, held
    assert rows["snapshot"]["resident_max"] >= 1 and rows["snapshot"]["extra_memory_bytes"] > 0
    assert rows["interruptSync"]["stall_s"] > 0 and set(rows["interruptSync"]["stall_phases_s"]) == {
        "interrupt", "score", "update", "resume"}
    for name in bench.EXACT:
        assert abs(rows[name]["rd_min"] - 1.0) < bench.RD_TOLERANCE, rows[name]
        assert abs(rows[name]["rd_max"] - 1.0) < bench.RD_TOLERANCE, rows[name]
    names = [t["name"] for t in result["targets"]]
    assert any(n.startswith("snapshot old-logit time/step") for n in names)
    assert any(n.startswith("exact strategies agree") for n in names)
    assert all(t["met"] in (True, False, None) and t["detail"] for t in result["targets"])


def test_probe_median_that_records_read() -> None:
    import torch

    from asyncrl.trainer.driver.loop.startup_probe import engine_discrepancy

    # log r_d = logp_theta - logp_mu on the sampled tokens = [0.5, 0.0, -0.2]: |.| sorted 0, 0.2, 0.5, median 0.2
    logp_theta = torch.tensor([[0.0, -1.0, -2.0], [0.0, -0.5, 0.0]])
    logp_mu = torch.tensor([[0.0, -1.5, -2.0], [0.0, -0.3, 0.0]])
    mask = torch.tensor([[False, True, True], [False, True, False]])
    s = engine_discrepancy("e", "bfloat16", 0, logp_theta, logp_mu, mask)
    assert s.p50_abs_log_ratio == pytest.approx(0.2, abs=1e-7)
    summary = {"startup_check": {"engines": [s.record()]}}
    assert records.probe_quantiles(summary)["p50"] == pytest.approx(0.2, abs=1e-7)
