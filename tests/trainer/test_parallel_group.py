"""The actor as a group of Ray actors in the real driver loop: ``examples/data-parallel.yaml`` (the quickstart at
``actor.replicas: 2``, DP=2 CPU ranks) through the path ``asyncrl run`` takes: it trains, syncs weights to
rollout, checkpoints (rank 0 seals the folder) and resumes (every rank loads) on the session's local Ray.
(One test: the example run and the hand-written DP=2 job beside it ran the same path twice.)"""

import math
from pathlib import Path

import pytest

from asyncrl.api.validation import load_jobs
from asyncrl.trainer.driver.loop.gang_restart import run_with_restarts
from asyncrl.trainer.driver.loop.training_loop import RunOptions

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data-parallel.yaml"


def test_the_data_parallel_example_trains_checkpoints_and_resumes(ray_session: None, tmp_path: Path) -> None:
    (job,) = load_jobs(str(EXAMPLE))
    assert job.spec.actor.world_size == 2 and job.spec.actor.data_parallel == 2
    # a checkpoint at version 2 (the example saves every 20): a few steps from a random init, the 300
    # warm-start steps of the real run being its long part
    spec = job.spec.model_copy(update={"checkpoint": job.spec.checkpoint.model_copy(update={"every_steps": 2})})
    job = job.model_copy(update={"spec": spec})
    first = run_with_restarts(job, RunOptions(run_dir=tmp_path / "run", port=0, steps=2, warm_start=False))
    assert first.summary.status == "succeeded" and first.summary.restarts == 0, first.summary
    assert [r["version"] for r in first.steps if "version" in r] == [1, 2]
    assert all(math.isfinite(r["loss"]) for r in first.steps if "version" in r)
    assert (first.run_dir / "checkpoints" / "step-000002" / "meta.json").exists()
    again = run_with_restarts(job, RunOptions(run_dir=first.run_dir, port=0, steps=3, warm_start=False))
    assert again.summary.status == "succeeded" and again.summary.restarts == 0, again.summary
    assert again.summary.resumed_from and again.summary.resumed_from.endswith("step-000002")
    assert [r["version"] for r in again.steps if "version" in r] == [1, 2, 3]  # the saved records, then 3
    assert all(math.isfinite(r["loss"]) for r in again.steps if "version" in r)
