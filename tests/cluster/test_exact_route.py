"""The exact route on real pods: ``correction.reference: exact`` with ``oldLogits.strategy: dedicated`` puts the
old-logit scorer in a pod of its own, which joins Ray like the others; the job trains to Succeeded."""

import json

import pytest

from tests.support.cluster import RUN_DIR, Cluster
from tests.support.cluster_jobs import load_job, submit
from tests.support.helpers import ROOT

pytestmark = pytest.mark.cluster

TWIN = ROOT / "examples" / "quickstart-cluster.yaml"
STEPS = 4
NAME = "exact"
PODS = {f"{NAME}-driver-0", f"{NAME}-rollout-0", f"{NAME}-rollout-1", f"{NAME}-actor-0", f"{NAME}-oldlogit-0"}


def test_the_dedicated_scorer_route_trains_to_completion_on_real_pods(cluster: Cluster, operator: str) -> None:
    ns = cluster.namespace("exact")
    job = load_job(TWIN, ns, train={"steps": STEPS}, eval={"everySteps": 100, "prompts": 16},
                   oldLogits={"strategy": "dedicated", "dedicated": {"replicas": 1, "maxLagVersions": 1}})
    job["metadata"]["name"] = NAME
    job["spec"]["correction"] = {"reference": "exact", "mask": job["spec"]["correction"]["mask"],
                                 "clip": job["spec"]["correction"]["clip"]}
    rec = submit(cluster, job)
    rec.wait_for("every pod Ready", lambda r: PODS <= {p for p, s in r.pods.items() if s.ever_ready}, timeout=900)
    rec.wait_for("a terminal phase", lambda r: r.phase in ("Succeeded", "Failed"), timeout=1200)
    RUN_DIR.joinpath("timeline-exact.json").write_text(json.dumps(rec.timeline, indent=1))
    assert rec.phase == "Succeeded", rec.status
    assert rec.status["training"]["policyVersion"] == STEPS
    log = cluster.logs(f"{NAME}-driver-0", ns, container="driver")
    assert f"step {STEPS}/{STEPS}: version {STEPS}," in log
