"""A tensor-parallel actor group in the real driver loop checkpoints and resumes: ``actor.replicas: 2`` CPU
ranks with ``tensorParallel: 2`` train (with a warm start, whose cache is a sharded folder too), write a
sharded checkpoint (every rank its shards, rank 0 seals it) and a second run resumes from it (every rank
loads its shards) and continues the version sequence."""

import json
import math

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = pytest.mark.slow

JOB = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "tp2"},
    "spec": {
        "correction": {"reference": "ewma"},
        "task": {"name": "calculator", "groupSize": 4, "maxNewTokens": 24},
        "train": {"steps": 2, "promptsPerStep": 4, "warmStartSteps": 2, "minibatches": 2},
        "actor": {"replicas": 2, "gpusPerReplica": 0, "megatron": {"tensorParallel": 2}},
        "rollout": {"replicas": 1, "gpusPerReplica": 0},
        "checkpoint": {"everySteps": 2},
    },
}


def test_a_tensor_parallel_actor_group_checkpoints_and_resumes(ray_session: None, tmp_path) -> None:
    first = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path / "run", port=0))
    assert [r["version"] for r in first.steps] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in first.steps)
    folder = first.run_dir / "checkpoints" / "step-000002"
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["format"] == "sharded" and meta["layout"]["tp"] == 2 and meta["layout"]["world"] == 2
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(meta["files"])  # both TP ranks wrote their shards
    again = run_job(validate_job(JOB), RunOptions(run_dir=first.run_dir, steps=3, port=0))
    assert again.summary.resumed_from.endswith("step-000002")
    assert [r["version"] for r in again.steps] == [1, 2, 3]
