"""A plug-in environment living in tests/ (imported by path, as a user's) trained end to end for two
steps by the real driver (local Ray, rollout workers, actor), with some of its episodes failing."""

from pathlib import Path

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.rollout.trajectory import NO_VERSION, TrajectoryStatus
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = [pytest.mark.slow]
PLUGINS = str(Path(__file__).parent / "plugins")
JOB = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "plugin"},
    "spec": {
        "correction": {"reference": "current"},
        "async": {"maxStaleness": 1, "partialRollout": True},
        "task": {"environment": "toy_envs:AsyncRelay", "pythonPath": [PLUGINS],
                 # every 3rd sample's second step raises: those episodes abort, the job goes on
                 "args": {"turns": 3, "fault": "raise", "fail_at": 2, "faulty_seeds": 3},
                 "groupSize": 4, "maxNewTokens": 24, "envTimeoutSeconds": 10},
        "train": {"steps": 2, "promptsPerStep": 4},  # warmStartSteps unused: the plug-in has no demonstrations
        "eval": {"everySteps": 2, "prompts": 8},
        "rollout": {"replicas": 1},
    },
}


def test_a_plugin_environment_trains_two_steps_with_faults_counted(ray_session: None, tmp_path: Path) -> None:
    batches = []
    result = run_job(validate_job(JOB), RunOptions(run_dir=tmp_path, port=0),
                     on_batch=lambda groups, version: batches.append([t for g in groups for t in g]))
    assert [r["version"] for r in result.steps if "version" in r] == [1, 2]
    assert result.summary.warm_start is None and result.summary.env_errors["exception"] > 0
    trained = [t for b in batches for t in b]
    assert trained and all(t.task == "toy_envs:AsyncRelay" and t.status is not TrajectoryStatus.ABORTED
                           for t in trained)
    for t in trained:  # observations forced, never trained on; assistant tokens stamped
        for v, m in zip(t.versions, t.loss_mask, strict=True):
            assert (v == NO_VERSION) != m
    errors = result.summary.buffer["trajectories_aborted"]
    assert errors > 0  # the faulty samples' episodes were aborted and counted, the job finished
