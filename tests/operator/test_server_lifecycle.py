"""The real operator process against the real API server: the job's life cycle end to end.

Every test runs in its own namespace with the ``restricted`` Pod Security level enforced by the
server, under the operator's chart RBAC (not admin). The tests play the kubelet and the scheduler
(``tests/support/kubelet.py``).
"""

import time
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api

from tests.support.apiserver import ApiServer
from tests.support.jobs import Jobs, wait_for
from tests.support.kubelet import Kubelet
from tests.support.operator_proc import OperatorProcess

POD_NAMES = {"job1-driver-0", "job1-rollout-0", "job1-rollout-1", "job1-actor-0"}


def start_running(jobs: Jobs, kubelet: Kubelet, **spec: Any) -> None:
    jobs.create(**spec)
    jobs.wait_pods(4)
    for name in jobs.live_pods():
        kubelet.run(name)
    jobs.wait_phase("Running")


def test_create_gives_children_status_and_columns(jobs: Jobs, kubelet: Kubelet, apiserver: ApiServer) -> None:
    jobs.create()
    pods = jobs.wait_pods(4)
    assert set(pods) == POD_NAMES
    uid = jobs.get()["metadata"]["uid"]
    for p in pods.values():
        (ref,) = p["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"], ref["blockOwnerDeletion"]) == \
            ("AsyncRLJob", "job1", uid, True, True)
    core = jobs.core
    assert core.read_namespaced_config_map("job1-spec", jobs.ns).metadata.owner_references[0].uid == uid
    assert core.read_namespaced_service("job1", jobs.ns).spec.cluster_ip == "None"
    jobs.wait_phase("Initializing")
    for name in pods:
        kubelet.run(name)
    st = jobs.wait_phase("Running")
    assert st["replicas"]["rollout"] == "2/2" and st["replicas"]["actor"] == "1/1"
    assert st["observedGeneration"] == 1
    assert jobs.condition("Running")["status"] == "True" and jobs.condition("PodsReady")["status"] == "True"
    jobs.wait_reasons("CreatedPod", "PodsReady")
    table = apiserver.kubectl("get", "arj", "-n", jobs.ns, "-o", "wide").stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "VERSION", "KEEP%", "STALENESS", "ROLLOUT", "ACTOR", "RESTARTS", "REASON",
                      "SYNC", "EXPORT", "ENDPOINT", "AGE"], table
    assert "Running" in table and "2/2" in table


def test_lost_rollout_pod_is_replaced_alone(jobs: Jobs, kubelet: Kubelet) -> None:
    start_running(jobs, kubelet)
    uids = {n: p["metadata"]["uid"] for n, p in jobs.live_pods().items()}
    jobs.core.delete_namespaced_pod("job1-rollout-1", jobs.ns)  # unbound: gone at once
    wait_for(lambda: (p := jobs.live_pods().get("job1-rollout-1")) is not None
             and p["metadata"]["uid"] != uids["job1-rollout-1"], message="rollout-1 replaced")
    after = {n: p["metadata"]["uid"] for n, p in jobs.live_pods().items()}
    assert after["job1-driver-0"] == uids["job1-driver-0"] and after["job1-actor-0"] == uids["job1-actor-0"]
    # the status patch follows the create in the same reconcile: the new pod can be seen first
    wait_for(lambda: jobs.status().get("rolloutReplacements") == 1, message="rolloutReplacements 1")
    assert jobs.status()["restarts"] == 0


def test_driver_failure_restarts_with_backoff_then_fails(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()  # backoffLimit 2
    for attempt in (1, 2):
        jobs.wait_pods(4)
        for name in jobs.live_pods():
            kubelet.run(name)
        jobs.wait_phase("Running")
        kubelet.terminate("job1-driver-0", exit_code=1)
        wait_for(lambda a=attempt: jobs.status().get("restarts") == a, message=f"restart {attempt}")
    pods = jobs.wait_pods(4)
    assert {p["metadata"]["annotations"]["asyncrl.io/epoch"] for p in pods.values()} == {"2"}
    jobs.wait_phase("Initializing")
    kubelet.terminate("job1-actor-0", exit_code=137, reason="OOMKilled")
    st = jobs.wait_phase("Failed")
    assert st["reason"] == "BackoffLimitExceeded" and "OOMKilled" in st["message"]
    # the pods that still ran are deleted (GPUs freed); the failed ones stay for their logs
    wait_for(lambda: set(jobs.pods()) == {"job1-actor-0"}, message="running pods deleted on Failed")
    jobs.core.delete_namespaced_service("job1", jobs.ns)
    time.sleep(3)  # three resync periods: terminal stays terminal, nothing is recreated
    with pytest.raises(ApiException):
        jobs.core.read_namespaced_service("job1", jobs.ns)
    assert jobs.phase() == "Failed"
    # the restart itself was a timer-scheduled reconcile (backoff): its events still arrived
    wait_for(lambda: jobs.reasons().count("CreatedPod") >= 12, message="12 CreatedPod events (3 attempts x 4)")


def test_preemption_is_not_counted(jobs: Jobs, kubelet: Kubelet) -> None:
    start_running(jobs, kubelet)
    kubelet.terminate("job1-actor-0", exit_code=143, disrupted=True)
    wait_for(lambda: jobs.status().get("preemptions") == 1, message="preemption counted")
    assert jobs.status()["restarts"] == 0
    jobs.wait_pods(4)
    jobs.wait_phase("Initializing")


def test_preemption_seen_while_terminating_or_after_the_pod_is_gone(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()
    pods = jobs.wait_pods(4)
    for name in pods:
        kubelet.bind(name)  # bound pods terminate gracefully: deletionTimestamp until the kubelet confirms
        kubelet.run(name)
    jobs.wait_phase("Running")
    # 1) the scheduler marks the actor for preemption and deletes it: still terminating
    kubelet.disrupt("job1-actor-0")
    jobs.core.delete_namespaced_pod("job1-actor-0", jobs.ns)
    wait_for(lambda: jobs.status().get("preemptions") == 1, message="preemption seen on a terminating pod")
    assert jobs.status()["restarts"] == 0
    for name in list(jobs.pods()):
        if jobs.pods()[name]["metadata"].get("deletionTimestamp"):
            kubelet.finish_termination(name)
    # 2) a pod that was disrupted and is already gone when the operator looks
    pods = jobs.wait_pods(4)
    for name in pods:
        kubelet.run(name)
    jobs.wait_phase("Running")
    kubelet.disrupt("job1-rollout-0")
    kubelet.disrupt("job1-driver-0")
    jobs.core.delete_namespaced_pod("job1-driver-0", jobs.ns, grace_period_seconds=0)
    wait_for(lambda: jobs.status().get("preemptions") == 2, message="preemption of a vanished pod")
    assert jobs.status()["restarts"] == 0


def test_suspend_waits_for_old_pods_and_resume_starts_fresh(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()
    pods = jobs.wait_pods(4)
    for name in pods:
        kubelet.bind(name)
        kubelet.run(name)
    jobs.wait_phase("Running")
    jobs.patch({"spec": {"runPolicy": {"suspend": True}}})
    jobs.wait_phase("Suspended")
    wait_for(lambda: all(p["metadata"].get("deletionTimestamp") for p in jobs.pods().values()),
             message="pods terminating")
    jobs.patch({"spec": {"runPolicy": {"suspend": False}}})
    time.sleep(3)
    # the old pods are still terminating (no kubelet confirmed): nothing new, nothing counted
    assert all(p["metadata"].get("deletionTimestamp") for p in jobs.pods().values())
    assert jobs.status()["restarts"] == 0 and jobs.phase() in ("Pending", "Initializing")
    for name in list(jobs.pods()):
        kubelet.finish_termination(name)
    pods = jobs.wait_pods(4)
    assert all(not p["metadata"].get("deletionTimestamp") for p in pods.values())
    jobs.wait_phase("Initializing")
    assert jobs.status()["restarts"] == 0
    jobs.wait_reasons("Suspended", "Resumed")


def test_delete_removes_pods_and_the_finalizer(jobs: Jobs, kubelet: Kubelet, operator_process: OperatorProcess) -> None:
    jobs.create()
    jobs.wait_pods(4)
    assert "asyncrl.io/finalizer" in jobs.get()["metadata"]["finalizers"]
    jobs.delete()
    wait_for(lambda: jobs.get() is None and not jobs.pods(), message="job and pods gone")
    assert f'asyncrljob="job1",namespace="{jobs.ns}"' not in operator_process.metrics()


def test_malformed_job_is_refused_by_the_server_and_makes_no_pods(jobs: Jobs) -> None:
    with pytest.raises(ApiException) as err:
        jobs.create(rollout={"replicas": 0}, train={"steps": 0})
    assert err.value.status == 422
    assert "spec.rollout.replicas" in err.value.body and "spec.train.steps" in err.value.body
    assert jobs.get() is None and not jobs.pods()


def test_mask_collapse_degrades_and_suspends(jobs: Jobs, kubelet: Kubelet) -> None:
    from asyncrl.api.status import TrainingSummary, training_patch

    start_running(jobs, kubelet, monitoring={"maskGuard": {"action": "Suspend"}})
    report = TrainingSummary(policy_version=12, keep_ratio=0.42, clip_fraction=0.1, staleness_max=2)
    jobs.patch_status(training_patch(report))
    jobs.wait_phase("Suspended")
    degraded = jobs.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "MaskCollapse")
    assert jobs.status()["training"]["keepPercent"] == 42.0  # the driver's field survives the operator's writes
    assert jobs.get()["spec"]["runPolicy"]["suspend"] is True
    reasons = jobs.wait_reasons("MaskCollapseDetected", "SuspendedByMaskGuard")
    assert reasons.count("MaskCollapseDetected") == 1


def test_operator_restart_midway_makes_no_duplicates(apiserver: ApiServer, kube: Any) -> None:
    ns = apiserver.namespace("restart-1")
    jobs = Jobs(kube, ns)
    first = OperatorProcess(apiserver, ["restart-*"]).start()
    try:
        jobs.create()
        wait_for(lambda: len(jobs.pods()) >= 1, message="first pods")
    finally:
        first.stop()
    CoreV1Api(kube).delete_namespaced_pod("job1-rollout-0", ns)
    second = OperatorProcess(apiserver, ["restart-*"]).start()
    try:
        jobs.wait_pods(4)
        time.sleep(2)
        names = list(jobs.pods())
        assert len(names) == len(set(names)) == 4
    finally:
        second.stop()


def test_example_job_files_create_pods_the_server_admits(jobs: Jobs, apiserver: ApiServer) -> None:
    """The quickstart as a user applies it: every pod passes the namespace's `restricted` Pod Security level."""
    from tests.support.helpers import ROOT

    out = apiserver.kubectl("apply", "-n", jobs.ns, "-f", str(ROOT / "api" / "examples" / "quickstart.yaml"))
    assert "created" in out.stdout
    wait_for(lambda: len(jobs.live_pods("quickstart")) == 4, message="quickstart pods")
    assert apiserver.kubectl("get", "ns", jobs.ns, "-o", "jsonpath={.metadata.labels}").stdout.count("restricted")
    assert "FailedToCreatePod" not in jobs.reasons("quickstart")


def test_job_in_a_foreign_namespace_pattern_is_left_alone(apiserver: ApiServer, kube: Any,
                                                          operator_process: OperatorProcess) -> None:
    ns = apiserver.namespace("other-1")
    jobs = Jobs(kube, ns)
    jobs.create()
    time.sleep(2)
    assert not jobs.pods() and not jobs.status()
