"""The agent runner process (rollout/agent/runner.py): a user's agent function that ends the runner's interpreter
or blocks its event loop costs the sessions in flight there, counted, and the worker goes on with a new runner;
an agent that the runner cannot import by its name fails the worker's start, naming spec.task.agent."""

from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.agent.runner import AgentLoadError
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker

PLUGINS = str(Path(__file__).parent / "plugins")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")


@pytest.fixture(autouse=True)
def _own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_AGENTS_DIR", str(tmp_path))  # the toy agents' "first time" markers, per test
    import sys

    sys.modules.pop("toy_agents", None)  # re-read $TOY_AGENTS_DIR in this process too


def _worker(agent: str, **task: Any) -> RolloutWorker:
    spec = TaskSpec(agent=agent, python_path=[PLUGINS], **{"group_size": 2, "max_new_tokens": 200, **task})
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True))
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    return w


@pytest.mark.parametrize(("agent", "reason"), [
    ("toy_agents:exits_once", "agent_exception"),  # os._exit in the runner
    ("toy_agents:blocks_once", "timeout"),  # time.sleep on the runner's loop, past envTimeoutSeconds
])
def test_a_runner_that_dies_or_blocks_costs_its_episodes_and_the_worker_goes_on(agent: str, reason: str) -> None:
    w = _worker(agent, env_timeout_seconds=2.0)
    try:
        first = w.generate(1)
        runner = w.agent.loop if w.agent is not None else None
        assert runner is not None
        assert runner.wait_restarts(1, timeout=120)  # the runner was replaced (the worker's process lives on)
        second = w.generate(1)
    finally:
        w.close()
    aborted = [t for t in first if t.status is TrajectoryStatus.ABORTED]
    assert aborted and {t.info["env_error"] for t in aborted} == {reason}
    assert all(t.status is TrajectoryStatus.FINISHED or t in aborted for t in first)
    assert w.env_errors()[reason] == len(aborted)
    assert w.stats().trajectories_aborted == len(aborted)
    # the next episodes run in the new runner
    assert [t.status for t in second] == [TrajectoryStatus.FINISHED] * 2, ([(t.traj_id, t.status, t.info) for t in first], [(t.traj_id, t.status, t.info) for t in second])
    assert all(t.reward == 0.5 for t in second)


def test_an_agent_that_returns_a_non_number_costs_its_episode() -> None:
    w = _worker("toy_agents:returns_text")
    try:
        out = w.generate(1)
    finally:
        w.close()
    assert [t.info.get("env_error") for t in out] == ["agent_exception"] * 2
    assert all("returned str" in t.info["end_reason"] for t in out)


def test_an_agent_the_runner_cannot_import_fails_the_start_naming_the_field() -> None:
    with pytest.raises(AgentLoadError, match=r"spec\.task\.agent: 'runner_only_fails:agent' could not be imported "
                       r"in the agent runner process.*ImportError: this module needs"):
        _worker("runner_only_fails:agent")
