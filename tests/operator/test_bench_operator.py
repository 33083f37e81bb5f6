"""bench/operator.py end to end (slow): 50 AsyncRLJobs against the fake API server, every job gets
all of its children, and the latency figures are printed for the CI log."""

import json
import subprocess
import sys

import pytest

from tests.support.helpers import ROOT


@pytest.mark.slow
def test_bench_50_jobs_all_get_their_children() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "operator.py"), "--jobs", "50", "--mode", "burst",
                          "--json"], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nbench/operator.py: {row}")
    assert row["jobs"] == 50 and 0 < row["p50_s"] <= row["p95_s"] <= row["max_s"]
