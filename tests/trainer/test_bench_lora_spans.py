"""bench/lora_spans.py at its smallest size: it runs, cut and uncut pairs give the same log-probs, the old rule was
patched in per call only, and its record has every figure. No time is asserted."""

import pytest

from tests.support.helpers import bench_module

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def test_the_smallest_run_records_every_figure() -> None:
    from asyncrl.trainer.oldlogits import span_plan

    cut = span_plan.needed_lengths
    record = bench_module("lora_spans").measure("tiny-llama", rank=4, rows=4, tokens=16, rounds=1)
    assert span_plan.needed_lengths is cut  # the uncut rule was patched in per call only
    for kind in ("lora", "full"):
        assert set(record[kind]["new_over_old"]) == {"exact_one", "exact_two"}
        assert all(record["median_s"][f"{kind}.{tag}.{k}"] > 0 for tag in ("new", "old")
                   for k in ("exact_one", "exact_two"))
    assert all(d < 1e-5 for d in record["max_abs_logp_diff_new_vs_old"].values()), record


def test_one_pass_with_per_position_adapters_is_not_the_exact_route() -> None:
    """The alternative the cut replaced nothing with: each position under its own version's adapter in one pass
    equals the exact route on the first version's tokens and departs from it after the switch."""
    mix = bench_module("lora_spans").per_position_mix("tiny-llama", rank=4, rows=4, tokens=32, gaps=(0.1,))["0.1"]
    assert mix["first_version_max_abs_logp_diff"] < 1e-5, mix
    assert mix["max_abs_logp_diff"] > 1e-3, mix


def test_replayed_batches_renumber_versions_and_count_positions(tmp_path) -> None:
    """``--mix-from``: a record's run-length coded batch comes back as its rows (padded with -1, versions renumbered
    0..k-1), and the exact route's positions are the cut pairs' (hand-counted), its time measured beside EWMA's."""
    import json

    spans = bench_module("lora_spans")
    rows = [[[-1, 2], [7, 4]],                      # one version, 6 long
            [[-1, 2], [7, 2], [-1, 1], [8, 3]]]     # 7 ends at 4 (needed 4), 8 at 8 (needed 8)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps({"batches": [{"actor_version": 9, "rows": rows}]}))
    batches, summary = spans.replayed_batches([path], limit=5)
    (vers, mask), = batches
    assert vers.tolist() == [[-1, -1, 0, 0, 0, 0, -1, -1], [-1, -1, 0, 0, -1, 1, 1, 1]]
    assert mask.tolist() == [[v >= 0 for v in r] for r in vers.tolist()]
    assert summary["by_versions"] == {"1": 1, "2": 1} and summary["batches_in_records"] == 1
    # pairs: (row 0, v0) 6, (row 1, v0) 4, (row 1, v1) 8; one forward costs 8 positions of overhead, so all in one
    # group padded to 8 (24) beats splitting off the short ones (8 + 2 x 6 + 8 = 28)
    assert spans.positions(batches[0]) == {"ewma": 16, "exact": 24, "forwards": 1}
    record = spans.measure_replayed([path], "tiny-llama", rank=4, rounds=1, limit=5)
    assert record["versions_resident"] == 2 and record["batches_replayed"] == 1
    assert record["positions_exact_over_ewma"] == pytest.approx(24 / 16)
    assert all(record["median_s"][f"{k}.{op}"] > 0 for k in ("lora", "full") for op in ("ewma", "exact", "exact_flat", "exact_one_group"))
    from asyncrl.trainer.oldlogits import span_plan

    assert span_plan.plan.__name__ == "plan"  # the one-group rule was patched in per call only
