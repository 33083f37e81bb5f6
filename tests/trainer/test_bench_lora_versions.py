"""bench/lora_versions.py at its smallest size: it runs and its record has every figure, with the ratios that
hold whatever the machine's load (sizes, not times). No time is asserted."""


import pytest

from tests.support.helpers import bench_module

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py




def test_the_smallest_run_records_every_figure() -> None:
    record = bench_module("lora_versions").measure("tiny-llama", rank=4, rows=4, tokens=16, repeats=1)
    full, lora = record["full"], record["lora"]
    for side in (full, lora):
        assert side["ewma_forward_s"] > 0 and side["train_step_s"] > 0 and side["sync_install_s"] > 0
    # tiny-llama: 2 layers of hidden 128 (4 heads of 32, 2 kv heads), ffn 256; rank 4 per layer:
    # qkv A 4x128 + B 256x4, o A 4x128 + B 128x4, fc1 A 4x128 + B 512x4, fc2 A 4x256 + B 128x4 = 6656
    assert lora["trainable_params"] == 2 * 6656
    assert lora["resident_bytes_per_version"] == 4 * 2 * 6656  # fp32
    assert full["trainable_params"] == full["model_params"]
    assert record["lora_over_full"]["sync_wire_bytes"] < 0.1  # adapters only on the wire
    merged = record["peft_vs_merged"]
    assert merged is not None and merged["max_abs_logp_diff"] < 1e-5  # merged == peft's unmerged layers
