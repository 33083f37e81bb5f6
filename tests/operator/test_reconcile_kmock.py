"""The real operator (kopf) against the realistic fake API server: end-to-end scenarios."""

from typing import Any

import pytest

from tests.support.fakeapi import ApiError, FakeCluster
from tests.support.helpers import job_manifest, wait_for

NS = "default"
SEL = "asyncrl.io/job=job1"


def pods(c: FakeCluster, selector: str = SEL) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in c.items("pods", NS, selector)}


def status(c: FakeCluster, name: str = "job1") -> dict[str, Any]:
    return (c.get("asyncrljobs", NS, name) or {}).get("status") or {}


def run_pods(c: FakeCluster, names: list[str] | None = None) -> None:
    """Play the kubelet: mark pods Running and Ready through the status subresource."""
    for name in names or list(pods(c)):
        c.patch("pods", NS, name, {"status": {"phase": "Running",
                                              "conditions": [{"type": "Ready", "status": "True"}]}}, sub="status")


def fail_pod(c: FakeCluster, name: str, disrupted: bool = False) -> None:
    conds = [{"type": "Ready", "status": "False"}]
    if disrupted:
        conds.append({"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"})
    c.patch("pods", NS, name, {"status": {"phase": "Failed", "reason": "Error", "conditions": conds}}, sub="status")


def phase_is(c: FakeCluster, phase: str, name: str = "job1") -> bool:
    return status(c, name).get("phase") == phase


def test_create_gives_children_and_status(cluster: FakeCluster, operator: Any) -> None:
    cluster.create("asyncrljobs", job_manifest())
    wait_for(lambda: len(pods(cluster)) == 4, message="driver + 2 rollout + 1 actor")
    assert set(pods(cluster)) == {"job1-driver-0", "job1-rollout-0", "job1-rollout-1", "job1-actor-0"}
    job = cluster.get("asyncrljobs", NS, "job1")
    for p in pods(cluster).values():
        ref = p["metadata"]["ownerReferences"][0]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("AsyncRLJob", "job1",
                                                                           job["metadata"]["uid"], True)
        assert p["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "asyncrl-operator"
    for kind, name in [("configmaps", "job1-spec"), ("services", "job1"), ("serviceaccounts", "job1-status"),
                       ("roles", "job1-status"), ("rolebindings", "job1-status")]:
        assert cluster.get(kind, NS, name) is not None, (kind, name)
    wait_for(lambda: phase_is(cluster, "Initializing"), message="Initializing")
    run_pods(cluster)
    wait_for(lambda: phase_is(cluster, "Running"), message="Running")
    st = status(cluster)
    assert st["replicas"]["rollout"] == "2/2" and st["replicas"]["actor"] == "1/1"
    assert st["observedGeneration"] == 1
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Running"]["status"] == "True" and conds["PodsReady"]["status"] == "True"
    reasons = {e[1] for e in cluster.events()}
    assert {"CreatedPod", "CreatedConfigMap", "CreatedService", "PodsReady"} <= reasons


def test_lost_rollout_pod_is_replaced_alone(cluster: FakeCluster, operator: Any) -> None:
    cluster.create("asyncrljobs", job_manifest())
    wait_for(lambda: len(pods(cluster)) == 4)
    run_pods(cluster)
    wait_for(lambda: phase_is(cluster, "Running"))
    uids = {n: p["metadata"]["uid"] for n, p in pods(cluster).items()}
    cluster.delete("pods", NS, "job1-rollout-1")
    wait_for(lambda: "job1-rollout-1" in pods(cluster) and
             pods(cluster)["job1-rollout-1"]["metadata"]["uid"] != uids["job1-rollout-1"], message="replaced")
    after = {n: p["metadata"]["uid"] for n, p in pods(cluster).items()}
    assert after["job1-driver-0"] == uids["job1-driver-0"] and after["job1-actor-0"] == uids["job1-actor-0"]
    st = status(cluster)
    assert st["restarts"] == 0 and st["rolloutReplacements"] == 1


def test_driver_failure_restarts_with_backoff_then_fails(cluster: FakeCluster, operator: Any) -> None:
    cluster.create("asyncrljobs", job_manifest())  # backoffLimit 2
    for attempt in (1, 2):
        wait_for(lambda: len(pods(cluster)) == 4 and phase_is(cluster, "Initializing"))
        run_pods(cluster)
        wait_for(lambda: phase_is(cluster, "Running"))
        fail_pod(cluster, "job1-driver-0")
        wait_for(lambda a=attempt: status(cluster).get("restarts") == a, message=f"restart {attempt}")
        assert status(cluster)["restartAfter"]
    wait_for(lambda: len(pods(cluster)) == 4 and phase_is(cluster, "Initializing"))
    epochs = {p["metadata"]["annotations"]["asyncrl.io/epoch"] for p in pods(cluster).values()}
    assert epochs == {"2"}
    fail_pod(cluster, "job1-actor-0")
    wait_for(lambda: phase_is(cluster, "Failed"), message="Failed after backoffLimit")
    assert status(cluster)["reason"] == "BackoffLimitExceeded"
    wait_for(lambda: all(p.get("status", {}).get("phase") == "Failed" for p in pods(cluster).values()),
             message="running pods deleted on Failed")
    # terminal stays terminal: a child deleted by hand is not recreated
    cluster.delete("services", NS, "job1")
    import time
    time.sleep(1.5)  # three resync periods
    assert cluster.get("services", NS, "job1") is None and phase_is(cluster, "Failed")


def test_preemption_is_not_counted(cluster: FakeCluster, operator: Any) -> None:
    cluster.create("asyncrljobs", job_manifest())
    wait_for(lambda: len(pods(cluster)) == 4)
    run_pods(cluster)
    wait_for(lambda: phase_is(cluster, "Running"))
    fail_pod(cluster, "job1-actor-0", disrupted=True)
    wait_for(lambda: status(cluster).get("preemptions") == 1)
    assert status(cluster)["restarts"] == 0
    wait_for(lambda: len(pods(cluster)) == 4 and phase_is(cluster, "Initializing"), message="recreated")


def test_suspend_and_resume(cluster: FakeCluster, operator: Any) -> None:
    cluster.create("asyncrljobs", job_manifest())
    wait_for(lambda: len(pods(cluster)) == 4)
    cluster.patch("asyncrljobs", NS, "job1", {"spec": {"runPolicy": {"suspend": True}}})
    wait_for(lambda: phase_is(cluster, "Suspended") and not pods(cluster), message="suspended, pods gone")
    assert cluster.get("configmaps", NS, "job1-spec") is not None  # spec (and checkpoint) kept
    cluster.patch("asyncrljobs", NS, "job1", {"spec": {"runPolicy": {"suspend": False}}})
    wait_for(lambda: len(pods(cluster)) == 4 and phase_is(cluster, "Initializing"), message="resumed")
    reasons = [e[1] for e in cluster.events()]
    assert "Suspended" in reasons and "Resumed" in reasons


def test_delete_cleans_up(cluster: FakeCluster, operator: Any) -> None:
    cluster.create("asyncrljobs", job_manifest())
    wait_for(lambda: len(pods(cluster)) == 4)
    job = cluster.get("asyncrljobs", NS, "job1")
    assert "asyncrl.io/finalizer" in job["metadata"]["finalizers"]
    cluster.delete("asyncrljobs", NS, "job1")
    wait_for(lambda: cluster.get("asyncrljobs", NS, "job1") is None and not pods(cluster), message="all gone")
    assert operator.metrics.get_sample_value(
        "asyncrl_operator_job_phase", {"namespace": NS, "asyncrljob": "job1", "phase": "Initializing"}) is None


def test_operator_restart_midway_makes_no_duplicates(cluster: FakeCluster, operator_factory: Any) -> None:
    with operator_factory():
        cluster.create("asyncrljobs", job_manifest())
        wait_for(lambda: len(pods(cluster)) >= 1)
    # the first operator is gone; remove one child so the second one has work to do
    cluster.delete("pods", NS, "job1-rollout-0")
    with operator_factory():
        wait_for(lambda: len(pods(cluster)) == 4, message="converged after restart")
        run_pods(cluster)
        wait_for(lambda: phase_is(cluster, "Running") or phase_is(cluster, "Restarting"))
    names = [p["metadata"]["name"] for p in cluster.items("pods", NS)]
    assert len(names) == len(set(names)) == 4


def test_malformed_cr_is_rejected_by_the_crd(cluster: FakeCluster, operator: Any) -> None:
    bad = job_manifest(rollout={"replicas": 0}, correction={"mask": {"bounds": {"low": 1.5, "high": 2.0}}})
    with pytest.raises(ApiError) as err:
        cluster.create("asyncrljobs", bad)
    assert err.value.status == 422
    fields = {c["field"] for c in err.value.body["details"]["causes"]}
    assert {"spec.rollout.replicas", "spec.correction.mask.bounds"} <= fields
    assert cluster.get("asyncrljobs", NS, "job1") is None and not pods(cluster)


def test_spec_slipping_past_the_crd_is_validation_failed(cluster: FakeCluster, operator: Any) -> None:
    cluster.emulator.bypass_validation = True  # e.g. an older CRD installed than the operator's
    cluster.create("asyncrljobs", job_manifest(actor={"replicas": 3, "gpusPerReplica": 1,
                                                      "megatron": {"tensorParallel": 2}}))
    cluster.emulator.bypass_validation = False
    wait_for(lambda: phase_is(cluster, "ValidationFailed"))
    assert "spec.actor" in status(cluster)["message"]
    assert not pods(cluster)


def test_mask_collapse_degrades_and_suspends(cluster: FakeCluster, operator: Any) -> None:
    from asyncrl.api.status import TrainingSummary, training_patch
    cluster.create("asyncrljobs", job_manifest(monitoring={"maskGuard": {"action": "Suspend"}}))
    wait_for(lambda: len(pods(cluster)) == 4)
    run_pods(cluster)
    wait_for(lambda: phase_is(cluster, "Running"))
    report = TrainingSummary(policy_version=12, keep_ratio=0.42, clip_fraction=0.1, max_staleness=2)
    cluster.patch("asyncrljobs", NS, "job1", training_patch(report), sub="status")
    wait_for(lambda: phase_is(cluster, "Suspended"), message="suspended by the mask guard")
    st = status(cluster)
    degraded = {c["type"]: c for c in st["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "MaskCollapse")
    assert st["training"]["keepPercent"] == 42.0  # the driver's field survived the operator's writes
    assert cluster.get("asyncrljobs", NS, "job1")["spec"]["runPolicy"]["suspend"] is True
    reasons = [e[1] for e in cluster.events()]
    assert reasons.count("MaskCollapseDetected") == 1 and "SuspendedByMaskGuard" in reasons
