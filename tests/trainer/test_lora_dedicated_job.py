"""LoRA with ``oldLogits.strategy: dedicated`` in a whole local job (slow): the scorers take the actor's frozen
base when they start (and when respawned), keep each version as its adapters, and merge a version onto the base
when they advance to it. Under the fp32 rollout r_d = pi_old / mu_old is 1 within 1e-5 on every step, also after
the scorer was killed mid-run and respawned (it took the base again, and the versions it still had to score)."""

from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.kill_worker import kill_at_version, survived_with_rd_one

pytestmark = pytest.mark.slow  # a 6-step job with a scorer killed and respawned: 31 s idle, 124 s at load 35

JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "lora-dedicated"},
    "spec": {
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "dedicated", "dedicated": {"replicas": 1, "maxLagVersions": 1}},
        "async": {"maxStaleness": 2, "partialRollout": True},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64,
                  "rolloutDtype": "float32", "lora": {"rank": 4, "alpha": 8.0}},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 12},
        "train": {"steps": 6, "promptsPerStep": 2, "warmStartSteps": 0, "learningRate": 5e-2},
        "rollout": {"replicas": 1, "engine": "transformers"},
        "checkpoint": {"everySteps": 100},
        "monitoring": {"enabled": False},
    },
}


def test_lora_dedicated_scorers_keep_rd_at_one_through_a_respawn(ray_session: None, tmp_path: Path) -> None:
    on_step, killed = kill_at_version(2, expect=1, title="ray::DedicatedScorer")

    result = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path / "run"), on_step=on_step)
    s = survived_with_rd_one(result, killed, versions=6)
    assert s["dedicated"]["replacements"] == 1, s["dedicated"]
    print("dedicated:", s["dedicated"])
