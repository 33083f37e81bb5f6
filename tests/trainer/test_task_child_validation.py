"""The driver checks the task's user code at start in a child process that holds none of its credentials.

Before: ``asyncrl driver`` imported and constructed ``spec.task`` in its own process, with the Ray token,
the API server's address and (in a cluster) the ``<job>-status`` token file at hand; the user's module
stayed imported in the driver. Now :func:`check_task` runs it in a fresh interpreter with those
removed; the token file is in no container that runs user code (``test_builders_user_code.py``, and
on the real API server ``tests/operator/test_server_dataset_volume.py``).
"""

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.task import TaskSpec
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.rollout.envs.binding import EnvLoadError, bind_task, task_samples
from asyncrl.rollout.envs.task_check import check_task, child_environment, runs_user_code

PLUGINS = str(Path(__file__).parents[1] / "rollout" / "plugins")
SNOOP = '''
import json, os

class Snoop:
    """Records what a constructor at job start can see: credentials in the environment, the token file."""

    def __init__(self, out: str, token_path: str, names: list) -> None:
        try:
            token = open(token_path).read()
        except OSError as exc:
            token = type(exc).__name__
        with open(out, "w") as f:
            json.dump({"pid": os.getpid(), "env": {n: os.environ.get(n) for n in names}, "token": token}, f)

    def reset(self, sample):
        raise NotImplementedError

    def step(self, message):
        raise NotImplementedError
'''
EXITS = '''
import os

class Exits:
    def __init__(self) -> None:
        print("constructing Exits: about to leave", flush=True)
        os._exit(0)
'''
HANGS = '''
import threading

class Hangs:
    def __init__(self) -> None:
        threading.Event().wait()  # never set: a constructor that blocks for good
'''


def driver_container_env() -> dict[str, str]:
    """The driver container's environment as the kubelet gives it: the operator's env list (the Ray token's
    secretKeyRef resolved) and the API server's service variables."""
    spec = AsyncRLJobSpec.model_validate({})
    pod = desired(JobRef("j", "ns", "uid-1"), spec, OperatorSettings(job_image="img:1"), 0).pods["j-driver-0"]
    env = {e["name"]: e.get("value", "ray-token-of-the-job") for e in pod.manifest["spec"]["containers"][0]["env"]}
    return {**env, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_PORT": "tcp://10.96.0.1:443", "KUBECONFIG": "/home/u/.kube/config"}


def write_module(folder: Path, name: str, source: str) -> str:
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return str(folder)


def test_a_constructor_at_job_start_sees_no_credential(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = driver_container_env()
    credentials = ["RAY_AUTH_TOKEN", C.ENV_STATUS_RELAY, "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT",
                   "KUBERNETES_PORT", "KUBECONFIG"]
    assert set(credentials) <= set(env)  # the driver process holds every one of them
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "seen.json"
    task = TaskSpec(environment="snoop:Snoop", python_path=[write_module(tmp_path, "snoop", SNOOP)],
                    args={"out": str(out), "token_path": f"{C.SERVICE_ACCOUNT_DIR}/token",
                          "names": [*credentials, C.ENV_JOB_NAME]})
    assert check_task(task) is None
    seen = json.loads(out.read_text())
    assert seen["pid"] != os.getpid()  # constructed in the child, not here
    assert seen["env"] == {**dict.fromkeys(credentials), C.ENV_JOB_NAME: "j"}  # the job's name is no secret
    # nothing mounts a token where the in-cluster client looks (test_builders_user_code: no such mount)
    assert seen["token"] == "FileNotFoundError"
    assert "snoop" not in sys.modules  # the user's module never entered the driver's process


def test_child_environment_keeps_everything_but_the_credentials() -> None:
    env = {"PATH": "/bin", "HOME": "/home/u", "HF_HOME": "/cache", "PYTHONPATH": "/code", "RAY_ADDRESS": "h:6379",
           "RAY_AUTH_TOKEN": "t", "RAY_AUTH_TOKEN_PATH": "/t", "KUBERNETES_SERVICE_HOST": "10.0.0.1",
           "KUBECONFIG": "/k", C.ENV_STATUS_RELAY: "/var/run/asyncrl/status.sock"}
    assert child_environment(env) == {"PATH": "/bin", "HOME": "/home/u", "HF_HOME": "/cache",
                                      "PYTHONPATH": "/code", "RAY_ADDRESS": "h:6379"}


@pytest.mark.parametrize("task", [
    TaskSpec(environment="toy_envs:Broken", python_path=[PLUGINS], args={"level": 2}),  # the constructor raises
    TaskSpec(environment="no_such_env:Env", python_path=[PLUGINS]),  # no such module
    TaskSpec(environment="toy_envs:EVERY_CHAR.__class__", python_path=[PLUGINS]),  # not an environment
], ids=["raises", "no-module", "not-an-environment"])
def test_a_failing_factory_gives_the_same_line_as_in_process(task: TaskSpec) -> None:
    with pytest.raises(EnvLoadError) as in_process:
        bind_task(task)
    assert check_task(task) == str(in_process.value)


def test_the_driver_command_refuses_a_broken_factory_with_that_line(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from asyncrl.trainer.cli import main

    job = tmp_path / "job.yaml"
    job.write_text("apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: broken}\n"
                   f"spec:\n  task:\n    environment: toy_envs:Broken\n    pythonPath: [{PLUGINS}]\n"
                   "    args: {level: 2}\n")
    assert main(["driver", "--spec", str(job)]) == 2  # before the Ray head starts
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"{job}: spec.task.environment: toy_envs:Broken(**{{'level': 2}}) raised ValueError: "
                           "level 2 needs a licence key (")
    source = (Path(PLUGINS) / "toy_envs.py").read_text().splitlines()
    raise_line = 1 + next(i for i, text in enumerate(source) if 'needs a licence key")' in text)
    assert last.endswith(f"toy_envs.py:{raise_line})"), last  # the file and line of the raise, as before


def test_a_constructor_that_exits_the_interpreter_is_reported(tmp_path: Path) -> None:
    task = TaskSpec(environment="exits:Exits", python_path=[write_module(tmp_path, "exits", EXITS)])
    problem = check_task(task)
    assert problem == ("spec.task.environment 'exits:Exits': the check process ended (exit code 0) before it could "
                       "say whether the task loads; importing or constructing it must not exit the interpreter; "
                       "its last output: constructing Exits: about to leave")


def test_a_constructor_that_blocks_is_stopped_at_the_time_limit(tmp_path: Path) -> None:
    task = TaskSpec(environment="hangs:Hangs", python_path=[write_module(tmp_path, "hangs", HANGS)])
    problem = check_task(task, timeout_s=1.0)  # blocks for good: stopped whether in the import or the constructor
    assert problem is not None and problem.startswith(
        "spec.task.environment 'hangs:Hangs': importing and constructing it took longer than 1 s (the check "
        "process was stopped)"), problem


def dataset_job(path: str) -> dict[str, Any]:
    return {"task": {"dataset": {"path": path, "heldoutFraction": 0.5}, "reward": "my_reward:score",
                     "pythonPath": [str(Path(__file__).parents[2] / "examples" / "tasks")]},
            "rollout": {"replicas": 1, "template": {
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
                "volumeMounts": [{"name": "data", "mountPath": str(Path(path).parent)}]}}}


def test_a_dataset_on_the_mounted_volume_validates_in_the_driver(tmp_path: Path) -> None:
    mount = tmp_path / "mnt" / "data"  # the volume, where the driver container now mounts it
    mount.mkdir(parents=True)
    rows = [{"prompt": f"what is {i} + {i}?", "answer": str(2 * i)} for i in range(40)]
    (mount / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = AsyncRLJobSpec.model_validate(dataset_job(str(mount / "train.jsonl")))
    pod = desired(JobRef("j", "ns", "u"), spec, OperatorSettings(job_image="i"), 0).pods["j-driver-0"].manifest
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["data"] == str(mount)  # the driver container has the dataset's volume
    assert check_task(spec.task, workers=1, seed=spec.train.seed) is None
    heldout = task_samples(spec.task, workers=1, seed=spec.train.seed).heldout(4, 0)
    assert len(heldout) == 4 and {s["prompt"] for s in heldout} <= {r["prompt"] for r in rows}
    # the same file absent (the volume not mounted, as before): the driver refuses the job with the path
    missing = AsyncRLJobSpec.model_validate(dataset_job(str(tmp_path / "elsewhere" / "train.jsonl")))
    problem = check_task(missing.task)
    assert problem is not None and str(tmp_path / "elsewhere" / "train.jsonl") in problem, problem


def test_task_samples_are_bind_tasks_without_user_code(tmp_path: Path) -> None:
    broken = TaskSpec(environment="toy_envs:Broken", python_path=[PLUGINS], args={"level": 2})  # raises if built
    working = TaskSpec(environment="toy_envs:Relay", python_path=[PLUGINS])
    assert task_samples(broken).heldout(3, 7) == bind_task(working).samples.heldout(3, 7)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "answer": i}) + "\n" for i in range(30)))
    data = AsyncRLJobSpec.model_validate(dataset_job(str(tmp_path / "d.jsonl"))).task
    assert task_samples(data, workers=2, seed=5).heldout(6, 1) == bind_task(data, workers=2, seed=5).samples.heldout(6, 1)
    builtin = TaskSpec(name="arithmetic")
    assert task_samples(builtin).heldout(5, 3) == bind_task(builtin).samples.heldout(5, 3)


def test_a_task_without_user_code_is_checked_in_process_with_the_same_line(tmp_path: Path) -> None:
    missing = str(tmp_path / "absent.jsonl")
    served = TaskSpec.model_validate({"dataset": {"path": missing}, "rewardService": {"url": "http://127.0.0.1:9/s"}})
    assert [runs_user_code(t) for t in (served, TaskSpec(), TaskSpec(environment="m:E"),
                                        TaskSpec.model_validate({"dataset": {"path": missing}, "reward": "m:f"}))] \
        == [False, False, True, True]
    with pytest.raises(EnvLoadError) as in_process:
        bind_task(served)
    assert check_task(served) == str(in_process.value) and missing in str(in_process.value)
    assert check_task(TaskSpec()) is None  # the built-in task (the quickstart) starts no second interpreter
