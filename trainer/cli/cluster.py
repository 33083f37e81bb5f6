"""``asyncrl driver``: the job's driver pod -- Ray head, wait for the role pods, run, report status.

Read top to bottom (:func:`run_driver`):

    head     ``ray start --head`` on the ports the operator's Service and probes use
             (GCS 6379, dashboard 8265, Ray client 10001), with no CPUs and a ``driver`` resource;
             ``--local``: a private in-process Ray advertising the role resources itself
    wait     until the cluster has ``spec.rollout.replicas`` nodes' worth of ``rollout`` and one
             ``actor`` (the operator's worker pods run ``ray start --resources={"rollout": 1}`` ...);
             a timeout names the roles still missing
    run      :func:`~asyncrl.trainer.driver.loop.training_loop.run_job` with ``placement="cluster"``, metrics on
             ``0.0.0.0:spec.monitoring.port``, checkpoints under ``ASYNCRL_CHECKPOINT_DIR``, and the
             :class:`~.status_reporter.StatusReporter` as ``on_step`` (final report flushed on every exit)
    exit     0 on success, and after SIGTERM once the final checkpoint is written (a preemption: the
             operator restarts the gang, which resumes there); 1 the job failed, 2 bad spec or
             arguments (the CLI), 3 the role pods never joined, 143 SIGTERM before the run started
             (nothing to save): the operator reads the pod's exit

Token auth. In the job's pods ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` (the job's Secret) are
in the environment: the head child and this process's ``ray.init`` use them (:func:`token_auth`), so
the job's worker pods join and nothing else does.

Readiness. The operator's readiness probe is ``GET :8265/api/gcs_healthz``, served by Ray's
dashboard, which needs ``ray[default]``. Without it ``ray start`` starts no dashboard, and this
driver serves that one path itself (:class:`GcsHealthServer`: 200 ``success`` while the GCS port
accepts connections, 503 otherwise), so the probe means the same thing either way: the head is up.
The Ray client server (port 10001) likewise needs ``ray[client]`` (grpcio); nothing in the job uses it.
"""

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJob, AsyncRLJobSpec
from asyncrl.trainer.driver.hosts.ray_env import local_ray, reload_ray_auth
from asyncrl.trainer.driver.run.faults import describe

__all__ = ["reload_ray_auth", "run_driver", "private_ray", "ray_head", "local_gpu_problem"]

log = logging.getLogger(__name__)

PORT_GCS, PORT_DASHBOARD, PORT_CLIENT = C.PORT_GCS, C.PORT_DASHBOARD, C.PORT_CLIENT
HEALTH_PATH = C.GCS_HEALTH_PATH
ROLES = (C.RESOURCE_ROLLOUT, C.RESOURCE_ACTOR)


class ClusterTimeoutError(RuntimeError):
    """The role pods did not all join the Ray cluster in time."""


# ------------------------------------------------------------------------- pure: what is missing

def required_roles(spec: AsyncRLJobSpec) -> dict[str, int]:
    """Role resource units the job needs: one ``rollout`` per worker, one ``actor`` per actor rank
    (``replicas x max(gpusPerReplica, 1)``: an actor pod advertises one unit per rank it runs)."""
    return {C.RESOURCE_ROLLOUT: spec.rollout.replicas, C.RESOURCE_ACTOR: spec.actor.world_size}


def missing_roles(nodes: Sequence[Mapping[str, Any]], required: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """``{role: (have, need)}`` for every role the alive nodes do not yet provide.

    ``nodes`` is ``ray.nodes()``-shaped: ``{"Alive": bool, "Resources": {"rollout": 1.0, ...}}``.
    A role's supply is the sum of that resource over alive nodes (a pod advertises 1; a private
    local Ray advertises all of them on one node).
    """
    have = {role: 0 for role in required}
    for node in nodes:
        if not node.get("Alive", False):
            continue
        resources = node.get("Resources") or {}
        for role in required:
            have[role] += int(float(resources.get(role, 0.0)))
    return {role: (have[role], need) for role, need in required.items() if have[role] < need}


def describe_missing(missing: Mapping[str, tuple[int, int]]) -> str:
    return ", ".join(f"{role}: {have} of {need}" for role, (have, need) in missing.items())


def role_threads(nodes: Sequence[Mapping[str, Any]], role: str) -> int:
    """Torch threads for a role's process: the fewest CPUs of an alive node carrying the role (>= 1)."""
    cpus = [float((n.get("Resources") or {}).get("CPU", 1.0)) for n in nodes
            if n.get("Alive", False) and float((n.get("Resources") or {}).get(role, 0.0)) > 0]
    return max(1, int(min(cpus))) if cpus else 1


def wait_for_roles(list_nodes: Callable[[], Sequence[Mapping[str, Any]]], required: Mapping[str, int], *,
                   timeout_s: float, interval_s: float = 2.0, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> list[Mapping[str, Any]]:
    """Poll ``list_nodes`` until no role is missing; the nodes, or :class:`ClusterTimeoutError`."""
    deadline = clock() + timeout_s
    last_said = ""
    while True:
        nodes = list(list_nodes())
        missing = missing_roles(nodes, required)
        if not missing:
            return nodes
        said = describe_missing(missing)
        if said != last_said:
            log.info("waiting for the job's pods to join Ray: %s", said)
            last_said = said
        if clock() >= deadline:
            raise ClusterTimeoutError(
                f"after {timeout_s:g} s the Ray cluster still lacks {said} (role units joined of needed); "
                "check that those pods are Running and that their `ray start --address` reaches this "
                f"driver on port {PORT_GCS} (kubectl get pods -l the job's labels; kubectl logs <pod>)"
            )
        sleep(interval_s)


# ------------------------------------------------------------------------- the head and its probe

def head_command(*, dashboard: bool, gcs_port: int = PORT_GCS, dashboard_port: int = PORT_DASHBOARD,
                 client_port: int = PORT_CLIENT) -> list[str]:
    """``ray start --head --block`` as the operator's Service and probes expect it.

    ``--block``: the command stays in the foreground as this driver's child, and terminating it
    stops the head's processes -- and nothing else on the machine (``ray stop`` would end every Ray).
    """
    cmd = [
        "ray", "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=0",
        "--resources=" + json.dumps({C.RESOURCE_DRIVER: 1}), "--disable-usage-stats",
    ]
    if dashboard:
        cmd += ["--include-dashboard=true", "--dashboard-host=0.0.0.0", f"--dashboard-port={dashboard_port}",
                f"--ray-client-server-port={client_port}"]
    else:
        cmd += ["--include-dashboard=false"]
    return cmd


def dashboard_available() -> bool:
    """Whether Ray's dashboard can start here (``ray[default]`` brings aiohttp_cors, opencensus, grpcio)."""
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("aiohttp", "aiohttp_cors", "opencensus", "grpc"))


def port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class GcsHealthServer:
    """``GET /api/gcs_healthz`` on the dashboard port when Ray's dashboard is not installed.

    Same meaning as the dashboard's endpoint (the GCS answers): 200 ``success`` while the GCS
    port accepts a connection, 503 otherwise. Any other path is 404.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = PORT_DASHBOARD, gcs_port: int = PORT_GCS) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                if self.path.split("?")[0] != HEALTH_PATH:
                    self._answer(404, b"not found")
                elif port_open("127.0.0.1", gcs_port):
                    self._answer(200, b"success")
                else:
                    self._answer(503, b"GCS not reachable")

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # the probe every 10 s is not news
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def token_auth(env: Mapping[str, str]) -> bool:
    """Whether the job's Ray runs with token auth (the operator's pods: ``RAY_AUTH_MODE=token`` and
    ``RAY_AUTH_TOKEN`` from the job's Secret); a token mode without a token is refused here, by name."""
    if env.get(C.ENV_RAY_AUTH_MODE, "").lower() != "token":
        return False
    if not (env.get(C.ENV_RAY_AUTH_TOKEN) or env.get(f"{C.ENV_RAY_AUTH_TOKEN}_PATH")):
        raise RuntimeError(
            "RAY_AUTH_MODE=token but neither RAY_AUTH_TOKEN nor RAY_AUTH_TOKEN_PATH is set: the operator "
            "mounts RAY_AUTH_TOKEN from the job's Secret <job>-ray-token (key token); check that it exists"
        )
    return True


@contextlib.contextmanager
def ray_head(*, start_timeout_s: float = 120.0, gcs_port: int = PORT_GCS,
             dashboard_port: int = PORT_DASHBOARD) -> Iterator[str]:
    """Start the Ray head as a child process, connect this process, yield the GCS address; stop on exit.

    Token auth (:func:`token_auth`): the head and this process's ``ray.init`` use the environment's
    token, so the job's worker pods (same Secret) join and nothing else does.
    """
    import ray

    if token_auth(os.environ):
        reload_ray_auth()
    dashboard = dashboard_available()
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    cmd = [ray_bin, *head_command(dashboard=dashboard, gcs_port=gcs_port, dashboard_port=dashboard_port)[1:]]
    log.info("starting the Ray head: %s", " ".join(cmd))
    head = subprocess.Popen(cmd)
    health: GcsHealthServer | None = None
    try:
        deadline = time.monotonic() + start_timeout_s
        while not port_open("127.0.0.1", gcs_port):
            if head.poll() is not None:
                raise RuntimeError(f"`{' '.join(cmd)}` exited with {head.returncode} before the GCS "
                                   f"listened on port {gcs_port}; its output is above")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Ray head's GCS did not listen on port {gcs_port} within {start_timeout_s:g} s")
            time.sleep(0.5)
        if not dashboard:
            log.warning("Ray's dashboard is not installed (ray[default]); serving %s on port %d for the "
                        "readiness probe", HEALTH_PATH, dashboard_port)
            health = GcsHealthServer(port=dashboard_port, gcs_port=gcs_port)
        address = f"127.0.0.1:{gcs_port}"
        ray.init(address=address, logging_level=logging.WARNING)
        try:
            yield address
        finally:
            ray.shutdown()
    finally:
        if health is not None:
            health.close()
        head.terminate()  # our child only: `ray start --block` stops the head's processes on SIGTERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()


@contextlib.contextmanager
def private_ray(required: Mapping[str, int], num_cpus: int) -> Iterator[str]:
    """``--local``: a private local Ray whose one node advertises every role resource itself (per-run
    token, private session folder, its processes and folder removed after: :func:`.ray_env.local_ray`)."""
    with local_ray(num_cpus, resources={role: float(n) for role, n in required.items()}):
        yield "local"


def local_gpu_problem(spec: AsyncRLJobSpec, gpus_here: int) -> str | None:
    """Why ``--local`` cannot place the job's GPU hosts on this machine (None: it can).

    A private Ray advertises the GPUs it finds; a host asking for more waits for them forever.
    """
    wants = {"spec.actor.gpusPerReplica": spec.actor.gpus_per_replica,
             "spec.rollout.gpusPerReplica": spec.rollout.gpus_per_replica}
    need = max(wants.values())
    if need <= gpus_here:
        return None
    asked = ", ".join(f"{k}: {v}" for k, v in wants.items() if v > gpus_here)
    return (f"{asked} but this machine has {gpus_here} GPU(s) visible to torch: the host would wait for one "
            f"forever. For a CPU run set those fields to 0 (actor: {{gpusPerReplica: 0}}, rollout: "
            "{gpusPerReplica: 0}), or run on a machine with the GPUs")


# ------------------------------------------------------------------------- the driver

@dataclass(frozen=True)
class DriverOptions:
    run_dir: Path | None = None
    local: bool = False  # private local Ray instead of a Ray head for the job's pods
    wait_timeout_s: float = 900.0  # for the role pods to join
    report_status: bool = True
    metrics_port: int | None = None  # default spec.monitoring.port (tests: 0 = any free port)
    status_sender: Any = None  # the driver pod: the relay's sender, registered before any user code ran


def job_identity(job: AsyncRLJob, env: Mapping[str, str]) -> tuple[str, str]:
    """(name, namespace) of the AsyncRLJob to report to: the operator's env, else the spec's metadata."""
    name = env.get(C.ENV_JOB_NAME) or job.metadata.name
    namespace = env.get(C.ENV_JOB_NAMESPACE) or job.metadata.namespace or "default"
    return name, namespace


def checkpoint_root(job: AsyncRLJob, env: Mapping[str, str]) -> Path | None:
    """Where checkpoints go in a cluster: ``spec.checkpoint.dir`` inside ``ASYNCRL_CHECKPOINT_DIR``
    (the job's volume, mounted on the driver and the actor pods); None when the env does not say."""
    base = env.get(C.ENV_CHECKPOINT_DIR)
    if not base:
        return None
    configured = Path(job.spec.checkpoint.dir)
    return configured if configured.is_absolute() else Path(base) / configured


def default_run_dir(job: AsyncRLJob, env: Mapping[str, str]) -> Path | None:
    """In a cluster, one run directory per job on the job's volume (``<ASYNCRL_CHECKPOINT_DIR>/runs/<job>``):
    a restarted gang resumes its checkpoint *and* continues its ``metrics.jsonl``. None: the local default."""
    base = env.get(C.ENV_CHECKPOINT_DIR)
    return Path(base) / "runs" / job.metadata.name if base else None


def _terminate_on_sigterm() -> None:
    """Kubernetes stops a pod with SIGTERM: before the run starts, unwind (the final status report)
    instead of dying on the spot, exit code 143 as for a plain SIGTERM. Once ``run_job`` runs, its own
    handler takes over: stop cleanly, final checkpoint, exit 0 (:mod:`.termination`)."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread

    def stop(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _reporter(job: AsyncRLJob, enabled: bool, relay: Any = None) -> Any:
    from asyncrl.trainer.driver.status.reporter import StatusReporter, kubernetes_sender

    if not enabled:
        return None
    if relay is not None:  # the driver pod: its status sidecar holds the token, and took this process's token
        return StatusReporter(relay)
    if os.environ.get(C.ENV_STATUS_RELAY):  # the registration failed (asyncrl driver logged why)
        return None
    name, namespace = job_identity(job, os.environ)
    try:
        return StatusReporter(kubernetes_sender(name, namespace))
    except Exception as exc:  # noqa: BLE001 -- no API credentials: train anyway, say so
        log.warning("no status reporting to AsyncRLJob %s/%s (%s: %s); set KUBECONFIG or run in the "
                    "driver pod with its ServiceAccount", namespace, name, type(exc).__name__, exc)
        return None


def _logging_progress(reporter: Callable[[Any], None] | None, total: int) -> Callable[[Any], None]:
    """``on_step``: a progress line in the pod's log (``kubectl logs``), then the status reporter."""
    from asyncrl.trainer.cli.console import progress_line

    def on_step(event: Any) -> None:
        log.info("%s", progress_line(event, total))
        if reporter is not None:
            reporter(event)
    return on_step


def run_driver(job: AsyncRLJob, options: DriverOptions) -> int:
    """Head, wait, run, report; the process exit code (0 success or a clean stop after SIGTERM, 1 failure,
    2 ``--local`` without the GPUs the spec asks for, 3 pods never joined; SIGTERM before the run:
    SystemExit(143) after the final report)."""
    import ray

    from asyncrl.trainer.driver.loop.startup_probe import StartupCheckError
    from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

    _terminate_on_sigterm()
    spec = job.spec
    if options.local:  # a private Ray has only this machine's GPUs: refuse now rather than wait forever
        import torch

        problem = local_gpu_problem(spec, torch.cuda.device_count())
        if problem is not None:
            print(f"asyncrl driver --local: {problem}", file=sys.stderr)
            return 2
    required = required_roles(spec)
    reporter = _reporter(job, options.report_status, options.status_sender)
    run_dir = options.run_dir or default_run_dir(job, os.environ)
    ckpt = checkpoint_root(job, os.environ)  # the spec stays as validated: the run resolves its dir there
    ray_ctx = private_ray(required, max(1, os.cpu_count() or 1)) if options.local else ray_head()
    try:
        with ray_ctx:
            _terminate_on_sigterm()  # again: ray.init installs its own handlers (exit 15, a crash report)
            nodes = wait_for_roles(ray.nodes, required, timeout_s=options.wait_timeout_s)
            run_options = RunOptions(
                run_dir=run_dir, placement="cluster", metrics_host="0.0.0.0",
                port=options.metrics_port,
                actor_threads=1 if options.local else role_threads(nodes, C.RESOURCE_ACTOR),
                rollout_threads=1 if options.local else role_threads(nodes, C.RESOURCE_ROLLOUT),
                # on the job's volume, so that a restarted gang reuses it
                warm_start_dir=None if ckpt is None else ckpt / "warm_start",
                checkpoint_base=None if ckpt is None else Path(os.environ[C.ENV_CHECKPOINT_DIR]),
            )
            on_phase = None if reporter is None else reporter.phase
            result = run_job(job, run_options, on_step=_logging_progress(reporter, spec.train.steps),
                             on_phase=on_phase)
    except ClusterTimeoutError as exc:
        print(f"asyncrl driver: {exc}", file=sys.stderr)
        return 3
    except StartupCheckError as exc:  # permanent: the job's engines disagree with its actor (the message says why)
        log.warning("%s", exc)
        # one line: the pod's last log line is its termination message, which the operator quotes (InvalidSpec)
        one_line = "; ".join(line.strip() for line in str(exc).splitlines())
        print(f"asyncrl driver: job {job.metadata.name}: {one_line}", file=sys.stderr)
        return StartupCheckError.exit_code
    except Exception as exc:  # noqa: BLE001 -- the pod's exit code and log carry it to the operator
        # One line with the original error (errno, path and bytes free for a full disk): the pod's last
        # log line becomes its termination message, which the operator quotes in the job's status.
        log.exception("the job failed")
        print(f"asyncrl driver: job {job.metadata.name} failed: {describe(exc)}", file=sys.stderr)
        return 1
    finally:
        if reporter is not None and reporter.flush():  # the last word, whatever happened
            log.info("final status report sent: policyVersion %d (%d reports, %d failed)",
                     reporter.policy_version, reporter.sent, reporter.failures)
    totals = result.summary.totals
    print(json.dumps({"job": job.metadata.name, "status": result.summary.status,
                      "final_version": totals.final_version if totals is not None else None,
                      "status_reports": None if reporter is None else reporter.sent,
                      "status_failures": None if reporter is None else reporter.failures}))
    return 0
