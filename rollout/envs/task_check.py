"""The start-up check of a task's user code, run in a child process that holds no credentials.

A job whose environment, reward or dataset cannot be loaded must fail at start with one clear line
(exit code 2), not in every rollout worker. Knowing that means importing and constructing the user's
code once. The driver never does it in its own process: :func:`check_task` runs :func:`bind_task`
in a fresh interpreter (``python -m asyncrl.rollout.envs.task_check``) and reads its verdict from a
pipe of its own, so nothing the user's code prints can pass for it.

What the child gets, and what it does not:

- the driver's environment without the credentials the driver holds (:func:`child_environment`):
  no ``KUBERNETES_*`` service variables, no ``KUBECONFIG``, no Ray token, no status relay address;
- no ServiceAccount token file either: in a cluster the driver container has none at all. The token
  of ``<job>-status`` is mounted only in the driver pod's ``status`` sidecar container, which runs
  no user code (``operator/builders.py``, ``docs/security.md``, "User code and the status token");
- no memory of the driver: the user's module is never imported into the driver process (the
  driver's held-out samples come from :func:`~asyncrl.rollout.envs.binding.task_samples`).

A factory that raises gives the same message as :func:`bind_task` in-process (the
:class:`EnvLoadError` line, with the file and line of the raise). A child that ends without a
verdict (``os._exit``, a crash) or runs past ``timeout_s`` is reported as such, with its last output.
"""

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from asyncrl.api.constants import ENV_RAY_AUTH_TOKEN, ENV_STATUS_RELAY
from asyncrl.api.task import TaskSpec

CHECK_TIMEOUT_S = 300.0  # importing and constructing the task once (a constructor may load a large file)
OUTPUT_TAIL_BYTES = 64 * 1024  # of the child's stdout + stderr, copied to the driver's stderr
# What a credential looks like in the driver's environment: the API server's service variables (the
# in-cluster client config starts from them), a kubeconfig, Ray's token (and its file), the relay's socket.
SCRUBBED_PREFIXES = ("KUBERNETES_",)
SCRUBBED_NAMES = frozenset({"KUBECONFIG", ENV_RAY_AUTH_TOKEN, f"{ENV_RAY_AUTH_TOKEN}_PATH", ENV_STATUS_RELAY})


def child_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the credentials of :data:`SCRUBBED_NAMES` and :data:`SCRUBBED_PREFIXES`."""
    return {k: v for k, v in env.items() if k not in SCRUBBED_NAMES and not k.startswith(SCRUBBED_PREFIXES)}


def _what(task: TaskSpec) -> str:
    if task.environment is not None:
        return f"spec.task.environment {task.environment!r}"
    if task.agent is not None:
        return f"spec.task.agent {task.agent!r}"
    if task.reward is not None:
        return f"spec.task.reward {task.reward!r}"
    return "spec.task"


def runs_user_code(task: TaskSpec) -> bool:
    """Whether binding ``spec.task`` imports the user's code: an ``environment``, ``agent`` or ``reward`` import path
    (a built-in task, a dataset scored by a ``rewardService`` or an external agent runs asyncrl's code only)."""
    from asyncrl.api.agent import EXTERNAL

    return (task.environment is not None or task.reward is not None
            or (task.agent is not None and task.agent != EXTERNAL))


def check_task(task: TaskSpec, *, workers: int = 1, seed: int = 0, timeout_s: float = CHECK_TIMEOUT_S) -> str | None:
    """None when ``spec.task`` binds, else the one-line problem: in a credential-free child process whenever
    that imports the user's code (:func:`runs_user_code`), in this one otherwise (no interpreter to start)."""
    if not runs_user_code(task):
        from asyncrl.rollout.envs.binding import EnvLoadError, bind_task

        try:
            bind_task(task, workers=workers, seed=seed)
        except EnvLoadError as exc:
            return str(exc)
        return None
    request = json.dumps({"task": task.model_dump(mode="json", by_alias=True), "workers": workers, "seed": seed})
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncrl.rollout.envs.task_check", "--verdict-fd", str(write_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=child_environment(os.environ), pass_fds=(write_fd,), close_fds=True,
        )
    finally:
        os.close(write_fd)  # the child holds the only write end: EOF on read_fd once it is gone
    with os.fdopen(read_fd, "rb") as verdict_pipe:
        try:
            output, _ = proc.communicate(request.encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
            _relay(output)
            return (f"{_what(task)}: importing and constructing it took longer than {timeout_s:g} s (the check "
                    "process was stopped); a constructor must not block: load large files lazily or from a "
                    "mounted volume")
        verdict = verdict_pipe.read()
    _relay(output)
    try:
        answer: dict[str, Any] = json.loads(verdict)
    except ValueError:
        last = _last_line(output)
        return (f"{_what(task)}: the check process ended (exit code {proc.returncode}) before it could say whether "
                f"the task loads; importing or constructing it must not exit the interpreter"
                + (f"; its last output: {last}" if last else ""))
    return None if answer.get("ok") else str(answer.get("problem"))


def _relay(output: bytes) -> None:
    """The child's output (the user's prints, warnings, a traceback) on the driver's stderr, its tail only."""
    if output:
        sys.stderr.write(output[-OUTPUT_TAIL_BYTES:].decode("utf-8", "replace"))
        sys.stderr.flush()


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output[-OUTPUT_TAIL_BYTES:].decode("utf-8", "replace").splitlines()]
    return next((line for line in reversed(lines) if line), "")[:500]


def _child(verdict_fd: int) -> int:
    """The child: read the request from stdin, bind the task, write the verdict to ``verdict_fd``."""
    from asyncrl.rollout.envs.binding import EnvLoadError, bind_task

    with os.fdopen(verdict_fd, "w") as out:
        request = json.loads(sys.stdin.read())
        task = TaskSpec.model_validate(request["task"])
        try:
            bind_task(task, workers=int(request["workers"]), seed=int(request["seed"]))
        except EnvLoadError as exc:
            out.write(json.dumps({"ok": False, "problem": str(exc)}))
            return 0
        out.write(json.dumps({"ok": True}))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asyncrl.rollout.envs.task_check")
    parser.add_argument("--verdict-fd", type=int, required=True)
    return _child(parser.parse_args(argv).verdict_fd)


if __name__ == "__main__":
    sys.exit(main())
