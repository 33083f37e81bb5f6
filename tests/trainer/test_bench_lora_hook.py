"""bench/lora_hook.py at its smallest size: it runs, both hook formulas give the same log-probs, and its record has
every figure. No time is asserted."""

import importlib.util
import sys
from types import ModuleType

import pytest

from tests.support.helpers import ROOT

BENCH = ROOT / "bench" / "lora_hook.py"

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_lora_hook", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_smallest_run_records_every_figure() -> None:
    from asyncrl.trainer.megatron import lora

    fused = (lora._plus_scaled, lora._plus_scaled_per_row)
    record = _bench().measure("tiny-llama", rank=4, rows=4, tokens=16, rounds=1)
    assert (lora._plus_scaled, lora._plus_scaled_per_row) == fused  # the old formula was patched in per call only
    ops = ("ewma", "exact_one", "exact_two")
    assert set(record["new_over_old"]) == set(ops)
    assert all(record["median_s"][f"{tag}.{k}"] > 0 for tag in ("new", "old") for k in ops)
    assert all(d < 1e-5 for d in record["max_abs_logp_diff_new_vs_old"].values()), record
