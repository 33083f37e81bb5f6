"""The real job (``asyncrl`` driver, local Ray, real processes) with tensor-parallel dedicated scorers
(``oldLogits.dedicated.tensorParallel: 2`` beside a one-rank actor): every trained token gets its exact
``pi_old`` (keep ratio 1, ``r_d`` ~ 1 with an fp32 engine) whether the versions reach the scorer gangs by the
object store or by broadcast, and a gang rank killed mid-run gets its gang replaced, counted once."""

import copy
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.hosts.ray_env import local_ray
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.kill_worker import kill_at_version, ray_pids
from tests.trainer.test_e2e_exact import RD_TOLERANCE
from tests.trainer.test_weightsync_job import JOB

pytestmark = pytest.mark.slow  # a 3-4 step job with a two-rank scorer gang: ~1.5 min each on loaded cores


def _job(transport: str, steps: int) -> dict[str, Any]:
    job = copy.deepcopy(JOB)
    job["metadata"]["name"] = f"gang-{transport.lower()}"
    job["spec"].update(
        actor={"weightSync": {"transport": transport, "bucketMiB": 1}},
        correction={"reference": "exact"}, model={"rolloutDtype": "float32"},
        oldLogits={"strategy": "dedicated", "dedicated": {"tensorParallel": 2, "gpusPerReplica": 0}},
    )
    job["spec"]["train"] = {**job["spec"]["train"], "steps": steps}
    return job


def _scorer_pids() -> list[int]:
    return ray_pids("ray::DedicatedScorer")


def _check_exact(result: Any, steps: int) -> None:
    s = result.summary.to_json()  # summary.json's form
    assert s["status"] == "succeeded", s
    assert [r["version"] for r in result.steps if "version" in r] == list(range(1, steps + 1))
    for r in result.steps:
        assert r["reference"] == "exact" and r["keep_ratio"] == 1.0, r
        # every token scored under its own version by the TP=2 gang: r_d = pi_old / mu_old is 1 up to rounding
        assert abs(r["rd_min"] - 1.0) < RD_TOLERANCE and abs(r["rd_max"] - 1.0) < RD_TOLERANCE, r
    d = s["dedicated"]
    assert d["scored_tokens"] > 0 and d["latest_version"] == steps, d


# Each job on a Ray of its own (no_shared_ray): on the session's shared Ray the second job's replaced gang waited
# for something the first job's gang still held, and hung (seen twice; not yet understood, so not hidden here).
def test_broadcast_to_a_tp2_scorer_gang(no_shared_ray: None, tmp_path: Path) -> None:
    with local_ray(num_cpus=2):
        result = run_job(validate_job(_job("broadcast", 3)), RunOptions(run_dir=tmp_path / "run"))
    _check_exact(result, 3)
    assert result.summary.dedicated["replacements"] == 0


def test_a_killed_gang_rank_gets_its_gang_replaced_once(no_shared_ray: None, tmp_path: Path) -> None:
    # one rank of the gang's two only: the other is stopped by the gang
    on_step, killed = kill_at_version(2, expect=2, title="ray::DedicatedScorer", pick=max)

    with local_ray(num_cpus=2):
        result = run_job(validate_job(_job("objectStore", 4)), RunOptions(run_dir=tmp_path / "run"),
                         on_step=on_step)
    assert killed
    _check_exact(result, 4)
    assert result.summary.dedicated["replacements"] == 1, result.summary.dedicated
    assert len(_scorer_pids()) == 0  # nothing left running after the job
