"""A small job trains to completion on real pods: the chart's operator, the kubelet, Ray across pods.

The quickstart's cluster twin (examples/quickstart-cluster.yaml) with a few steps: a driver pod, two rollout
pods and one actor pod on CPU, in a namespace that enforces the restricted Pod Security level. Every phase
below comes from the kubelet or the job's own status sidecar; nothing here writes a status.
"""

import json
import re

import pytest

from tests.support.cluster import RUN_DIR, Cluster
from tests.support.cluster_jobs import load_job, submit
from tests.support.helpers import ROOT

pytestmark = pytest.mark.cluster

TWIN = ROOT / "examples" / "quickstart-cluster.yaml"
STEPS = 4
PODS = {"quickstart-driver-0", "quickstart-rollout-0", "quickstart-rollout-1", "quickstart-actor-0"}


def test_a_small_job_trains_to_completion_on_real_pods(cluster: Cluster, operator: str) -> None:
    ns = cluster.namespace("train")  # pod-security.kubernetes.io/enforce: restricted
    job = load_job(TWIN, ns, train={"steps": STEPS}, eval={"everySteps": 2, "prompts": 16})
    rec = submit(cluster, job)

    rec.wait_for("pod of each role Ready", lambda r: PODS <= {p for p, s in r.pods.items() if s.ever_ready},
                 timeout=900)
    rec.mark("all pods Ready")
    # Ray joined across pods through the head Service's DNS name, with the job's token: a worker's readiness probe
    # asks the head at that name whether this pod's raylet is ALIVE; with another token the head refuses it
    probe = cluster.get("pod", "quickstart-rollout-0", ns)["spec"]["containers"][0]["readinessProbe"]["exec"]["command"]
    assert f"quickstart-driver-0.quickstart.{ns}.svc:6379" in probe
    exec_ = ("exec", "-n", ns, "quickstart-rollout-0", "-c", "rollout", "--")
    assert "is ALIVE" in cluster.kubectl(*exec_, *probe).stdout
    other = cluster.kubectl(*exec_, "env", "RAY_AUTH_TOKEN=not-the-jobs-token", *probe, check=False)
    assert other.returncode != 0 and "refused this pod's Ray token" in other.stdout + other.stderr, other
    rec.wait_for("first policy version", lambda r: r.version >= 1, timeout=900)
    table = cluster.kubectl("get", "arj", "quickstart", "-n", ns).stdout  # the printer columns, mid-run
    rec.wait_for("a terminal phase", lambda r: r.phase in ("Succeeded", "Failed"), timeout=1200)
    RUN_DIR.joinpath("timeline-train.json").write_text(json.dumps(rec.timeline, indent=1))
    print("timeline (s after submit):", json.dumps(rec.timeline))

    assert rec.phase == "Succeeded", rec.status
    # every pod ran under the restricted level (the namespace enforces it) and reached Running and Ready
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
