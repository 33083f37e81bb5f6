"""The actor as a group of Ray actors in the real driver loop: ``actor.replicas: 2`` CPU ranks (DP=2) train,
sync weights to rollout, checkpoint (rank 0 writes) and resume (every rank loads) on a local Ray."""

import math

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop import RunOptions, run_job
from asyncrl.trainer.driver.ray_env import local_ray

pytestmark = pytest.mark.slow

JOB = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "dp2"},
    "spec": {
        "correction": {"reference": "ewma"},
        "task": {"name": "calculator", "groupSize": 4, "maxNewTokens": 24},
        "train": {"steps": 4, "promptsPerStep": 4, "warmStartSteps": 3, "minibatches": 2},
        "actor": {"replicas": 2, "gpusPerReplica": 0},
        "rollout": {"replicas": 1, "gpusPerReplica": 0},
        "checkpoint": {"everySteps": 4},
    },
}


def test_a_data_parallel_actor_group_trains_checkpoints_and_resumes(tmp_path) -> None:
    with local_ray(num_cpus=2):
        first = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path / "run", port=0))
        assert [r["version"] for r in first.steps] == [1, 2, 3, 4]
        assert all(math.isfinite(r["loss"]) for r in first.steps)
        assert (first.run_dir / "checkpoints" / "step-000004" / "meta.json").exists()
        again = run_job(validate_job(JOB), RunOptions(run_dir=first.run_dir, steps=5, port=0))
    assert again.summary["resumed_from"].endswith("step-000004")
    assert [r["version"] for r in again.steps] == [1, 2, 3, 4, 5]
