"""End to end: a real Prometheus scrapes two real ``asyncrl run`` jobs and evaluates the chart's rules.

Prometheus (the Debian package) runs on loopback with a 1 s scrape and evaluation interval, the
rules taken from the rendered chart with ``for:`` shortened by values, and static targets labelled
``namespace``/``asyncrljob``/``role`` as the PodMonitor's relabelling would. Job ``collapse``
(long-memory EWMA, reset off, a tight mask) must raise AsyncRLMaskCollapse and job ``resets``
(reset on at a high keep-ratio bar) AsyncRLEwmaReset; neither alert may name the other job.
The same two AsyncRLJobs also exist on the real API server, reconciled by the real operator process
(its pods never run: no kubelet), and Prometheus scrapes the operator too, as the chart's
ServiceMonitor would (``honorLabels``): while both jobs train, every dashboard panel query is run
through the HTTP API and must return data, the operator's panels included.
"""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_alerts import ROOT, rendered_groups

pytestmark = pytest.mark.slow
STEPS = 40

COMMON = {
    "async": {"maxStaleness": 2, "partialRollout": True},
    "model": {"preset": "tiny-llama", "rolloutDtype": "bfloat16"},
    "task": {"name": "calculator", "groupSize": 4, "maxNewTokens": 24},
    "train": {"steps": STEPS, "promptsPerStep": 4, "warmStartSteps": 3},
    "rollout": {"replicas": 1},
}
JOBS = {
    # theta_prox barely moves (decay 0.99, no reset) while the policy trains: r_d leaves [0.99, 1.01].
    "collapse": {"correction": {"reference": "ewma", "mask": {"bounds": {"low": 0.99, "high": 1.01}},
                                "ewma": {"decay": 0.99, "reset": {"enabled": False}}},
                 "monitoring": {"maskGuard": {"warnKeepRatio": 0.95, "criticalKeepRatio": 0.9}}},
    # Every step under a 0.999 keep ratio resets theta_prox; the keep ratio stays above 0.3.
    "resets": {"correction": {"reference": "ewma", "mask": {"bounds": {"low": 0.9, "high": 1.1}},
                              "ewma": {"reset": {"enabled": True, "rule": "paper", "keepRatioBelow": 0.999, "consecutiveSteps": 1}}},
               "monitoring": {"maskGuard": {"warnKeepRatio": 0.5, "criticalKeepRatio": 0.3}}},
}
# Panels with nothing to show in this setup: no job uses interruptSync (its phases never end).
NO_DATA_HERE = ("asyncrl_sync_phase_duration_seconds",)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(port: int, path: str, **params: str) -> Any:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]


def firing(port: int) -> set[tuple[str, str]]:
    return {(a["labels"]["alertname"], a["labels"].get("asyncrljob", ""))
            for a in api(port, "alerts")["alerts"] if a["state"] == "firing"}


def test_alerts_fire_for_the_right_job_and_panels_have_data(tmp_path: Path, namespace: str, kube: Any,
                                                           operator_process: Any) -> None:
    from tests.support.jobs import Jobs

    prometheus = shutil.which("prometheus")
    asyncrl = Path(sys.executable).with_name("asyncrl")
    assert prometheus, "prometheus not found; run `make tools` (Debian package prometheus)"
    jobs = Jobs(kube, namespace)
    for name, spec in JOBS.items():  # the operator's view of the same jobs
        jobs.create_manifest({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": name},
                              "spec": {**COMMON, **spec}})
    t0 = time.monotonic()
    groups = rendered_groups("prometheusRule.alerts.AsyncRLMaskCollapse.for=1s",
                             "prometheusRule.alerts.AsyncRLEwmaReset.for=0s")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    ports = {name: free_port() for name in JOBS}
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {"job_name": "asyncrl-jobs", "static_configs": [
                {"targets": [f"127.0.0.1:{ports[name]}"], "labels": {"namespace": namespace, "asyncrljob": name, "role": "driver"}}
                for name in JOBS]},
            {"job_name": "asyncrl-operator", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{operator_process.metrics_port}"]}]},
        ],
    }))
    procs: list[subprocess.Popen[bytes]] = []
    logs = {name: tmp_path / f"{name}.log" for name in [*JOBS, "prometheus"]}
    try:
        procs.append(subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=logs["prometheus"].open("wb"), stderr=subprocess.STDOUT))
        for name, spec in JOBS.items():
            job = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": name},
                   "spec": {**COMMON, **spec}}
            (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(job))
            procs.append(subprocess.Popen(
                [str(asyncrl), "run", str(tmp_path / f"{name}.yaml"), "--run-dir", str(tmp_path / f"run-{name}"),
                 "--port", str(ports[name]), "--quiet"],
                stdout=logs[name].open("wb"), stderr=subprocess.STDOUT, cwd=tmp_path))
        seen: set[tuple[str, str]] = set()
        panels: dict[str, int] | None = None
        first_step = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            time.sleep(1)
            try:
                seen |= firing(prom_port)
                versions = {r["metric"]["asyncrljob"]: float(r["value"][1])
                            for r in api(prom_port, "query", query="asyncrl_policy_version")["result"]}
            except OSError:  # Prometheus still starting
                continue
            if first_step is None and any(v > 0 for v in versions.values()):
                first_step = time.monotonic() - t0
            if panels is None and len(versions) == 2 and min(versions.values()) >= 10:
                panels = panel_results(prom_port, namespace)  # both jobs live and training
            done = {("AsyncRLMaskCollapse", "collapse"), ("AsyncRLEwmaReset", "resets")} <= seen
            if (done and panels is not None) or all(p.poll() is not None for p in procs[1:]):
                break
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
    tails = "\n".join(f"--- {n}\n{logs[n].read_text()[-1500:]}" for n in logs if logs[n].exists())
    print(f"e2e: first step after {first_step or -1:.1f} s, done after {elapsed:.1f} s; firing seen: {sorted(seen)}; "
          f"panel queries with data: {sum(n > 0 for n in (panels or {}).values())}/{len(panels or {})}")
    assert ("AsyncRLMaskCollapse", "collapse") in seen, tails
    assert ("AsyncRLEwmaReset", "resets") in seen, tails
    assert ("AsyncRLMaskCollapse", "resets") not in seen
    assert panels is not None, "the jobs never trained 10 steps each while Prometheus scraped them\n" + tails
    empty = [title for title, n in panels.items() if n == 0]
    assert not empty, f"panel queries without data: {empty}"


def panel_results(port: int, namespace: str) -> dict[str, int]:
    """Series returned per dashboard panel query (``monitoring.dashboard.panel_queries``), skipping NO_DATA_HERE."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from monitoring.dashboard import panel_queries

    out: dict[str, int] = {}
    for title, expr in panel_queries(namespace=namespace, job=".*", rate_interval="1m"):
        if any(m in expr for m in NO_DATA_HERE):
            continue
        out[f"{title}: {expr}"] = len(api(port, "query", query=expr)["result"])
    return out
