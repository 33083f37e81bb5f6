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
