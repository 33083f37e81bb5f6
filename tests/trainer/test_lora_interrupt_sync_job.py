"""LoRA with ``oldLogits.strategy: interruptSync`` in a whole local job (slow): at every weight sync the rollout
workers score the outgoing version's tokens with the training-side model on the base they kept plus that version's
adapters (merged in fp32), and only then take the next version's adapters. Under the fp32 rollout r_d =
pi_old / mu_old is 1 within 1e-5 on every step, also when a rollout worker is killed mid-run and replaced."""

import copy
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.kill_worker import kill_at_version, survived_with_rd_one

pytestmark = pytest.mark.slow  # a 6-step job per transport with a kill and a replacement: 45-50 s each at load 4

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


@pytest.mark.parametrize("transport", ["objectStore", "broadcast"])
def test_a_killed_rollout_worker_is_replaced_and_rd_stays_one(ray_session: None, tmp_path: Path,
                                                              transport: str) -> None:
    """One of the two workers is killed after version 2: the next window finds it dead at *interrupt*, replaces
    it (the replacement takes the new version with the actor's base; under broadcast it joins the group formed
    again) and the other worker scores the outgoing version's tokens. The replacement scores in later windows on
    the base it fetched. r_d stays 1 within 1e-5 on every step."""
    job = copy.deepcopy(JOB)
    job["spec"]["actor"] = {"weightSync": {"transport": transport, "bucketMiB": 1}}
    on_step, killed = kill_at_version(2, expect=2)

    result = run_job(validate_job(job), RunOptions(run_dir=tmp_path / "run"), on_step=on_step)
    s = survived_with_rd_one(result, killed, versions=6)
    assert s["worker_replacements"] == 1, s
    sync = s["interrupt_sync"]
    print(f"{transport}: interrupt_sync {sync}")
    assert sync["syncs"] == 6 and sync["tokens_scored"] > 0, sync  # the workers' scorers did score tokens
