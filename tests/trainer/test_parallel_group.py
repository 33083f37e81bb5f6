"""The actor as a group of Ray actors in the real driver loop: ``actor.replicas: 2`` CPU ranks (DP=2) train,
sync weights to rollout, checkpoint (rank 0 writes) and resume (every rank loads) on a local Ray."""

import math

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

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


def test_a_data_parallel_actor_group_trains_checkpoints_and_resumes(ray_session: None, tmp_path) -> None:
    first = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path / "run", port=0))
    assert [r["version"] for r in first.steps] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) for r in first.steps)
    assert (first.run_dir / "checkpoints" / "step-000004" / "meta.json").exists()
    again = run_job(validate_job(JOB), RunOptions(run_dir=first.run_dir, steps=5, port=0))
    assert again.summary.resumed_from.endswith("step-000004")
    assert [r["version"] for r in again.steps] == [1, 2, 3, 4, 5]


def test_the_data_parallel_example_runs_and_its_versions_advance(ray_session: None, tmp_path) -> None:
    """``examples/data-parallel.yaml`` (the quickstart at DP=2) through the path ``asyncrl run`` takes, a few
    steps from a random init (its 300 warm-start steps are the long part of the real run)."""
    from pathlib import Path

    from asyncrl.api.validation import load_jobs
    from asyncrl.trainer.driver.loop.gang_restart import run_with_restarts

    (job,) = load_jobs(str(Path(__file__).resolve().parents[2] / "examples" / "data-parallel.yaml"))
    assert job.spec.actor.world_size == 2 and job.spec.actor.data_parallel == 2
    result = run_with_restarts(job, RunOptions(run_dir=tmp_path / "run", port=0, steps=3, warm_start=False))
    assert result.summary.status == "succeeded" and result.summary.restarts == 0, result.summary
    assert [r["version"] for r in result.steps if "version" in r] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in result.steps if "version" in r)
