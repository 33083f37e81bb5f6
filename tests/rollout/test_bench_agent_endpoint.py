"""bench/agent_endpoint.py: its statistics on hand-made rounds, the model surgery it rests on, and the whole bench in
its ``--smoke`` form (two session counts, one round, short episodes). No timing is asserted: the machine is shared."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.helpers import ROOT, bench_module

BENCH = ROOT / "bench" / "agent_endpoint.py"
bench = bench_module("agent_endpoint")


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert bench.percentile(values, 50) == 50.0
    assert bench.percentile(values, 99) == 99.0
    assert bench.percentile([3.0], 99) == 3.0
    assert math.isnan(bench.percentile([], 50))


def test_summary_pairs_each_round_with_its_own_env_cell() -> None:
    Cell = bench.Cell
    rounds = [  # round 2 runs at half the speed of round 1 on both paths: the ratio stays 0.5
        {(2, "env"): Cell(seconds=1.0, sampled=100, latencies=[(0, 0.5), (1, 0.010), (1, 0.012)]),
         (2, "endpoint"): Cell(seconds=2.0, sampled=100, latencies=[(0, 0.9), (1, 0.015), (1, 0.017)])},
        {(2, "env"): Cell(seconds=2.0, sampled=100, latencies=[(1, 0.010)]),
         (2, "endpoint"): Cell(seconds=4.0, sampled=100, latencies=[(1, 0.016)])},
    ]
    env, ep = bench.summarise(rounds, [2], ["env", "endpoint"])
    assert env["ratio"] == 1.0 and env["turn_gap_p50_ms"] == pytest.approx(10.0)
    assert ep["ratio"] == pytest.approx(0.5) and ep["ratio_ci95"] == pytest.approx(0.0)
    assert ep["sampled_tokens"] == env["sampled_tokens"] == 200
    assert ep["p99_ms"] == pytest.approx(900.0)  # the first turn's request counts in the latency
    assert ep["added_ms"] == pytest.approx(16.0 - 10.0)  # follow-up requests only, minus the env's turn gap


def test_one_char_weights_sample_one_token_and_never_the_end_of_turn() -> None:
    from asyncrl.api.model import ModelSpec
    from asyncrl.api.model_arch import resolve_arch
    from asyncrl.rollout.envs.charset import TEXT_TOKENIZER as tok
    from asyncrl.rollout.hf_model import build_model

    arch = resolve_arch(ModelSpec(**bench.MODELS["h64"], tie_embeddings=False), tok.vocab_size, 128)
    fill = tok.token_id("a")
    model = build_model(arch, seed=1)
    model.load_state_dict(bench.one_char_weights(model.state_dict(), fill, tok.eos_id))
    ids = torch.randint(0, tok.vocab_size, (4, 40), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        p = torch.softmax(model(input_ids=ids).logits.float(), dim=-1)
    assert bool((p.argmax(-1) == fill).all())  # at every position of every random context
    assert float(p[..., tok.eos_id].max()) == 0.0
    assert float(p[..., fill].min()) == 1.0


@pytest.mark.slow  # 12-15 s alone: a worker, its endpoint and the real openai client in a bench run (make test's budget)
def test_smoke_run_writes_the_record_and_both_paths_sample_the_same_tokens(tmp_path: Path) -> None:
    out = tmp_path / "agent_endpoint.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert set(rec) >= {"bench", "machine", "shape", "models", "target", "sampled_tokens_equal"}
    assert rec["sampled_tokens_equal"] is True
    shape = rec["shape"]
    model = rec["models"]["h64"]
    assert model["paths"] == ["env", "endpoint", "endpoint-in-process"]
    rows = model["rows"]
    assert {(r["sessions"], r["path"]) for r in rows} == {(c, p) for c in (1, 4) for p in model["paths"]}
    for r in rows:
        # every episode finished with exactly turns x max_tokens sampled tokens, on every path
        assert r["sampled_tokens"] == r["episodes"] * shape["turns"] * shape["max_tokens"]
        assert r["tok_s"] > 0 and r["ratio"] > 0
        if r["path"] != "env":
            assert 0 < r["p50_ms"] <= r["p99_ms"]
    for c in (1, 4):
        same = [(r["sampled_tokens"], r["forced_tokens"]) for r in rows if r["sessions"] == c]
        assert len(set(same)) == 1, same  # sampled and forced: the same episodes both ways
    assert {r["path"] for r in model["null_engine"]} == set(model["paths"]) - {"env"}
    assert rec["target"]["sessions"] == 32 and rec["target"]["min_ratio"] == 0.9  # no 32-session cell here
    assert "vs env" in proc.stdout and "null engine" in proc.stdout
