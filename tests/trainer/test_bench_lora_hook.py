"""bench/lora_hook.py at its smallest size: it runs, both hook formulas give the same log-probs, and its record has
every figure. No time is asserted."""


import pytest

from tests.support.helpers import bench_module

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py




def test_the_smallest_run_records_every_figure() -> None:
    from asyncrl.trainer.megatron import lora

    fused = (lora._plus_scaled, lora._plus_scaled_per_row)
    record = bench_module("lora_hook").measure("tiny-llama", rank=4, rows=4, tokens=16, rounds=1)
    assert (lora._plus_scaled, lora._plus_scaled_per_row) == fused  # the old formula was patched in per call only
    ops = ("ewma", "exact_one", "exact_two")
    assert set(record["new_over_old"]) == set(ops)
    assert all(record["median_s"][f"{tag}.{k}"] > 0 for tag in ("new", "old") for k in ops)
    assert all(d < 1e-5 for d in record["max_abs_logp_diff_new_vs_old"].values()), record
