"""The real job (``asyncrl`` driver, local Ray, real processes) whose agent function returns hostile rewards for most
sessions (1e30, 1e300, a 400-digit integer, NaN; issue 35): every such session is refused at the worker
(``spec.task.endpoint.maxRewardMagnitude``) and aborted, the job trains on the honest ones, and its reward metrics stay
finite. Before: one 1e30 session per group made the loss -1.4e22 and the gradient norm NaN (the job failed after 2
steps); 1e300 made every later step train 0 tokens and report reward_mean 1e300."""

import copy
import logging
import math
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.hosts.ray_env import local_ray
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = pytest.mark.slow  # a two-step job with one rollout worker: ~30-60 s on loaded cores

PLUGINS = str(Path(__file__).resolve().parents[1] / "rollout" / "plugins")
JOB: dict[str, Any] = {
    "apiVersion": "asyncrl.io/v1alpha1",
    "kind": "AsyncRLJob",
    "metadata": {"name": "hostile-agent-job"},
    "spec": {
        "async": {"maxStaleness": 1, "partialRollout": True},
        "model": {"rolloutDtype": "float32"},
        "task": {"agent": "hostile_agents:hostile_rewards", "pythonPath": [PLUGINS], "groupSize": 2,
                 "maxNewTokens": 16},
        "train": {"steps": 2, "promptsPerStep": 2, "warmStartSteps": 0},
        "rollout": {"replicas": 1},
        "monitoring": {"enabled": True},
    },
}


def test_a_job_survives_hostile_rewards_with_finite_reward_metrics(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    trained: list[Any] = []
    urls: list[str] = []
    refused: list[float] = []  # the driver's asyncrl_agent_requests_refused_total{reward_out_of_range} at each step

    def scrape(_: Any) -> None:
        with urllib.request.urlopen(urls[0], timeout=30) as r:
            text = r.read().decode()
        (family,) = [f for f in text_string_to_metric_families(text) if f.name == "asyncrl_agent_requests_refused"]
        refused.append(sum(x.value for x in family.samples
                           if x.name.endswith("_total") and x.labels["reason"] == "reward_out_of_range"))

    caplog.set_level(logging.INFO, logger="asyncrl")
    with local_ray(num_cpus=2):
        result = run_job(validate_job(copy.deepcopy(JOB)), RunOptions(run_dir=tmp_path / "run", port=0),
                         on_start=lambda s: urls.append(str(s["metrics_url"])), on_step=scrape,
                         on_batch=lambda groups, version: trained.extend(t for g in groups for t in g))
    s = result.summary.to_json()
    assert s["status"] == "succeeded", s
    steps = [r for r in result.steps if "version" in r]
    assert [r["version"] for r in steps] == [1, 2]
    for r in steps:
        assert math.isfinite(r["reward_mean"]) and 0.0 <= r["reward_mean"] < 1.0, r
        assert math.isfinite(r["loss"]), r
    # only honest rewards were trained on; the hostile sessions were refused and counted as aborted
    assert trained and all(0.0 <= t.reward < 1.0 for t in trained)
    errors = s["env_errors"]
    assert errors["agent_bad_request"] + errors["nonfinite_reward"] > 0, errors
    # the workers' refusals reached the driver's /metrics (before: 80,131 unauthorized in one run never did)
    assert refused and refused[-1] > 0, refused
    # the job says where its endpoint is (docs/agents.md: a harness connects there)
    assert "agent endpoint of rollout worker 0: http://127.0.0.1:" in caplog.text
