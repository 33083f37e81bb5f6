"""An AsyncRLJob on the real cluster, observed through the API server's watches (never a status we wrote).

:class:`JobRecord` follows one job from submission: a watch on its pods (each pod's phase and readiness,
as the kubelet reports them) and a watch on the AsyncRLJob (phase, ``status.training``'s policy version and
keep ratio, as the driver's status sidecar writes them). Tests wait on the record's condition variable,
woken by watch events, and read the timeline (seconds since submission) that docs/cluster.md quotes.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
import yaml

from asyncrl.api import constants as C
from asyncrl.operator.names import LABEL_JOB
from tests.support.cluster import Cluster

GROUP, VERSION, PLURAL = C.GROUP, C.VERSION, C.PLURAL
TERMINAL = ("Succeeded", "Failed")
WATCH_S = 5  # server-side timeout of one watch call: the longest a stopped watch takes to return
OPEN: list["JobRecord"] = []  # records whose watches run; tests/cluster/conftest.py closes them after each test


@dataclass
class PodSeen:
    phase: str = ""
    ready: bool = False
    ever_ready: bool = False
    restarts: int = 0


@dataclass
class JobRecord:
    name: str
    namespace: str
    submitted: float = field(default_factory=time.monotonic)
    pods: dict[str, PodSeen] = field(default_factory=dict)
    pod_uids: dict[str, set[str]] = field(default_factory=dict)
    phases: list[tuple[float, str]] = field(default_factory=list)
    versions: list[tuple[float, int, float | None]] = field(default_factory=list)
    timeline: dict[str, float] = field(default_factory=dict)
    status: dict[str, Any] = field(default_factory=dict)
    cond: threading.Condition = field(default_factory=threading.Condition)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def close(self) -> None:
        """Stop the watches and wait for their threads (a watch returns within ``WATCH_S`` of ``stop``).

        No watch thread may outlive its test: one still inside the kubernetes client when the interpreter
        exits can abort it (a run once passed every test and then died of SIGABRT at exit)."""
        self.stop.set()
        for t in self.threads:
            t.join(timeout=WATCH_S + 30)
        alive = [t.name for t in self.threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"watch threads of {self.namespace}/{self.name} did not stop: {alive}")

    def mark(self, event: str) -> None:
        self.timeline.setdefault(event, round(time.monotonic() - self.submitted, 1))

    @property
    def phase(self) -> str:
        return self.phases[-1][1] if self.phases else ""

    @property
    def version(self) -> int:
        return self.versions[-1][1] if self.versions else 0

    def wait_for(self, what: str, predicate: Callable[["JobRecord"], bool], timeout: float) -> None:
        """Block until ``predicate(self)`` holds after a watch event (``timeout``: the test's bound)."""
        with self.cond:
            if not self.cond.wait_for(lambda: predicate(self), timeout=timeout):
                raise AssertionError(f"{self.namespace}/{self.name}: no {what} within {timeout:.0f} s; "
                                     f"phase {self.phase!r}, version {self.version}, pods "
                                     f"{ {k: (v.phase, v.ready) for k, v in self.pods.items()} }")


def _api(cluster: Cluster) -> kubernetes.client.ApiClient:
    return kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))


def _watch_pods(api: kubernetes.client.ApiClient, rec: JobRecord) -> None:
    core = kubernetes.client.CoreV1Api(api)
    while not rec.stop.is_set():
        try:
            _pods_once(core, rec)
        except Exception:  # noqa: BLE001 -- a watch cut by the API server (or the cluster's teardown): watch again
            rec.stop.wait(1.0)


def _pods_once(core: Any, rec: JobRecord) -> None:
    w = kubernetes.watch.Watch()
    for ev in w.stream(core.list_namespaced_pod, rec.namespace, label_selector=f"{LABEL_JOB}={rec.name}",
                       timeout_seconds=WATCH_S):
        pod = ev["object"]
        name = pod.metadata.name
        with rec.cond:
            rec.pod_uids.setdefault(name, set()).add(pod.metadata.uid)
            seen = rec.pods.setdefault(name, PodSeen())
            if ev["type"] == "DELETED":
                rec.pods.pop(name, None)
            else:
                seen.phase = pod.status.phase or ""
                conds = {c.type: c.status for c in (pod.status.conditions or [])}
                seen.ready = conds.get("Ready") == "True"
                seen.ever_ready |= seen.ready
                seen.restarts = sum(s.restart_count for s in (pod.status.container_statuses or []))
                if seen.phase == "Running":
                    rec.mark(f"{name} Running")
                if seen.ready:
                    rec.mark(f"{name} Ready")
            rec.cond.notify_all()
        if rec.stop.is_set():
            w.stop()


def _watch_job(api: kubernetes.client.ApiClient, rec: JobRecord) -> None:
    custom = kubernetes.client.CustomObjectsApi(api)
    while not rec.stop.is_set():
        try:
            _job_once(custom, rec)
        except Exception:  # noqa: BLE001 -- a watch cut by the API server (or the cluster's teardown): watch again
            rec.stop.wait(1.0)


def _job_once(custom: Any, rec: JobRecord) -> None:
    w = kubernetes.watch.Watch()
    for ev in w.stream(custom.list_namespaced_custom_object, GROUP, VERSION, rec.namespace, PLURAL,
                       field_selector=f"metadata.name={rec.name}", timeout_seconds=WATCH_S):
        obj = ev["object"]
        status = obj.get("status") or {}
        training = status.get("training") or {}
        with rec.cond:
            rec.status = status
            phase = status.get("phase", "")
            if phase and phase != rec.phase:
                rec.phases.append((time.monotonic() - rec.submitted, phase))
                rec.mark(f"phase {phase}")
            version = training.get("policyVersion")
            if isinstance(version, int) and version != rec.version:
                rec.versions.append((time.monotonic() - rec.submitted, version, training.get("keepRatio")))
                rec.mark(f"version {version}")
            rec.cond.notify_all()
        if rec.stop.is_set():
            w.stop()


def load_job(path: Path, namespace: str, **spec_overrides: dict[str, Any]) -> dict[str, Any]:
    """A job file with its namespace set and top-level spec sections updated (``train={"steps": 4}``)."""
    job = yaml.safe_load(path.read_text())
    job["metadata"]["namespace"] = namespace
    for section, fields in spec_overrides.items():
        job["spec"].setdefault(section, {}).update(fields)
    return job


def submit(cluster: Cluster, job: dict[str, Any]) -> JobRecord:
    """Start the watches, then create the job: the record sees every event from the first one on."""
    rec = JobRecord(job["metadata"]["name"], job["metadata"]["namespace"])
    api = _api(cluster)
    for target in (_watch_pods, _watch_job):
        t = threading.Thread(target=target, args=(api, rec), daemon=True, name=f"watch-{target.__name__}")
        rec.threads.append(t)
        t.start()
    OPEN.append(rec)
    rec.submitted = time.monotonic()
    cluster.apply(job)
    return rec


def close_all() -> None:
    """Stop every open record's watches (after each test)."""
    while OPEN:
        OPEN.pop().close()
