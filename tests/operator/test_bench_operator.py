"""bench/operator.py end to end (slow): 10 AsyncRLJobs in a burst against its own real kube-apiserver + etcd
and the real operator under the chart's RBAC; every job gets its 4 pods (seen on the bench's pod watch),
the latency figures are ordered, and the server, etcd and operator are gone when the bench exits."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

JOBS = 10


def processes_using(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` in their arguments (etcd's data folder, the
    server's certificates) or environment (the operator's KUBECONFIG)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().decode(errors="replace")
        except OSError:  # the process ended while we looked, or is not ours to read
            continue
        if str(path) in args or str(path) in env:
            found.append(args[:200])
    return found


@pytest.mark.slow
def test_bench_burst_every_job_gets_its_pods_and_nothing_outlives_it(tmp_path: Path) -> None:
    workdir = tmp_path / "k8s"
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "operator.py"), "--jobs", str(JOBS), "--mode", "burst",
                          "--json", "--workdir", str(workdir)], capture_output=True, text=True, timeout=300)
    print(f"\nbench/operator.py stderr:\n{out.stderr[-3000:]}\nstdout:\n{out.stdout}")
    assert processes_using(workdir) == []  # stopped on exit, whatever the outcome
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = out.stdout.strip().splitlines()  # --json: one line per mode, nothing else on stdout
    row = json.loads(line)
    assert row["mode"] == "burst" and row["jobs"] == JOBS
    assert row["pods_per_job"] == 4  # small.yaml: driver + 2 rollout + 1 actor
    assert row["pods_seen"] == 4 * JOBS
    assert 0 < row["p50_s"] <= row["p95_s"] <= row["max_s"] <= row["wall_s"]
    assert row["server_start_s"] > 0
    # the operator reconciled at least once per job, and its histogram says how long that took
    assert row["reconcile"]["count"] >= JOBS and row["reconcile"]["mean_s"] > 0
    assert row["reconcile"]["p50_le_s"] <= row["reconcile"]["p95_le_s"]
