"""bench/ewma_history_memory.py: its committed record recomputes (nothing in it is timed), and the residuals beat
bf16 weight copies by orders of magnitude at the rates the experiments use."""

import json

import pytest

from tests.support.helpers import ROOT, bench_module

RECORD = ROOT / "docs" / "results" / "data" / "ewma_history_memory.json"


@pytest.fixture(scope="module")
def mod():
    return bench_module("ewma_history_memory")


def test_the_bytes_recompute_from_the_shapes(mod) -> None:
    rec = json.loads(RECORD.read_text())
    smol = next(m for m in rec["models"] if m["name"] == "SmolLM2-135M")
    assert smol["parameters"] == 134_515_008
    at3 = next(b for b in smol["bytes"] if b["W"] == 3)
    # W = 3: before theta_prox + 5 fp32 copies = 24 bytes a parameter, after theta_prox + 3 bf16 = 10
    assert (at3["state_before"], at3["state_after"]) == (24 * 134_515_008, 10 * 134_515_008)
    assert all(b == mod.memory(m["parameters"], b["W"]) for m in rec["models"] for b in m["bytes"])


def test_one_error_row_recomputes_and_residuals_beat_bf16_copies(mod) -> None:
    from asyncrl.api.model_arch import hf_param_shapes

    rec = json.loads(RECORD.read_text())
    row = next(r for r in rec["errors"] if r["W"] == 3 and r["lr"] == 1e-4)
    shapes = hf_param_shapes(mod.tiny_arch(), with_tied_head=False)
    runs = [mod.errors(shapes, 3, 1e-4, s) for s in range(row["seeds"])]
    assert max(r["residuals_bf16"] for r in runs) == row["residuals_bf16"]
    # bf16 copies round each weight by up to |theta| 2^-9 (~1e-4 here), as much as a version's movement
    assert row["residuals_bf16"] < 0.01 * row["movement"] < row["copies_bf16"]
