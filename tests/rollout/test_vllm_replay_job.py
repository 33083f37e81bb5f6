"""Routing replay (R3) in a short local job with the vLLM rollout engine (``make test-vllm``): the tiny Qwen3-MoE
folder (head_dim 64 for vLLM's CPU attention), fp32 on both sides, exact old logits (snapshot), partial rollouts.
The vLLM engine's routes ride the trajectory to the actor, which replays each segment's own version's routes, so
r_d = pi_old / mu_old is 1 up to kernel rounding (vLLM's CPU kernels against megatron-core, as in
test_vllm_job.py) on every step, and the actor replayed routes for the trained tokens.

Measured (2 steps, 64 trained tokens a step): r_d in [0.9999981, 1.0000019] with R3, the same with routingReplay none
(route-flip share 0: at fp32 vLLM and the actor route alike, 176/176 positions in test_vllm_routes.py), so this
checks the path (routes reach the actor and are replayed), not a discrepancy R3 removes; that needs a bf16
rollout, which vLLM's CPU build refuses. ~50 s (engine start, actor build, evaluation, 2 steps)."""

from pathlib import Path

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.hf_models import tiny_folder

pytestmark = pytest.mark.vllm

RD_TOLERANCE = 1e-3  # as test_vllm_job.py: fp32 engines, different summation orders
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 64}


def test_r3_job_with_vllm_keeps_rd_at_one(ray_session: None, tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path / "models", "qwen3_moe", **SHAPE)
    job = {
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "moe-replay-vllm"},
        "spec": {
            "correction": {"reference": "exact", "routingReplay": "rollout"},
            "oldLogits": {"strategy": "snapshot"},
            "async": {"maxStaleness": 1, "partialRollout": True},
            "model": {"weights": str(folder), "rolloutDtype": "float32"},
            "task": {"name": "arithmetic", "groupSize": 4, "maxNewTokens": 8},
            "train": {"steps": 2, "promptsPerStep": 2, "warmStartSteps": 0, "learningRate": 0.05},
            "rollout": {"replicas": 1, "engine": "vllm", "engineArgs": {"maxNumSeqs": 16}},
            "monitoring": {"enabled": False},
        },
    }
    result = run_job(validate_job(job), RunOptions(run_dir=tmp_path / "run", steps=2))
    assert result.summary.status == "succeeded", result.summary
    assert len(result.steps) == 2
    for r in result.steps:
        print(f"vllm R3: rd [{r['rd_min']:.7f}, {r['rd_max']:.7f}] flips {r['route_flip_frac']:.3f} "
              f"of {r['route_replayed_tokens']:.0f}")
        assert r["route_replayed_tokens"] > 0
        assert abs(r["rd_min"] - 1.0) < RD_TOLERANCE and abs(r["rd_max"] - 1.0) < RD_TOLERANCE, r
