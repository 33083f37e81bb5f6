"""LoRA with ``oldLogits.strategy: interruptSync`` in a whole local job (slow): at every weight sync the rollout
workers score the outgoing version's tokens with the training-side model on the base they kept plus that version's
adapters (merged in fp32), and only then take the next version's adapters. Under the fp32 rollout r_d =
pi_old / mu_old is 1 within 1e-5 on every step."""

from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = pytest.mark.slow  # a 6-step job with an interrupt-sync window at each of its versions

JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "lora-interrupt-sync"},
    "spec": {
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "interruptSync"},
        "async": {"maxStaleness": 2, "partialRollout": True},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64,
                  "rolloutDtype": "float32", "lora": {"rank": 4, "alpha": 8.0}},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 12},
        "train": {"steps": 6, "promptsPerStep": 2, "warmStartSteps": 0, "learningRate": 5e-2},
        "rollout": {"replicas": 2, "engine": "transformers"},
        "checkpoint": {"everySteps": 100},
        "monitoring": {"enabled": False},
    },
}


def test_lora_interrupt_sync_scorers_keep_rd_at_one(ray_session: None, tmp_path: Path) -> None:
    result = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path / "run"))
    s = result.summary.to_json()
    assert s["status"] == "succeeded", s
    steps = [r for r in result.steps if "version" in r]
    assert [r["version"] for r in steps] == [1, 2, 3, 4, 5, 6]
    for r in steps:
        print(f"version {r['version']}: r_d [{r['rd_min']:.7f}, {r['rd_max']:.7f}], sync {r.get('sync_bytes')} B")
        assert abs(r["rd_min"] - 1.0) < 1e-5 and abs(r["rd_max"] - 1.0) < 1e-5, r
    sync = s["interrupt_sync"]
    print("interrupt_sync:", sync)
    assert sync["syncs"] >= 5 and sync["tokens_scored"] > 0, sync  # the workers' scorers did score tokens
