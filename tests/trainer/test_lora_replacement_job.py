"""A LoRA job whose rollout worker is killed mid-run (slow, local Ray, real processes): the replacement gets the
actor's frozen base beside the current adapters (trainer/weight_sync/lora_base.py), joins the broadcast group
again, samples from base + current adapters, and the job finishes. Under the fp32 rollout and the exact snapshot
route, r_d = pi_old / mu_old is 1 within 1e-5 on every step, those trained on the replacement's tokens alone
included: a replacement that sampled from the base alone, or from another base, would be off by the adapters."""

import logging
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.kill_worker import kill_at_version, survived_with_rd_one

pytestmark = pytest.mark.slow  # a 6-step job with a kill and a replacement: 19 s idle, 42 s at load 3 on 2 cores

KILL_AT = 2
JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "lora-replacement"},
    "spec": {
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "snapshot"},
        "async": {"maxStaleness": 1},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64,
                  "rolloutDtype": "float32", "lora": {"rank": 4, "alpha": 8.0}},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 12},
        "train": {"steps": 6, "promptsPerStep": 2, "warmStartSteps": 0, "learningRate": 5e-2},
        "rollout": {"replicas": 1, "engine": "transformers"},
        "actor": {"weightSync": {"transport": "broadcast", "bucketMiB": 1}},
        "checkpoint": {"everySteps": 100},
        "monitoring": {"enabled": False},
    },
}


def test_a_killed_lora_rollout_worker_is_replaced_with_the_base_and_rd_stays_one(
        ray_session: None, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    on_step, killed = kill_at_version(KILL_AT, expect=1)

    caplog.set_level(logging.INFO, logger="asyncrl.trainer.driver.loop.weight_sync")
    batches: list[tuple[int, set[int]]] = []  # (the version that trains on it, the versions its tokens were sampled at)
    result = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path / "run"), on_step=on_step,
                     on_batch=lambda groups, v: batches.append(
                         (v, {x for g in groups for t in g for x in t.sampled_versions})))
    s = survived_with_rd_one(result, killed, versions=6)
    assert s["worker_replacements"] == 1, s
    # The one worker died after version KILL_AT: a batch all of whose tokens were sampled at a later version is
    # the replacement's alone (maxStaleness 1 keeps the dead worker's out of the last steps).
    own = [(v, seen) for v, seen in batches if seen and min(seen) > KILL_AT]
    print("batches (trained at, sampled at):", batches)
    assert own, batches
    assert "broadcast group formed again" in caplog.text  # the replacement joined the group for later versions
