"""The real job (``asyncrl`` driver, local Ray, real processes) with an OpenAI-API agent: the agent function's
sessions train for two steps through the rollout workers' endpoint, every trained token scored under its own
version (exact, snapshot) with an fp32 engine, so ``r_d = pi_old / mu_old`` is 1 up to rounding; the agent
metrics reach the summary's counters."""

import copy
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = pytest.mark.slow  # a two-step job with two rollout workers: ~30-60 s on loaded cores

PLUGINS = str(Path(__file__).resolve().parents[1] / "rollout" / "plugins")
JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "agent-job"},
    "spec": {
        "async": {"maxStaleness": 1, "partialRollout": True},
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "snapshot"},
        "model": {"rolloutDtype": "float32"},
        "task": {"agent": "toy_agents:three_turns", "pythonPath": [PLUGINS], "groupSize": 2, "maxNewTokens": 64},
        "train": {"steps": 2, "promptsPerStep": 2, "warmStartSteps": 0},
        "rollout": {"replicas": 2},
        "monitoring": {"enabled": False},
    },
}


class _Batches:
    """What the actor trained on: every trajectory of every batch."""

    def __init__(self) -> None:
        self.trajs: list[Any] = []

    def __call__(self, groups: list[Any], version: int) -> None:
        self.trajs += [t for g in groups for t in g]


def test_an_agent_function_trains_through_the_endpoint_with_exact_old_logits(ray_session: None, tmp_path: Path) -> None:
    batches = _Batches()
    result = run_job(validate_job(copy.deepcopy(JOB)), RunOptions(run_dir=tmp_path / "run"), on_batch=batches)
    s = result.summary.to_json()
    assert s["status"] == "succeeded", s
    steps = [r for r in result.steps if "version" in r]
    assert [r["version"] for r in steps] == [1, 2]
    for r in steps:
        assert r["reference"] == "exact" and r["keep_ratio"] == 1.0, r
        assert abs(r["rd_min"] - 1.0) < 1e-4 and abs(r["rd_max"] - 1.0) < 1e-4, r
    assert batches.trajs
    for t in batches.trajs:
        assert t.info["agent"]["requests"] == 3 and 3 <= sum(t.loss_mask) <= 18  # three turns of <= max_tokens=6
        assert all(v >= 0 for v, m in zip(t.versions, t.loss_mask, strict=True) if m)
