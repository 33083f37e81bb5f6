"""bench/lora_learning.py's pure parts: the equal-time reading, the paired bootstrap, the plan's verdict, the
run-length code of a batch's versions and the span summary (hand-derived expectations; no job runs here)."""

import math
import random
import statistics
from types import SimpleNamespace

import pytest

from tests.support.helpers import bench_module


@pytest.fixture(scope="module")
def ll():
    return bench_module("lora_learning")


def test_success_at_interpolates_between_evaluations_and_never_extrapolates(ll) -> None:
    secs, succ = [0.0, 10.0, 30.0], [0.4, 0.5, 0.7]
    assert ll.success_at(secs, succ, 0.0) == pytest.approx(0.4)
    assert ll.success_at(secs, succ, 10.0) == pytest.approx(0.5)
    assert ll.success_at(secs, succ, 20.0) == pytest.approx(0.6)  # halfway from 10 s to 30 s
    assert ll.success_at(secs, succ, 25.0) == pytest.approx(0.65)
    assert ll.success_at(secs, succ, 30.0) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="never extrapolated"):
        ll.success_at(secs, succ, 30.5)
    with pytest.raises(ValueError, match="must not fall"):
        ll.success_at([0.0, 5.0, 4.0], succ, 1.0)


def test_success_at_matches_a_reference_interpolation(ll) -> None:
    rng = random.Random(3)
    for _ in range(200):
        secs = sorted(rng.uniform(0, 100) for _ in range(6))
        succ = [rng.random() for _ in secs]
        t = rng.uniform(secs[0], secs[-1])
        i = next(k for k in range(1, len(secs)) if t <= secs[k])
        ref = succ[i - 1] + (succ[i] - succ[i - 1]) * (t - secs[i - 1]) / (secs[i] - secs[i - 1])
        assert ll.success_at(secs, succ, t) == pytest.approx(ref, abs=1e-12)


def _record(loop_s, success, versions=(0, 10, 20, 30, 40, 50, 60)):
    return {"eval": {"loop_s": list(loop_s), "success": list(success), "version": list(versions)},
            "loop_s": loop_s[-1], "scale": {"steps": 60}}


def test_equal_time_reads_both_arms_at_the_faster_arms_last_second(ll) -> None:
    fast = _record([0, 10, 20, 30, 40, 50, 60], [0.4, 0.4, 0.5, 0.5, 0.6, 0.6, 0.7])
    slow = _record([0, 12, 24, 36, 48, 60, 72], [0.4, 0.5, 0.5, 0.6, 0.6, 0.7, 0.8])
    e = ll.equal_time(fast, slow)
    assert e.seconds == 60
    assert e.a == pytest.approx(0.7 - 0.4)  # the fast arm at its last evaluation
    assert e.b == pytest.approx(0.7 - 0.4)  # the slow arm's evaluation at 60 s (version 50)
    e2 = ll.equal_time(slow, fast)
    assert (e2.a, e2.b) == (pytest.approx(e.b), pytest.approx(e.a))
    slow2 = _record([0, 12, 24, 36, 48, 60, 72], [0.4, 0.5, 0.5, 0.6, 0.6, 0.6, 0.8])
    slow2["eval"]["loop_s"][-2] = 50  # 60 s now falls between 50 s (0.6) and 72 s (0.8): 0.6 + 0.2 * 10 / 22
    assert ll.equal_time(fast, slow2).b == pytest.approx(0.6 + 0.2 * 10 / 22 - 0.4)


def test_late_gain_is_the_mean_at_versions_40_50_60_minus_v0(ll) -> None:
    r = _record([0, 1, 2, 3, 4, 5, 6], [0.3, 0.4, 0.4, 0.5, 0.6, 0.5, 0.7])
    assert ll.late_gain(r) == pytest.approx((0.6 + 0.5 + 0.7) / 3 - 0.3)
    with pytest.raises(ValueError, match="no evaluation"):
        ll.late_gain(_record([0, 1], [0.1, 0.2], versions=(0, 15)))


def test_bootstrap_interval_brackets_the_mean_and_matches_the_normal_width(ll) -> None:
    d = [0.02, -0.01, 0.03, 0.00, 0.05, -0.02, 0.01, 0.04]
    lo, hi = ll.bootstrap_ci(d)
    assert lo < statistics.fmean(d) < hi
    assert ll.bootstrap_ci(d) == (lo, hi)  # seeded: the same interval every time
    # the bootstrap of a mean is about normal with sd = sample sd * sqrt((n - 1) / n) / sqrt(n)
    n = len(d)
    half = 1.96 * statistics.stdev(d) * math.sqrt((n - 1) / n) / math.sqrt(n)
    assert (hi - lo) / 2 == pytest.approx(half, rel=0.15)
    assert ll.bootstrap_ci([0.1, 0.1, 0.1]) == (pytest.approx(0.1), pytest.approx(0.1))
    with pytest.raises(ValueError, match="at least 2"):
        ll.bootstrap_ci([0.1])


@pytest.mark.parametrize(("diff", "p", "intervals", "want"), [
    (-0.06, 0.01, [(-0.1, -0.02)], "LoRA learns worse"),
    (0.06, 0.01, [(0.02, 0.1)], "LoRA learns better"),
    (0.01, 0.4, [(-0.03, 0.04), (-0.02, 0.03)], "as well (equivalent within ±0.05)"),
    (0.03, 0.2, [(-0.03, 0.09), (-0.02, 0.08)], "no worse (non-inferior by 0.05)"),
    (0.00, 0.9, [(-0.03, 0.04), (-0.06, 0.05)], "not resolved"),  # the wider interval decides
    (-0.02, 0.3, [(-0.08, 0.04)], "not resolved"),
])
def test_verdict_follows_the_plan(ll, diff, p, intervals, want) -> None:
    assert ll.verdict(diff, p, intervals) == want


def test_runs_of_round_trips(ll) -> None:
    vals = [-1, -1, 3, 3, 3, -1, 4, 4, -1]
    assert ll.runs_of(vals) == [[-1, 2], [3, 3], [-1, 1], [4, 2], [-1, 1]]
    assert ll.expand(ll.runs_of(vals)) == vals
    assert ll.runs_of([]) == []


def test_probe_and_span_summary_count_rows_and_the_cut_share(ll) -> None:
    traj = lambda versions, mask: SimpleNamespace(versions=versions, loss_mask=mask)  # noqa: E731
    probe = ll.BatchProbe()
    one = traj([-1, -1, 5, 5, 5, 5, 5, 5, 5, 5], [False, False] + [True] * 8)
    # two versions: version 5's last token at index 4 (needed length 5 of 10); a tool token between
    two = traj([-1, -1, 5, 5, 5, -1, 6, 6, 6, 6], [False, False, True, True, True, False, True, True, True, True])
    # three versions: 4 ends at 2 (3 of 10), 5 at 5 (6 of 10)
    three = traj([-1, 4, 4, 5, 5, 5, 6, 6, 6, 6], [False] + [True] * 9)
    empty = traj([-1, -1], [False, False])
    probe([[one, two], [three, empty]], 7)
    out = probe.record()
    assert out["batches"] == [{"actor_version": 7, "rows": [
        [[-1, 2], [5, 8]], [[-1, 2], [5, 3], [-1, 1], [6, 4]], [[-1, 1], [4, 2], [5, 3], [6, 4]], [[-1, 2]]]}]
    s = out["spans"]
    assert s["rows"] == 3 and s["by_versions"] == {"1": 1, "2": 1, "3": 1}
    assert s["spanning_share"] == pytest.approx(2 / 3, abs=1e-3)
    assert s["extra_share_of_spanning"]["mean"] == pytest.approx((0.5 + 0.9) / 2)
    assert s["cost_rows"] == pytest.approx(1 + (0.5 + 0.9) / 3, abs=1e-3)  # kept to 4 digits


def test_a_masked_token_counts_as_no_version(ll) -> None:
    probe = ll.BatchProbe()
    probe([[SimpleNamespace(versions=[3, 3, 4], loss_mask=[True, True, False])]], 4)
    assert probe.batches[0]["rows"] == [[[3, 2], [-1, 1]]]
    assert probe.record()["spans"]["by_versions"] == {"1": 1}


def test_arms_digest_rate_and_adapters(ll) -> None:
    a, b, c = ll.arm("full", 1e-4), ll.arm("lora", 1e-4), ll.arm("lora", 1e-3)
    assert len({a.key(), b.key(), c.key()}) == 3
    assert b.spec()["model"]["lora"]["rank"] == 16 and "model" not in a.spec()
    with pytest.raises(ValueError, match="valid arms"):
        ll.arm("qlora", 1e-4)


def test_docs_lora_md_shows_what_the_committed_records_give(ll) -> None:
    """docs/lora.md's generated block is the report of docs/results/data/lora_learning/ (run
    ``bench/lora_learning.py report`` after adding records)."""
    assert ll.render() == ll.DOC.read_text(), "docs/lora.md drifted from its records: run bench/lora_learning.py report"


def test_the_committed_tuning_records_choose_the_plans_rates(ll) -> None:
    # the plan's rule on the committed grid: full 1e-4 (+0.295) over 3e-4 (-0.118); LoRA 1e-3 (+0.239) over 3e-4
    # (+0.224, more than 0.005 below) and 3e-3 (-0.393)
    assert ll.chosen_rates() == {"full": 1e-4, "lora": 1e-3}
