"""Benchmark: reconcile latency of the operator, AsyncRLJob created -> all of its children exist.

Usage::

    .venv/bin/python bench/operator.py [--jobs 50] [--mode burst|sequential|both] [--json]

The real operator (``python -m asyncrl.operator.main``, its own process as in its Deployment)
runs against the realistic KMock API server of ``tests/support/fakeapi.py`` on 127.0.0.1. Each job is the
``small.yaml``-shaped spec (driver + 2 rollout + 1 actor pods, ConfigMap, Service,
ServiceAccount, Role, RoleBinding: 9 children). The latency of one job is the time from its
POST to the creation, server-side, of its last child (timestamps taken inside the fake server, so
polling does not bias them). ``burst`` creates all jobs back to back (the operator works on them
concurrently); ``sequential`` waits for one job's children before creating the next (no queueing).

What it does not show: API-server latency and throttling (QPS/burst) of a real cluster, etcd,
admission webhooks; here every request costs a loopback HTTP round trip to an in-memory server.
"""

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILDREN = 9  # 4 pods + ConfigMap, Service, ServiceAccount, Role, RoleBinding


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"rollout": {"replicas": 2, "gpusPerReplica": 1}, "actor": {"replicas": 1, "gpusPerReplica": 1}}}


def last_child_times(emu: Any, names: list[str]) -> dict[str, float]:
    """For each job whose children all exist: the creation time of its last child (one pass)."""
    wanted = set(names)
    seen: dict[str, list[float]] = {}
    for (plural, _ns, obj), t in list(emu.created_at.items()):
        if plural in ("asyncrljobs", "events"):
            continue
        job = obj if obj in wanted else next((j for j in _prefixes(obj) if j in wanted), None)
        if job is not None:
            seen.setdefault(job, []).append(t)
    return {j: max(ts) for j, ts in seen.items() if len(ts) >= CHILDREN}


def _prefixes(obj: str) -> list[str]:
    parts = obj.split("-")
    return ["-".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def operator_process(kubeconfig: Path) -> Any:
    """The operator as its own process (as in its Deployment), started like the chart starts it."""
    port = _free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "ASYNCRL_OPERATOR_METRICS_PORT": "0",
           "ASYNCRL_OPERATOR_RESYNC_SECONDS": "60", "PYTHONPATH": str(ROOT)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.operator.main", f"--liveness=http://127.0.0.1:{port}/healthz",
                             "--log-level=ERROR"], env=env, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    try:
        deadline = time.monotonic() + 120
        while True:  # ready when kopf answers its liveness probe
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the operator did not start") from None
                time.sleep(0.1)
        time.sleep(1.0)  # let kopf open its watches
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def run(n: int, mode: str) -> list[float]:
    from tests.support.fakeapi import FakeCluster

    with tempfile.TemporaryDirectory() as tmp, FakeCluster(Path(tmp)) as cluster:
        emu = cluster.emulator
        assert emu is not None
        with operator_process(cluster.kubeconfig):
            names = [f"{mode[:3]}-{i:03d}" for i in range(n)]
            deadline = time.monotonic() + 60 + 5 * n
            for name in names:
                cluster.create("asyncrljobs", job(name))
                if mode == "sequential":
                    one = time.monotonic() + 60
                    while name not in last_child_times(emu, [name]) and time.monotonic() < one:
                        time.sleep(0.02)
            done = last_child_times(emu, names)
            while len(done) < n and time.monotonic() < deadline:
                time.sleep(0.25)
                done = last_child_times(emu, names)
            missing = sorted(set(names) - set(done))
            if missing:
                raise SystemExit(f"jobs {missing} did not get all their children in time")
            lat = [done[x] - emu.created_at[("asyncrljobs", "default", x)] for x in names]
    return lat


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--mode", choices=("burst", "sequential", "both"), default="both")
    ap.add_argument("--json", action="store_true", help="one JSON line per mode")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR if not os.environ.get("BENCH_DEBUG") else logging.INFO)
    for name in ("aiohttp.access",) if os.environ.get("BENCH_DEBUG") else ("kopf", "aiohttp.access", "asyncrl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    modes = ("sequential", "burst") if args.mode == "both" else (args.mode,)
    for mode in modes:
        lat = run(args.jobs, mode)
        row = {"mode": mode, "jobs": args.jobs, "p50_s": round(pct(lat, 0.5), 3), "p95_s": round(pct(lat, 0.95), 3),
               "max_s": round(max(lat), 3), "mean_s": round(statistics.fmean(lat), 3),
               "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 1)}
        if args.json:
            print(json.dumps(row))
        else:
            print(f"{mode:>10}: {args.jobs} jobs, create -> all {CHILDREN} children: p50 {row['p50_s']:.3f} s, "
                  f"p95 {row['p95_s']:.3f} s, max {row['max_s']:.3f} s (cpus: {os.cpu_count()}, "
                  f"load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
