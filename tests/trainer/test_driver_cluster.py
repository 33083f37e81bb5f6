"""``asyncrl driver``: which roles are missing, waiting with a timeout, the head command, the
readiness fallback, spec validation before anything starts, and one ``--local`` run reporting
status to the fake API server."""

import json
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api import constants as C
from asyncrl.api.validation import validate_job
from asyncrl.trainer.cli import cluster, main
from asyncrl.trainer.cli.cluster import (
    ClusterTimeoutError,
    GcsHealthServer,
    checkpoint_root,
    default_run_dir,
    head_command,
    job_identity,
    missing_roles,
    required_roles,
    role_threads,
    token_auth,
    wait_for_roles,
)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))


def node(alive: bool = True, cpu: float = 4.0, **roles: float) -> dict[str, Any]:
    return {"Alive": alive, "Resources": {"CPU": cpu, "node:10.0.0.1": 1.0, **roles}}


HEAD = {"Alive": True, "Resources": {"driver": 1.0, "node:10.0.0.9": 1.0}}  # --num-cpus=0: no CPU key
REQUIRED = {"rollout": 2, "actor": 1}


def test_missing_roles_counts_alive_role_units() -> None:
    assert missing_roles([HEAD], REQUIRED) == {"rollout": (0, 2), "actor": (0, 1)}
    nodes = [HEAD, node(rollout=1), node(alive=False, rollout=1), node(actor=1)]
    assert missing_roles(nodes, REQUIRED) == {"rollout": (1, 2)}  # the dead node does not count
    assert missing_roles([*nodes, node(rollout=1, oldlogits=1)], REQUIRED) == {}
    assert missing_roles([node(cpu=2, rollout=2, actor=1)], REQUIRED) == {}  # --local: one node, all roles


def test_required_roles_and_threads() -> None:
    job = validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "j"},
                        "spec": {"rollout": {"replicas": 3}}})
    assert required_roles(job.spec) == {"rollout": 3, "actor": 1}
    nodes = [HEAD, node(cpu=8, rollout=1), node(cpu=6, rollout=1), node(cpu=16, actor=1)]
    assert role_threads(nodes, "rollout") == 6 and role_threads(nodes, "actor") == 16
    assert role_threads([HEAD], "actor") == 1


def test_wait_times_out_naming_the_missing_role() -> None:
    t = [0.0]
    polls: list[float] = []

    def nodes() -> list[dict[str, Any]]:
        polls.append(t[0])
        return [HEAD, node(actor=1), node(rollout=1)]

    def sleep(s: float) -> None:
        t[0] += s

    with pytest.raises(ClusterTimeoutError, match=r"rollout: 1 of 2") as err:
        wait_for_roles(nodes, REQUIRED, timeout_s=10, interval_s=2, clock=lambda: t[0], sleep=sleep)
    assert "actor" not in str(err.value).split("lacks")[1].split("(")[0]
    assert polls == [0, 2, 4, 6, 8, 10]


def test_wait_returns_once_everything_joined() -> None:
    seen = iter([[HEAD], [HEAD, node(actor=1)], [HEAD, node(actor=1), node(rollout=1), node(rollout=1)]])
    got = wait_for_roles(lambda: next(seen), REQUIRED, timeout_s=60, sleep=lambda s: None)
    assert len(got) == 4


def test_head_command_matches_the_operators_ports() -> None:
    cmd = head_command(dashboard=True)
    assert cmd[:4] == ["ray", "start", "--head", "--block"]
    # the ports the operator's Service and probes use: one definition in asyncrl.api.constants
    for flag in (f"--port={C.PORT_GCS}", "--num-cpus=0", "--dashboard-host=0.0.0.0",
                 f"--dashboard-port={C.PORT_DASHBOARD}", f"--ray-client-server-port={C.PORT_CLIENT}"):
        assert flag in cmd
    assert json.loads(next(c for c in cmd if c.startswith("--resources="))[len("--resources="):]) == \
        {C.RESOURCE_DRIVER: 1}
    assert "--include-dashboard=false" in head_command(dashboard=False)


def test_token_auth_needs_the_jobs_token() -> None:
    assert not token_auth({}) and not token_auth({"RAY_AUTH_MODE": "disabled"})
    assert token_auth({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t"})
    with pytest.raises(RuntimeError, match="job's Secret <job>-ray-token"):
        token_auth({"RAY_AUTH_MODE": "token"})  # the head would start, and no pod could join


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_readiness_fallback_answers_like_the_dashboard() -> None:
    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        up = GcsHealthServer("127.0.0.1", 0, gcs_port=gcs.getsockname()[1])
        down = GcsHealthServer("127.0.0.1", 0, gcs_port=_free_port())
        try:
            url = f"http://127.0.0.1:{up.port}/api/gcs_healthz"
            assert urllib.request.urlopen(url, timeout=5).read() == b"success"
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"http://127.0.0.1:{down.port}/api/gcs_healthz", timeout=5)
            assert err.value.code == 503
        finally:
            up.close()
            down.close()


def test_identity_and_checkpoint_dir_come_from_the_operators_env() -> None:
    job = validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
                        "metadata": {"name": "j", "namespace": "ml"}, "spec": {}})
    assert job_identity(job, {}) == ("j", "ml")
    assert job_identity(job, {"ASYNCRL_JOB_NAME": "k", "ASYNCRL_JOB_NAMESPACE": "ns"}) == ("k", "ns")
    assert checkpoint_root(job, {}) is None
    assert checkpoint_root(job, {"ASYNCRL_CHECKPOINT_DIR": "/checkpoints"}) == Path("/checkpoints/checkpoints")
    assert default_run_dir(job, {}) is None  # the local default, runs/<job>-<timestamp>
    assert default_run_dir(job, {"ASYNCRL_CHECKPOINT_DIR": "/checkpoints"}) == Path("/checkpoints/runs/j")


def test_bad_spec_exits_non_zero_with_field_paths_and_starts_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    def nothing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("nothing may start for an invalid spec")

    for name in ("run_driver", "ray_head", "private_ray"):
        monkeypatch.setattr(cluster, name, nothing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: bad}\n"
                   "spec:\n  rollout: {replicas: 0}\n  train: {stepz: 3}\n")
    assert main(["driver", "--spec", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "spec.rollout.replicas" in err and "spec.train.stepz" in err
    assert not (tmp_path / "run").exists() and not ray.is_initialized()
    assert main(["driver", "--spec", str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


# -------------------------------------------------------------------- one tiny job, end to end

TINY = {
    "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
    "metadata": {"name": "tiny", "namespace": "default"},
    "spec": {
        "correction": {"reference": "current"},
        "async": {"maxStaleness": 1},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 8},
        "train": {"steps": 2, "promptsPerStep": 2, "warmStartSteps": 1},
        "rollout": {"replicas": 1, "gpusPerReplica": 0},
        "actor": {"replicas": 1, "gpusPerReplica": 0},
        "checkpoint": {"everySteps": 1},
    },
}


def _server_job(apiserver: Any, namespace: str, manifest: dict[str, Any]) -> Any:
    """The job on the real API server, in a namespace no operator watches (the test plays the operator)."""
    from tests.support.jobs import Jobs

    jobs = Jobs(apiserver.api_client(), apiserver.namespace(namespace))
    jobs.create_manifest(manifest)
    return jobs


@pytest.mark.slow  # 13-15 s alone: a whole driver run of the job (make test's budget)
def test_local_driver_run_reports_status_to_the_api(tmp_path: Path, apiserver: Any) -> None:
    """The driver as the pod runs it: its own process (exit code), status to the real API server via KUBECONFIG."""
    import os
    import subprocess

    jobs = _server_job(apiserver, "driver-local", TINY)
    jobs.patch_status({"status": {"phase": "Running"}}, "tiny")
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(TINY))
    env = {**os.environ, "KUBECONFIG": str(apiserver.kubeconfig), "ASYNCRL_CHECKPOINT_DIR": str(tmp_path / "volume"),
           "ASYNCRL_JOB_NAMESPACE": jobs.ns}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-m", "asyncrl.trainer.cli", "driver", "--spec", str(spec), "--local", "--port", "0"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    final = json.loads(out.stdout.strip().splitlines()[-1])
    assert final["status"] == "succeeded" and final["status_failures"] == 0 and final["status_reports"] >= 2
    status = jobs.status("tiny")
    assert status["phase"] == "Running"  # the operator's field, untouched by the merge patch
    training = status["training"]
    assert training["policyVersion"] == 2 and training["lastCheckpointVersion"] == 2
    assert training["lastCheckpoint"] == str(tmp_path / "volume" / "checkpoints" / "step-000002")
    assert (tmp_path / "volume" / "checkpoints" / "step-000002" / "meta.json").exists()
    # no --run-dir: the run directory is the job's own on the volume (a restarted gang continues it)
    assert json.loads((tmp_path / "volume" / "runs" / "tiny" / "summary.json").read_text())["steps_done"] == 2


@pytest.mark.slow  # 13-15 s alone: a whole driver run of the job (make test's budget)
def test_sigterm_unwinds_with_a_final_report(tmp_path: Path, apiserver: Any) -> None:
    """Kubernetes stops the driver pod with SIGTERM: a final checkpoint, the final report, exit 0."""
    import os
    import signal
    import subprocess

    from tests.support.helpers import wait_for

    long_job = {**TINY, "spec": {**TINY["spec"], "train": {**TINY["spec"]["train"], "steps": 500}}}
    jobs = _server_job(apiserver, "driver-sigterm", long_job)
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump(long_job))
    env = {**os.environ, "KUBECONFIG": str(apiserver.kubeconfig), "ASYNCRL_CHECKPOINT_DIR": str(tmp_path / "volume"),
           "ASYNCRL_JOB_NAMESPACE": jobs.ns}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.trainer.cli", "driver", "--spec", str(spec),
                             "--local", "--port", "0"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: jobs.status("tiny").get("training"), timeout=240, interval=0.2,
                 message="the first status report")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # a preemption: the step in progress finishes, a final checkpoint is written, exit 0 (the operator restarts
    # the gang, which resumes from that checkpoint)
    assert proc.returncode == 0, err[-3000:]
    assert "final status report sent" in err
    summary = json.loads((tmp_path / "volume" / "runs" / "tiny" / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["stopped"]["signal"] == "SIGTERM", summary
    version = summary["final_version"]
    assert 1 <= version < 500
    assert (tmp_path / "volume" / "checkpoints" / f"step-{version:06d}" / "meta.json").exists()


@pytest.mark.slow
def test_cluster_mode_on_one_machine(no_shared_ray: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pod topology on one machine: the head as the driver starts it, one rollout and one actor
    node joining as the operator's worker pods do (``ray start --block --address --resources``),
    then the job with ``placement="cluster"``: each process holds its role's resource."""
    import os
    import secrets
    import shutil
    import subprocess
    import tempfile

    import ray

    from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
    from asyncrl.trainer.driver.status.reporter import StatusReporter

    # every test shuts its Ray down: one still running here is a leak in an earlier test, not a reason to skip
    assert not ray.is_initialized(), "an earlier test left Ray running in this process"
    root = Path(tempfile.mkdtemp(prefix="arl-"))  # short: Ray's unix socket paths must stay < 108 bytes
    monkeypatch.setenv("RAY_TMPDIR", str(root / "head"))
    # as in the job's pods: token auth with the job's one token (the operator's Secret) in every process
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_urlsafe(32))
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    job = validate_job({**TINY, "spec": {**TINY["spec"], "train": {**TINY["spec"]["train"], "warmStartSteps": 0}}})
    gcs = _free_port()
    ray_bin = str(Path(sys.executable).with_name("ray"))
    workers: list[subprocess.Popen[bytes]] = []
    held: list[dict[str, float]] = []
    try:
        with cluster.ray_head(gcs_port=gcs, dashboard_port=_free_port()):
            try:
                for i, role in enumerate(("rollout", "actor")):
                    # a second raylet on the same host needs its own ports and session directory (a pod has its own)
                    ports = [f"--{name}-port={_free_port()}" for name in (
                        "node-manager", "object-manager", "metrics-export", "dashboard-agent-listen",
                        "dashboard-agent-grpc", "runtime-env-agent")]
                    workers.append(subprocess.Popen(
                        [ray_bin, "start", "--block", f"--address=127.0.0.1:{gcs}", "--num-cpus=1",
                         f"--resources={json.dumps({role: 1})}", "--disable-usage-stats", f"--temp-dir={root / role}",
                         f"--min-worker-port={21000 + 1000 * i}", f"--max-worker-port={21999 + 1000 * i}", *ports],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy()))
                nodes = wait_for_roles(ray.nodes, required_roles(job.spec), timeout_s=90, interval_s=0.5)
                assert missing_roles(nodes, {"driver": 1}) == {}

                def on_step(record: Any) -> None:  # a StepReport or an EvalResult
                    held.append(ray.available_resources())
                    reporter(record)

                sent: list[dict[str, Any]] = []
                reporter = StatusReporter(sent.append)
                result = run_job(job, RunOptions(run_dir=root / "run", placement="cluster", port=0), on_step=on_step)
                assert reporter.flush()
            finally:  # the nodes leave before the head stops (else they wait for it to come back)
                for w in workers:
                    w.terminate()
                for w in workers:
                    w.wait(60)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        shutil.rmtree(root, ignore_errors=True)
        # the driver switched this process's Ray to token mode; later tests' local Ray runs without
        monkeypatch.undo()
        cluster.reload_ray_auth()
    assert result.summary.status == "succeeded" and result.summary.totals.final_version == 2
    assert all(h.get("rollout", 0.0) == 0.0 and h.get("actor", 0.0) == 0.0 for h in held)  # the hosts hold them
    assert sent[-1]["status"]["training"]["policyVersion"] == 2
