"""A small job trains to completion on real pods: the chart's operator, the kubelet, Ray across pods.

The quickstart's cluster twin (examples/quickstart-cluster.yaml) with a few steps, on the exact route:
``correction.reference: exact`` with ``oldLogits.strategy: dedicated``, so besides a driver pod, two rollout pods
and one actor pod there is an old-logit scorer pod of its own, which joins Ray like the others. All on CPU, in a
namespace that enforces the restricted Pod Security level. Every phase below comes from the kubelet or the job's
own status sidecar; nothing here writes a status. (The twin's own route, ``ewma``, runs on real pods in
test_checkpoints_and_faults.py.)
"""

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.cluster import OPERATOR_NAMESPACE, RELEASE, RUN_DIR, Cluster
from tests.support.cluster_jobs import JobRecord, load_job, submit
from tests.support.cluster_prometheus import Prometheus
from tests.support.helpers import ROOT

pytestmark = pytest.mark.cluster

TWIN = ROOT / "examples" / "quickstart-cluster.yaml"
STEPS = 4
PODS = {"quickstart-driver-0", "quickstart-rollout-0", "quickstart-rollout-1", "quickstart-actor-0",
        "quickstart-oldlogit-0"}


def exact_route(job: dict) -> dict:
    """The job on the exact route: its old logits from one dedicated scorer pod, at most one version behind."""
    spec = job["spec"]
    spec["correction"] = {"reference": "exact", "mask": spec["correction"]["mask"], "clip": spec["correction"]["clip"]}
    spec["oldLogits"] = {"strategy": "dedicated", "dedicated": {"replicas": 1, "maxLagVersions": 1}}
    return job


@dataclass
class Trained:
    rec: JobRecord
    ns: str
    table: str  # `kubectl get arj` mid-run
    probe: list[str]  # the rollout pod's readiness probe command
    alive: str  # its output, run mid-run with `kubectl exec` in that pod
    other: "subprocess.CompletedProcess[str]"  # the same probe with another Ray token


@pytest.fixture(scope="module")
def trained(cluster: Cluster, operator: str, prometheus: Prometheus) -> Iterator[Trained]:
    """The quickstart twin on the exact route, trained to a terminal phase while the chart-configured Prometheus
    scrapes it."""
    ns = cluster.namespace("train")  # pod-security.kubernetes.io/enforce: restricted
    job = exact_route(load_job(TWIN, ns, train={"steps": STEPS}, eval={"everySteps": 2, "prompts": 16}))
    rec = submit(cluster, job)
    try:
        rec.wait_for("pod of each role Ready", lambda r: PODS <= {p for p, s in r.pods.items() if s.ever_ready},
                     timeout=900)
        rec.mark("all pods Ready")
        # while the pods run: the rollout pod's own readiness probe, by hand, with the job's token and another
        probe = cluster.get("pod", "quickstart-rollout-0", ns)["spec"]["containers"][0]["readinessProbe"]["exec"][
            "command"]
        exec_ = ("exec", "-n", ns, "quickstart-rollout-0", "-c", "rollout", "--")
        alive = cluster.kubectl(*exec_, *probe).stdout
        other = cluster.kubectl(*exec_, "env", "RAY_AUTH_TOKEN=not-the-jobs-token", *probe, check=False)
        rec.wait_for("first policy version", lambda r: r.version >= 1, timeout=900)
        table = cluster.kubectl("get", "arj", "quickstart", "-n", ns).stdout  # the printer columns, mid-run
        rec.wait_for("a terminal phase", lambda r: r.phase in ("Succeeded", "Failed"), timeout=1200)
    finally:
        rec.close()
    RUN_DIR.joinpath("timeline-train.json").write_text(json.dumps(rec.timeline, indent=1))
    print("timeline (s after submit):", json.dumps(rec.timeline))
    yield Trained(rec, ns, table, probe, alive, other)


def test_a_small_job_trains_to_completion_on_real_pods(cluster: Cluster, trained: Trained) -> None:
    rec, ns, table = trained.rec, trained.ns, trained.table
    # Ray joined across pods through the head Service's DNS name, with the job's token: a worker's readiness probe
    # asks the head at that name whether this pod's raylet is ALIVE; with another token the head refuses it.
    assert f"quickstart-driver-0.quickstart.{ns}.svc:6379" in trained.probe
    assert "is ALIVE" in trained.alive
    other = trained.other
    assert other.returncode != 0 and "refused this pod's Ray token" in other.stdout + other.stderr, other
    assert rec.phase == "Succeeded", rec.status
    # every pod, the dedicated scorer's included, ran under the restricted level (the namespace enforces it) and
    # reached Running and Ready
    assert PODS <= set(rec.pod_uids)
    # the namespace enforced the restricted Pod Security level, and admitted every pod the operator made
    labels = cluster.get("namespace", ns)["metadata"]["labels"]  # cluster-scoped: -n is ignored
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # the version moved, step by step, as the status sidecar reported it through the API
    versions = [v for _, v, _ in rec.versions]
    assert versions == sorted(versions) and versions[-1] == STEPS, rec.versions
    assert rec.status["training"]["policyVersion"] == STEPS
    assert rec.status["training"].get("keepPercent") is not None
    header, row = table.splitlines()[:2]
    assert re.search(r"\bVERSION\b", header) and "KEEP%" in header
    # the driver's log (kubectl logs): a progress line per step, and its final line
    log = cluster.logs("quickstart-driver-0", ns, container="driver")
    for step in range(1, STEPS + 1):
        assert f"step {step}/{STEPS}: version {step}," in log, log[-3000:]
    final = json.loads(next(line for line in reversed(log.splitlines()) if line.startswith('{"job"')))
    assert final["status"] == "succeeded" and final["final_version"] == STEPS, final
    assert final["status_reports"] >= 1 and final["status_failures"] == 0, final
    # the status sidecar stopped on the kubelet's SIGTERM once the driver had exited (137: it had to be killed
    # at the end of the grace period, and the finished pod stayed Running until then)
    driver = cluster.get("pod", "quickstart-driver-0", ns)
    (sidecar,) = [s for s in driver["status"]["initContainerStatuses"] if s["name"] == "status"]
    assert sidecar["state"]["terminated"]["exitCode"] == 0, sidecar
    assert driver["status"]["phase"] == "Succeeded"


def test_prometheus_scrapes_the_job_and_the_operator_as_the_chart_declares(trained: Trained,
                                                                           prometheus: Prometheus) -> None:
    """The chart's PodMonitor found the driver pod through the API server and labelled its series with the job's
    namespace, asyncrljob and role; the ServiceMonitor found the operator, whose per-job series keep the job's
    namespace (honorLabels); the chart's rules loaded and evaluated. Range queries: the finished pod's target is gone
    (a PodMonitor drops Succeeded pods) and its series are stale, but their samples stay queryable."""
    ns = trained.ns
    # 1. the training series, from the driver pod
    for metric in ("asyncrl_policy_version", "asyncrl_discrepancy_valid_tokens_total", "asyncrl_trained_tokens_total"):
        series = prometheus.query(f'last_over_time({metric}{{asyncrljob="quickstart"}}[1h])')
        assert series, f"no {metric} scraped from the job's driver pod"
        for s in series:
            labels = s["metric"]
            assert (labels.get("namespace"), labels.get("role"), labels.get("pod")) == (
                ns, "driver", "quickstart-driver-0"), labels
            assert labels["job"] == f"{OPERATOR_NAMESPACE}/{RELEASE}-operator-jobs", labels  # the PodMonitor's job label
    (version,) = prometheus.query(f'max_over_time(asyncrl_policy_version{{asyncrljob="quickstart",namespace="{ns}"}}[1h])')
    assert 1 <= float(version["value"][1]) <= STEPS, version
    # one series per correction.reference, pre-set to 0; the job's own (exact) counted its tokens
    valid = {s["metric"]["reference"]: float(s["value"][1]) for s in prometheus.query(
        f'max_over_time(asyncrl_discrepancy_valid_tokens_total{{namespace="{ns}",asyncrljob="quickstart"}}[1h])')}
    assert valid["exact"] > 0 and all(v == 0 for r, v in valid.items() if r != "exact"), valid
    # 2. the operator's series, from its pod through the metrics Service: the job's own namespace, not the operator's
    phases = prometheus.query('last_over_time(asyncrl_operator_job_phase{asyncrljob="quickstart"}[1h])')
    assert phases and {s["metric"]["namespace"] for s in phases} == {ns}, phases
    assert {s["metric"].get("service") for s in phases} == {f"{RELEASE}-operator-metrics"}, phases
    ever = prometheus.query('max_over_time(asyncrl_operator_job_phase{asyncrljob="quickstart",phase="Running"}[1h])')
    assert ever and float(ever[0]["value"][1]) == 1.0, ever  # the operator saw the job Running
    # 3. the chart's alert rules: every group loaded, every rule evaluated without error
    groups = prometheus.api("rules")["groups"]
    assert len(groups) == prometheus.rule_groups, groups
    rules = [r for g in groups for r in g["rules"]]
    assert rules and all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
