"""Benchmark: reconcile latency of the operator, AsyncRLJob created -> all of its children exist.

Usage::

    .venv/bin/python bench/operator.py [--jobs 50] [--mode burst|sequential|both] [--json]

The real operator (kopf, in-process through ``kopf.testing.KopfRunner``) runs against the
realistic KMock API server of ``tests/support/fakeapi.py`` on 127.0.0.1. Each job is the
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
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHILDREN = 9  # 4 pods + ConfigMap, Service, ServiceAccount, Role, RoleBinding


def job(name: str) -> dict[str, Any]:
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"rollout": {"replicas": 2, "gpusPerReplica": 1}, "actor": {"replicas": 1, "gpusPerReplica": 1}}}


def children_done(emu: Any, name: str) -> float | None:
    """Creation time of the job's last child, or None while some are missing."""
    times = [t for (plural, _ns, n), t in list(emu.created_at.items())
             if plural != "asyncrljobs" and plural != "events" and (n == name or n.startswith(name + "-"))]
    return max(times) if len(times) >= CHILDREN else None


def run(n: int, mode: str) -> list[float]:
    from kopf.testing import KopfRunner
    from prometheus_client import CollectorRegistry

    from asyncrl.operator.config import OperatorSettings
    from asyncrl.operator.handlers import build_registry
    from tests.support.fakeapi import FakeCluster

    with tempfile.TemporaryDirectory() as tmp, FakeCluster(Path(tmp)) as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        os.environ.pop("KUBERNETES_SERVICE_HOST", None)
        cfg = OperatorSettings(resync_seconds=60, metrics_port=0)
        registry = build_registry(cfg, CollectorRegistry())
        emu = cluster.emulator
        assert emu is not None
        with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry, timeout=180):
            time.sleep(1.0)  # let kopf finish discovery and open its watches
            names = [f"{mode[:3]}-{i:03d}" for i in range(n)]
            deadline = time.monotonic() + 60 + 5 * n
            for name in names:
                cluster.create("asyncrljobs", job(name))
                if mode == "sequential":
                    one = time.monotonic() + 60
                    while children_done(emu, name) is None and time.monotonic() < one:
                        time.sleep(0.005)
            while any(children_done(emu, x) is None for x in names) and time.monotonic() < deadline:
                time.sleep(0.02)
            lat = []
            for name in names:
                done = children_done(emu, name)
                if done is None:
                    raise SystemExit(f"job {name} did not get all its children in time")
                lat.append(done - emu.created_at[("asyncrljobs", "default", name)])
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
        with contextlib.redirect_stdout(sys.stderr):
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
