"""User environments can fail; the job cannot: each fault aborts its episode only and is counted.

The environments are plug-ins imported by path (tests/rollout/plugins/toy_envs.py), as a user's are.
"""

from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs.binding import EnvLoadError, bind_task
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker

PLUGINS = str(Path(__file__).parent / "plugins")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")


def relay_worker(factory: str = "Relay", timeout_s: float = 30.0, **args: Any) -> RolloutWorker:
    spec = TaskSpec(environment=f"toy_envs:{factory}", python_path=[PLUGINS], args=args, group_size=2,
                    max_new_tokens=40, env_timeout_seconds=timeout_s)
    w = RolloutWorker(spec, MODEL, AsyncSpec())
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    return w


@pytest.mark.parametrize("factory", ["Relay", "AsyncRelay"])
@pytest.mark.parametrize(
    ("fault", "reason", "timeout_s"),
    [
        ("raise", "exception", 30.0),
        ("reset", "exception", 30.0),
        ("hang", "timeout", 0.3),
        ("nan", "nonfinite_reward", 30.0),
        ("garbage", "bad_messages", 30.0),
        ("unencodable", "bad_messages", 30.0),
    ],
)
def test_a_fault_aborts_its_episodes_only_and_is_counted(factory: str, fault: str, reason: str,
                                                         timeout_s: float) -> None:
    # nan fires on the final turn; the others on the second turn (after one forced observation)
    fail_at = 3 if fault == "nan" else 2
    w = relay_worker(factory, timeout_s, turns=3, fault=fault, fail_at=fail_at, faulty_seeds=2, hang_s=3.0)
    out = w.generate(8)
    assert len(out) == 16 and len({t.traj_id for t in out}) == 16  # nothing lost, nothing duplicated
    bad = [t for t in out if t.status is TrajectoryStatus.ABORTED]
    good = [t for t in out if t.status is not TrajectoryStatus.ABORTED]
    assert bad and good  # some samples are faulty (seed-dependent), the rest run to their end
    assert all(t.info["env_error"] == reason for t in bad)
    assert {g.group_id for g in good}.isdisjoint({b.group_id for b in bad})  # a group shares its sample
    # the healthy episodes are whole: 3 turns, the relay's reward (its own verdict, not truncated)
    assert all(t.status is TrajectoryStatus.FINISHED and t.info["turns"] == 3 for t in good)
    assert w.env_errors()[reason] == len(bad) and sum(w.env_errors().values()) == len(bad)
    s = w.stats()
    assert s.env_errors == len(bad) and s.trajectories_aborted == len(bad)
    assert s.trajectories_finished == len(good)
    # the worker keeps working after the faults
    assert len(w.generate(1)) == 2


def test_a_factory_that_cannot_load_fails_at_start_with_the_reason() -> None:
    with pytest.raises(EnvLoadError, match=r"toy_envs:Broken\(\*\*\{'level': 3\}\) raised ValueError: level 3 needs"):
        bind_task(TaskSpec(environment="toy_envs:Broken", python_path=[PLUGINS], args={"level": 3}))
    with pytest.raises(EnvLoadError, match="no module 'no_such_env' on the Python path"):
        bind_task(TaskSpec(environment="no_such_env:Env", python_path=[PLUGINS]))
    with pytest.raises(EnvLoadError, match="toy_envs has no attribute 'Nope'"):
        bind_task(TaskSpec(environment="toy_envs:Nope", python_path=[PLUGINS]))
    with pytest.raises(EnvLoadError, match="makes a tuple without reset and step"):
        bind_task(TaskSpec(environment="toy_envs:EVERY_CHAR.__class__", python_path=[PLUGINS]))
    assert EnvLoadError.exit_code == 2


def test_asyncrl_run_refuses_an_environment_that_cannot_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.trainer.cli import main

    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: broken}\n"
        f"spec:\n  task:\n    environment: toy_envs:Broken\n    pythonPath: [{PLUGINS}]\n    args: {{level: 2}}\n"
    )
    assert main(["run", str(job), "--steps", "1"]) == 2  # before Ray starts
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"{job}: spec.task.environment: toy_envs:Broken(**{{'level': 2}}) raised ValueError: "
                              "level 2 needs a licence key")
