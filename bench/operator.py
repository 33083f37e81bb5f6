"""Benchmark: operator latency from an AsyncRLJob's create to the moment all of its pods exist.

Usage::

    .venv/bin/python bench/operator.py [--jobs 50] [--mode burst|sequential|both] [--json]
                                       [--pod-security restricted|baseline|privileged|none]

What runs: a real ``kube-apiserver`` + ``etcd`` on loopback (``tests/support/apiserver.py``: RBAC on,
the default admission plugins incl. PodSecurity and ``OwnerReferencesPermissionEnforcement``, the CRD
applied server-side) and the real operator process (``python -m asyncrl.operator.main``) authenticated
as the chart's ServiceAccount under the chart's rendered RBAC (``tests/support/operator_proc.py``),
with the operator's default resync interval. Each job is ``examples/small.yaml`` with its GPUs set to 0:
driver + 2 rollout + 1 actor pods, plus the children the operator makes before them (ConfigMap,
Service, ServiceAccount, Role, RoleBinding, the Ray token Secret, the NetworkPolicy), in a namespace
that enforces the ``restricted`` Pod Security level by default.

What it measures, per job: the monotonic time just before the job's POST, to the receive time of the
last ``ADDED`` event of its pods on a pod WATCH of the namespace (a thread of the benchmark, opened
and proven live before the first create; no polling). ``burst`` creates all jobs back to back (the
operator works through a queue); ``sequential`` waits for one job's pods before creating the next
(no queueing: the latency of one reconcile chain). Per mode: p50/p95/max/mean of that latency, the
wall time, and the operator's own ``asyncrl_operator_reconcile_duration_seconds`` histogram over the
mode (count, mean, and the bucket bounds that hold p50/p95), scraped from its /metrics. The
apiserver's start time (PKI, etcd, /readyz) is printed too.

What a real cluster adds: nothing here schedules or runs a pod (no scheduler, no kubelet, no
controller-manager), so "pods exist" is the operator's part only; a user then waits for the
scheduler (and a gang scheduler or Kueue), image pulls, and the kubelets starting containers. The
apiserver here is a single instance on loopback with etcd not syncing to disk (``--unsafe-no-fsync``),
one client and no other tenants: a real control plane adds network latency, etcd fsyncs and
replication, webhooks, and API Priority and Fairness sharing the server with every other controller
and tenant (the operator's requests can be queued or throttled behind theirs). The two cores of a
busy development machine run the server, etcd, the operator and this client at once: read the load
average printed with the figures.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))

from asyncrl.api.constants import GROUP, PLURAL, VERSION  # noqa: E402
from asyncrl.operator.config import OperatorSettings  # noqa: E402
from tests.support.apiserver import ApiServer  # noqa: E402
from tests.support.operator_proc import OperatorProcess  # noqa: E402

SPEC = ROOT / "examples" / "small.yaml"
LABEL_JOB = f"{GROUP}/job"  # the label the operator puts on every pod of a job
NAMESPACE_PREFIX = "bench-"
RECONCILE_HISTOGRAM = "asyncrl_operator_reconcile_duration_seconds"
SENTINEL = "bench-watch-ready"


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------- the jobs
def job_manifest(name: str, namespace: str) -> dict[str, Any]:
    """``examples/small.yaml`` as ``name`` in ``namespace``, on CPU (no scheduler places GPUs here anyway)."""
    body: dict[str, Any] = yaml.safe_load(SPEC.read_text())
    body["metadata"] = {"name": name, "namespace": namespace}
    for role in ("rollout", "actor"):
        body["spec"][role]["gpusPerReplica"] = 0
    return body


def pods_per_job(body: dict[str, Any]) -> int:
    """The driver plus one pod per rollout and actor replica."""
    return 1 + int(body["spec"]["rollout"]["replicas"]) + int(body["spec"]["actor"]["replicas"])


# ---------------------------------------------------------------- pod arrivals from a watch
@dataclass
class PodArrivals:
    """A WATCH on the namespace's pods in a thread: the monotonic receive time of each ``ADDED`` event,
    by job (the ``asyncrl.io/job`` label) and pod name."""

    server: ApiServer
    namespace: str
    added: dict[str, dict[str, float]] = field(default_factory=dict)
    error: BaseException | None = None
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _stopping: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _watch: Any = None

    def start(self, timeout: float = 30.0) -> "PodArrivals":
        """Open the watch and prove it live: a sentinel pod's ADDED event arrives through it."""
        from kubernetes import watch
        from kubernetes.client import CoreV1Api

        self._client = self.server.api_client()  # the thread's own connection pool
        self._core = CoreV1Api(self._client)
        listing = self._core.list_namespaced_pod(self.namespace)
        rv = listing.metadata.resource_version if listing.metadata else None
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(rv,), name=f"watch-{self.namespace}", daemon=True)
        self._thread.start()
        self._core.create_namespaced_pod(self.namespace, _sentinel_pod())
        self.wait_for(lambda: SENTINEL in self.added.get("", {}), timeout, "the sentinel pod on the watch")
        return self

    def _run(self, resource_version: str | None) -> None:
        try:
            # no timeout_seconds: the client re-opens the watch from the last resourceVersion itself
            for event in self._watch.stream(self._core.list_namespaced_pod, self.namespace,
                                            resource_version=resource_version):
                received = time.monotonic()
                if event["type"] == "ERROR":
                    raise BenchError(f"the pod watch of {self.namespace} failed: {event['raw_object']}")
                if event["type"] != "ADDED":
                    continue
                meta = event["object"].metadata
                with self._cond:
                    self.added.setdefault((meta.labels or {}).get(LABEL_JOB, ""), {}).setdefault(meta.name, received)
                    self._cond.notify_all()
        except BaseException as exc:  # noqa: BLE001 -- handed to the waiting thread
            if not self._stopping.is_set():
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()

    def wait_for(self, done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not done():
                if self.error is not None:
                    raise BenchError(f"waiting for {what}: the pod watch failed: {self.error!r}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BenchError(f"{what} not seen on the pod watch in {timeout:g} s")
                self._cond.wait(left)

    def complete(self, jobs: list[str], count: int) -> bool:
        return all(len(self.added.get(j, ())) >= count for j in jobs)

    def stop(self) -> None:
        """Stop the stream: it returns after its next event, which deleting the sentinel provides."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()
        try:
            self._core.delete_namespaced_pod(SENTINEL, self.namespace, grace_period_seconds=0)
        except Exception:  # noqa: BLE001, S110 -- the server may already be gone; the thread is a daemon
            pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._client.close()


def _sentinel_pod() -> Any:
    """A pod that passes the ``restricted`` Pod Security level (never scheduled: there is no scheduler)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": SENTINEL},
            "spec": {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                                     "securityContext": {"allowPrivilegeEscalation": False,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}


# ---------------------------------------------------------------- the operator's reconcile histogram
@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count), ascending
    count: float
    total: float

    def minus(self, before: "Histogram") -> "Histogram":
        old = dict(before.buckets)
        return Histogram(tuple((le, c - old.get(le, 0.0)) for le, c in self.buckets),
                         self.count - before.count, self.total - before.total)

    def bound(self, q: float) -> float:
        """The upper bound of the bucket that holds quantile ``q`` (a histogram knows no more)."""
        return next((le for le, c in self.buckets if c >= q * self.count), float("inf"))

    def summary(self) -> dict[str, Any]:
        if self.count <= 0:
            return {"count": 0}
        return {"count": int(self.count), "mean_s": round(self.total / self.count, 4),
                "p50_le_s": self.bound(0.5), "p95_le_s": self.bound(0.95)}


def scrape_reconcile_histogram(op: OperatorProcess) -> Histogram | None:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = op.metrics()
    except OSError as exc:
        print(f"bench: the operator's /metrics did not answer ({exc}); no reconcile histogram", file=sys.stderr)
        return None
    for family in text_string_to_metric_families(text):
        if family.name == RECONCILE_HISTOGRAM:
            samples = {s.name: s for s in family.samples if not s.name.endswith("_bucket")}
            buckets = sorted((float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket"))
            return Histogram(tuple(buckets), samples[f"{family.name}_count"].value,
                             samples[f"{family.name}_sum"].value)
    return None


def settled_histogram(op: OperatorProcess, before: Histogram | None, n: int, timeout: float = 15.0) -> Histogram | None:
    """The histogram once every job's first reconcile has been observed: a reconcile is recorded after
    it writes the job's status, i.e. after its pods exist (polling /metrics is fine: no latency is read off it)."""
    deadline = time.monotonic() + timeout
    while True:
        after = scrape_reconcile_histogram(op)
        if after is None or before is None or after.count - before.count >= n or time.monotonic() > deadline:
            return after
        time.sleep(0.1)


# ---------------------------------------------------------------- one mode
def pct(xs: list[float], q: float) -> float:
    """Nearest-rank quantile."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def measure(server: ApiServer, op: OperatorProcess, mode: str, n: int, pod_security: str | None) -> dict[str, Any]:
    """Create ``n`` jobs in a fresh namespace the ``mode``'s way; the figures of the mode."""
    from kubernetes.client import CustomObjectsApi

    ns = server.namespace(f"{NAMESPACE_PREFIX}{mode}", pod_security=pod_security)
    names = [f"{mode}-{i:03d}" for i in range(n)]
    bodies = {name: job_manifest(name, ns) for name in names}
    per_job = pods_per_job(bodies[names[0]])
    client = server.api_client()
    custom = CustomObjectsApi(client)
    before = scrape_reconcile_histogram(op)
    arrivals = PodArrivals(server, ns).start()
    created: dict[str, float] = {}
    try:
        t0 = time.monotonic()
        for name in names:
            created[name] = time.monotonic()  # just before the POST
            custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, bodies[name])
            if mode == "sequential":
                arrivals.wait_for(lambda: arrivals.complete([name], per_job), 60.0,  # noqa: B023 -- used at once
                                  f"the {per_job} pods of {ns}/{name}")
        arrivals.wait_for(lambda: arrivals.complete(names, per_job), 60.0 + 2.0 * n, f"the pods of {n} jobs")
        wall = time.monotonic() - t0
    except BenchError as exc:
        have = {j: sorted(arrivals.added.get(j, ())) for j in names if len(arrivals.added.get(j, ())) < per_job}
        raise BenchError(f"{mode}: {exc}; jobs short of {per_job} pods: {have}\n"
                         f"--- the operator's last errors (its whole log: {op.log_path})\n{last_errors(op)}") from exc
    finally:
        arrivals.stop()
        client.close()
    after = settled_histogram(op, before, n)
    lat = [max(arrivals.added[x].values()) - created[x] for x in names]
    reconcile = after.minus(before).summary() if after is not None and before is not None else None
    return {"mode": mode, "jobs": n, "pods_per_job": per_job,
            "pods_seen": sum(len(arrivals.added[x]) for x in names),
            "p50_s": round(pct(lat, 0.5), 4), "p95_s": round(pct(lat, 0.95), 4), "max_s": round(max(lat), 4),
            "mean_s": round(statistics.fmean(lat), 4), "wall_s": round(wall, 3), "reconcile": reconcile,
            "pod_security": pod_security or "none"}


def last_errors(op: OperatorProcess, keep: int = 6) -> str:
    """The operator's last ERROR/WARNING lines and the API server's messages in them (its log is verbose)."""
    lines = [ln for ln in op.log(400).splitlines() if " ERROR " in ln or " WARNING " in ln or '"message"' in ln]
    return "\n".join(ln[:400] for ln in lines[-keep:]) or op.log(20)


def delete_jobs(server: ApiServer, mode: str, timeout: float = 60.0) -> None:
    """Delete a finished mode's jobs and wait for the operator's finalizer, so the next mode runs alone."""
    ns = f"{NAMESPACE_PREFIX}{mode}"
    server.kubectl("delete", PLURAL, "--all", "-n", ns, "--wait=false")
    wait = server.kubectl("wait", "--for=delete", PLURAL, "--all", "-n", ns, f"--timeout={timeout:g}s", check=False)
    if wait.returncode != 0:
        print(f"bench: the jobs of {ns} still exist {timeout:g} s after their deletion; the next mode shares the "
              f"operator with their finalizers:\n{wait.stderr}", file=sys.stderr)


# ---------------------------------------------------------------- report
def table_row(row: dict[str, Any]) -> str:
    rec = row["reconcile"] or {}
    rec_txt = (f"{rec['count']:>6} {rec['mean_s']:>8.4f} {rec['p50_le_s']:>7g} {rec['p95_le_s']:>7g}"
               if rec.get("count") else f"{rec.get('count', '-'):>6} {'-':>8} {'-':>7} {'-':>7}")
    return (f"{row['mode']:<10} {row['jobs']:>4} {row['pods_per_job']:>4} {row['p50_s']:>7.3f} {row['p95_s']:>7.3f} "
            f"{row['max_s']:>7.3f} {row['mean_s']:>7.3f} {row['wall_s']:>7.2f}   {rec_txt}")


TABLE_HEAD = (f"{'mode':<10} {'jobs':>4} {'pods':>4} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'mean s':>7} "
              f"{'wall s':>7}   {'recs':>6} {'rec mean':>8} {'p50 <=':>7} {'p95 <=':>7}")


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the server and operator


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50, help="AsyncRLJobs per mode (default 50)")
    ap.add_argument("--mode", choices=("burst", "sequential", "both"), default="both")
    ap.add_argument("--pod-security", choices=("restricted", "baseline", "privileged", "none"),
                    default="restricted", help="the Pod Security level the jobs' namespace enforces")
    ap.add_argument("--json", action="store_true", help="one JSON line per mode on stdout (the rest on stderr)")
    ap.add_argument("--workdir", type=Path, help="where the server keeps its PKI, etcd data and logs "
                                                 "(default: a temporary folder, removed after a clean run)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs={args.jobs}: must be at least 1")
    signal.signal(signal.SIGTERM, _terminate)
    info = sys.stderr if args.json else sys.stdout
    modes = ("sequential", "burst") if args.mode == "both" else (args.mode,)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="arl-bench-"))  # short: the server's paths stay short
    workdir.mkdir(parents=True, exist_ok=True)
    server = ApiServer(workdir)
    op = OperatorProcess(server, [f"{NAMESPACE_PREFIX}*"],
                         settings={"ASYNCRL_OPERATOR_RESYNC_SECONDS": f"{OperatorSettings().resync_seconds:g}"})
    ok = False
    try:
        server.start()
        crd_s = server.install_crd()
        t_op = time.monotonic()
        op.start()
        op_s = time.monotonic() - t_op
        print(f"real kube-apiserver + etcd on {server.url}: started in {server.start_seconds:.2f} s, CRD Established "
              f"in {crd_s:.2f} s; operator (chart RBAC, token) ready in {op_s:.2f} s", file=info, flush=True)
        if not args.json:
            print(f"latency: job POST -> last of its pods ADDED on a watch; recs = the operator's reconciles "
                  f"in the mode (mean s, histogram bucket bounds)\n{TABLE_HEAD}", flush=True)
        for i, mode in enumerate(modes):
            if i:
                delete_jobs(server, modes[i - 1])
            row = measure(server, op, mode, args.jobs, None if args.pod_security == "none" else args.pod_security)
            row.update(server_start_s=round(server.start_seconds, 3), crd_s=round(crd_s, 3),
                       operator_start_s=round(op_s, 3), cpus=os.cpu_count(),
                       loadavg_1m=round(os.getloadavg()[0], 2))
            print(json.dumps(row) if args.json else table_row(row), flush=True)
        load = os.getloadavg()
        print(f"cpus: {os.cpu_count()}, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", file=info)
        ok = True
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
    finally:
        op.stop()
        server.stop()
        if ok and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        elif not ok:
            print(f"bench: logs kept in {workdir}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
