"""``asyncrl probe`` and Ray token auth: the pure checks, then a real Ray head and worker nodes on
this machine (every Ray process in its own subprocess with its own token; nothing of Ray runs in the
test process, whose Ray would cache its first token)."""

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asyncrl.trainer.cli import main
from asyncrl.trainer.cli.probe import NodeView, describe, has_joined, split_address, wait_for

RAY = str(Path(sys.executable).with_name("ray"))
ASYNCRL = [sys.executable, "-m", "asyncrl.trainer.cli"]


def test_joined_means_an_alive_node_with_this_ip_and_the_role_resource() -> None:
    head = NodeView("10.0.0.9", "ALIVE", {"driver": 1.0}, is_head=True)
    rollout = NodeView("10.0.0.1", "ALIVE", {"rollout": 1.0, "CPU": 4.0})
    assert has_joined([head, rollout], "10.0.0.1", "rollout")
    assert not has_joined([head, rollout], "10.0.0.1", "actor")  # wrong role resource
    assert not has_joined([head], "10.0.0.1", "rollout")
    # a restarted pod may reuse the IP of a dead node: only an ALIVE one counts
    dead = NodeView("10.0.0.1", "DEAD", {"rollout": 1.0})
    assert not has_joined([head, dead], "10.0.0.1", "rollout")
    assert describe([head], "10.0.0.1", "rollout") == "no Ray node with IP 10.0.0.1 is registered with the GCS yet"
    assert "DEAD" in describe([dead], "10.0.0.1", "rollout")
    assert "does not advertise the resource 'actor'" in describe([rollout], "10.0.0.1", "actor")


def test_wait_is_bounded_and_says_why_each_time() -> None:
    t = [0.0]
    said: list[str] = []
    answers = iter(["GCS down", "GCS down", None])

    def sleep(s: float) -> None:
        t[0] += s

    assert wait_for(lambda: next(answers), wait_s=10, interval_s=2, clock=lambda: t[0], sleep=sleep, say=said.append)
    assert said == ["waiting (0 of 10 s): GCS down", "waiting (2 of 10 s): GCS down", "ready after 4 s (3 attempts)"]
    said.clear()
    t[0] = 0.0
    assert not wait_for(lambda: "GCS down", wait_s=5, interval_s=2, clock=lambda: t[0], sleep=sleep, say=said.append)
    assert said[-1] == "gave up after 6 s (4 attempts): GCS down" and len(said) == 4  # 0, 2, 4, 6


def test_probe_arguments_are_checked_before_anything_connects(capsys: pytest.CaptureFixture[str]) -> None:
    assert split_address("j-driver-0.j.ns.svc:6379") == ("j-driver-0.j.ns.svc", 6379)
    assert main(["probe", "gcs", "--address", "no-port"]) == 2
    assert "must be HOST:PORT" in capsys.readouterr().err
    assert main(["probe", "joined", "--address", "h:6379"]) == 2
    assert "--resource is required" in capsys.readouterr().err
    assert main(["probe", "gcs", "--address", "h:6379", "--wait", "-1"]) == 2


# -------------------------------------------------------------------- real Ray processes

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _private_ports() -> list[str]:
    """Ports of one raylet's helpers: several raylets share this host (a pod has its own)."""
    names = ("node-manager", "object-manager", "metrics-export", "dashboard-agent-listen",
             "dashboard-agent-grpc", "runtime-env-agent")
    base = _free_port() % 20000 + 30000  # a 20-port range for the worker processes
    return [*(f"--{n}-port={_free_port()}" for n in names),
            f"--min-worker-port={base}", f"--max-worker-port={base + 19}"]


def _env(token: str) -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    return env


def _probe(token: str, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ASYNCRL, "probe", *args], env=_env(token), capture_output=True, text=True,
                          timeout=timeout)


class RayNodes:
    """``ray start --block`` processes (the head and workers) of one test; stopped by PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, name: str, token: str, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", f"--temp-dir={self.root / name}",
                                 *_private_ports(), *args], env=_env(token), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        self.procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.terminate()  # `ray start --block` stops its node's processes on SIGTERM
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_all(self) -> None:
        for proc in reversed(self.procs):  # workers leave before the head
            self.stop(proc)


@pytest.fixture
def ray_nodes() -> Iterator[RayNodes]:
    root = Path(tempfile.mkdtemp(prefix="arl-"))  # short: Ray's unix socket paths must stay < 108 bytes
    nodes = RayNodes(root)
    try:
        yield nodes
    finally:
        nodes.stop_all()
        shutil.rmtree(root, ignore_errors=True)


def _until(check: Callable[[], subprocess.CompletedProcess[str]], timeout: float,
           what: str) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last.returncode == 0 or time.monotonic() > deadline:
            assert last.returncode == 0, f"{what}: {last.stdout}{last.stderr}"
            return last
        time.sleep(1)


def test_gcs_wait_gives_up_when_nothing_listens() -> None:
    # _probe's subprocess timeout is only a hang guard: the probe ends by itself, and says so
    out = _probe("t", "gcs", "--address", f"127.0.0.1:{_free_port()}", "--wait", "1", "--interval", "0.5")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "nothing accepts connections" in out.stdout
    gave_up = re.search(r"gave up after \d+ s \((\d+) attempts\)", out.stdout)
    assert gave_up and int(gave_up[1]) >= 1, out.stdout
    assert out.stdout.count("gave up after") == 1  # one verdict, after its own waiting lines


@pytest.mark.slow  # 40-60 s on 2 shared cores: a head, three raylets, a dozen probe processes
def test_token_auth_a_shared_token_joins_a_wrong_one_is_refused(ray_nodes: RayNodes) -> None:
    """The job's pods share one token (its Secret): a worker with it joins and turns ready; a worker
    or probe with another token is refused by the head's GCS."""
    token, wrong = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    gcs = f"127.0.0.1:{_free_port()}"
    head = ray_nodes.start("head", token, "--head", f"--port={gcs.rsplit(':', 1)[1]}", "--num-cpus=0",
                           "--include-dashboard=false", f"--resources={json.dumps({'driver': 1})}")
    # the init container: waits for the head's GCS, then answers at once
    out = _probe(token, "gcs", "--address", gcs, "--wait", "60", "--interval", "0.5")
    assert out.returncode == 0 and "ready after" in out.stdout, out.stdout + out.stderr
    assert head.poll() is None
    not_yet = _probe(token, "joined", "--address", gcs, "--resource", "rollout")
    assert not_yet.returncode == 1 and "not ready" in not_yet.stderr, not_yet.stderr  # the head at most

    # side by side (each takes seconds): a raylet with the wrong token, one with the job's token
    intruder = ray_nodes.start("intruder", wrong, f"--address={gcs}", "--num-cpus=1",
                               f"--resources={json.dumps({'rollout': 1})}")
    worker = ray_nodes.start("rollout", token, f"--address={gcs}", "--num-cpus=1",
                             f"--resources={json.dumps({'rollout': 1})}")
    refused = _probe(wrong, "gcs", "--address", gcs, "--wait", "60")
    assert refused.returncode == 2 and "refused this pod's Ray token" in refused.stderr, refused.stderr
    try:
        joined = _until(lambda: _probe(token, "joined", "--address", gcs, "--resource", "rollout"), 180,
                        "rollout joined")
    except AssertionError as exc:  # say why: the worker's own output, if it gave up
        ended = worker.poll() is not None
        raise AssertionError(f"{exc}\nworker {'exited ' + str(worker.returncode) if ended else 'still running'}: "
                             f"{worker.communicate(timeout=5)[0][-3000:] if ended else ''}") from exc
    assert "is ALIVE" in joined.stdout
    other_role = _probe(token, "joined", "--address", gcs, "--resource", "actor")
    assert other_role.returncode == 1, other_role.stdout
    intruder_out, _ = intruder.communicate(timeout=120)
    assert intruder.returncode != 0 and "InvalidAuthToken" in intruder_out, intruder_out[-2000:]

    ray_nodes.stop(worker)  # the raylet leaves: the pod is no longer ready
    deadline = time.monotonic() + 60
    while (gone := _probe(token, "joined", "--address", gcs, "--resource", "rollout")).returncode == 0:
        assert time.monotonic() < deadline, "the stopped node still counts as joined"
        time.sleep(1)
    assert "DEAD" in gone.stderr or "does not advertise" in gone.stderr, gone.stderr
