"""Failure semantics on the real API server: what a cluster does to pods, and what the operator makes of it.

Each case is something a fake server got wrong or could not show: quota refusals, waiting reasons,
attempt-scoped deadlines, a bad-spec exit, edits while running, foreign children.
"""

import time

import pytest
import yaml
from kubernetes.client import ApiException

from tests.support.apiserver import ApiServer
from tests.support.jobs import Jobs, wait_for
from tests.support.kubelet import Kubelet


def run_all(jobs: Jobs, kubelet: Kubelet, job: str = "job1") -> None:
    for name in jobs.live_pods(job):
        kubelet.run(name)
    jobs.wait_phase("Running", job)


def test_failed_create_is_a_condition_with_the_servers_message(jobs: Jobs, apiserver: ApiServer) -> None:
    # A ResourceQuota of 2 pods; its status is what the quota controller would write (none runs here),
    # and the server's quota admission then refuses the third pod with 403 "exceeded quota".
    apiserver.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods", "namespace": jobs.ns},
                     "spec": {"hard": {"pods": "2"}}})
    apiserver.kubectl("patch", "resourcequota", "pods", "-n", jobs.ns, "--subresource=status", "--type=merge",
                      "-p", '{"status": {"hard": {"pods": "2"}, "used": {"pods": "0"}}}')
    jobs.create()
    wait_for(lambda: jobs.condition("FailedCreate").get("status") == "True", message="FailedCreate condition")
    cond = jobs.condition("FailedCreate")
    assert "exceeded quota" in cond["message"], cond
    assert jobs.status()["restarts"] == 0 and jobs.status().get("preemptions", 0) == 0
    # kopf posts events from a queue: they can trail the status write
    wait_for(lambda: any(t == "Warning" and "exceeded quota" in m for t, _, m in jobs.events()),
             message="a Warning event with the server's message")
    time.sleep(2)  # retried with backoff, never counted as a lost pod
    assert jobs.status()["restarts"] == 0 and jobs.phase() != "Failed"
    apiserver.kubectl("patch", "resourcequota", "pods", "-n", jobs.ns, "--type=merge", "-p",
                      '{"spec": {"hard": {"pods": "10"}}}')
    apiserver.kubectl("patch", "resourcequota", "pods", "-n", jobs.ns, "--subresource=status", "--type=merge",
                      "-p", '{"status": {"hard": {"pods": "10"}}}')
    jobs.wait_pods(4, timeout=40)
    wait_for(lambda: jobs.condition("FailedCreate").get("status") == "False", message="FailedCreate cleared")
    assert jobs.status()["restarts"] == 0


def test_waiting_reasons_reach_status_and_events(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()
    jobs.wait_pods(4)
    jobs.wait_phase("Initializing")
    kubelet.waiting("job1-actor-0", "ImagePullBackOff", 'Back-off pulling image "asyncrl/job:0.1.0"')
    kubelet.unschedulable("job1-rollout-1")
    wait_for(lambda: "ImagePullBackOff" in (jobs.status().get("message") or "")
             and "Unschedulable" in (jobs.status().get("message") or ""), message="waiting reasons in status")
    ready = jobs.condition("PodsReady")
    assert ready["status"] == "False" and "ImagePullBackOff" in ready["message"] + ready["reason"]
    jobs.wait_reasons("ImagePullBackOff", "Unschedulable")  # one Warning event per new waiting reason
    assert {r for t, r, _ in jobs.events() if r in ("ImagePullBackOff", "Unschedulable")} and all(
        t == "Warning" for t, r, _ in jobs.events() if r in ("ImagePullBackOff", "Unschedulable"))
    kubelet.waiting("job1-rollout-0", "CreateContainerConfigError", 'secret "hf-token" not found')
    wait_for(lambda: "CreateContainerConfigError" in (jobs.status().get("message") or ""),
             message="config error in status")


def test_pre_running_deadline_counts_per_attempt(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create(runPolicy={"preRunningDeadlineSeconds": 4, "backoffLimit": 2})
    jobs.wait_pods(4)
    run_all(jobs, kubelet)
    time.sleep(5)  # a long first attempt: training for longer than the pre-running deadline
    kubelet.terminate("job1-driver-0", exit_code=1)
    wait_for(lambda: jobs.status().get("restarts") == 1, message="restart")
    jobs.wait_pods(4)
    jobs.wait_phase("Initializing")
    assert jobs.phase() == "Initializing", jobs.status()  # not "stuck initializing" because of attempt 1
    st = jobs.wait_phase("Failed", timeout=15)  # attempt 2 never runs: its own deadline expires
    assert st["reason"] == "PreRunningDeadlineExceeded"


def test_driver_exit_code_2_is_a_permanent_spec_failure(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()
    jobs.wait_pods(4)
    run_all(jobs, kubelet)
    kubelet.terminate("job1-driver-0", exit_code=2,
                      message="/etc/asyncrl/job.yaml: spec.task.name: got 'chess'; expected one of calculator")
    st = jobs.wait_phase("Failed")
    assert st["reason"] == "InvalidSpec" and st["restarts"] == 0
    time.sleep(2)
    assert jobs.phase() == "Failed" and jobs.status()["restarts"] == 0


def test_spec_edit_while_running_is_a_deliberate_gang_restart(jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()
    jobs.wait_pods(4)
    run_all(jobs, kubelet)
    before = {n: p["metadata"]["uid"] for n, p in jobs.live_pods().items()}
    jobs.patch({"spec": {"train": {"learningRate": 1.0e-4}}})
    wait_for(lambda: jobs.status().get("observedGeneration") == 2, message="generation 2 observed")
    wait_for(lambda: set(jobs.live_pods()) == set(before)
             and all(p["metadata"]["uid"] != before[n] for n, p in jobs.live_pods().items()),
             message="every pod recreated for the new spec")
    st = jobs.status()
    assert st["restarts"] == 0, st
    jobs.wait_reasons("SpecChanged")
    cm = jobs.core.read_namespaced_config_map("job1-spec", jobs.ns)
    assert yaml.safe_load(cm.data["job.yaml"])["spec"]["train"]["learningRate"] == pytest.approx(1.0e-4)
    # an operator-only field changes nothing in the pods
    uids = {n: p["metadata"]["uid"] for n, p in jobs.live_pods().items()}
    jobs.patch({"spec": {"runPolicy": {"backoffLimit": 5}}})
    wait_for(lambda: jobs.status().get("observedGeneration") == 3, message="generation 3 observed")
    time.sleep(2)
    assert {n: p["metadata"]["uid"] for n, p in jobs.live_pods().items()} == uids
    # the model is immutable: the server refuses the edit (CEL transition rule)
    with pytest.raises(ApiException) as err:
        jobs.patch({"spec": {"model": {"preset": "small-llama"}}})
    assert err.value.status == 422 and "spec.model" in err.value.body


def test_foreign_children_are_never_adopted_or_overwritten(jobs: Jobs, apiserver: ApiServer) -> None:
    apiserver.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "job1-spec", "namespace": jobs.ns},
                     "data": {"job.yaml": "not ours"}})
    jobs.create()
    wait_for(lambda: jobs.condition("ChildConflict").get("status") == "True", message="ChildConflict condition")
    assert "job1-spec" in jobs.condition("ChildConflict")["message"]
    cm = jobs.core.read_namespaced_config_map("job1-spec", jobs.ns)
    assert cm.data == {"job.yaml": "not ours"} and not cm.metadata.owner_references
    assert not jobs.pods()  # pods would read the foreign spec: none is created
    wait_for(lambda: any(t == "Warning" and "job1-spec" in m for t, _, m in jobs.events()),
             message="a Warning event naming the foreign ConfigMap")


def test_a_foreign_pod_with_our_labels_is_ignored(jobs: Jobs, apiserver: ApiServer, kubelet: Kubelet) -> None:
    jobs.create()
    jobs.wait_pods(4)
    run_all(jobs, kubelet)
    impostor = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "job1-rollout-7", "namespace": jobs.ns,
                             "labels": {"asyncrl.io/job": "job1", "asyncrl.io/role": "rollout"}},
                "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000,
                                             "seccompProfile": {"type": "RuntimeDefault"}},
                         "containers": [{"name": "c", "image": "busybox",
                                         "securityContext": {"allowPrivilegeEscalation": False,
                                                             "capabilities": {"drop": ["ALL"]}}}]}}
    apiserver.apply(impostor)
    time.sleep(3)
    assert "job1-rollout-7" in jobs.pods(), "a pod the job does not own is never deleted"
    assert jobs.status()["replicas"]["rollout"] == "2/2" and jobs.phase() == "Running"


def test_a_spec_the_crd_cannot_check_is_validation_failed_and_makes_no_pods(jobs: Jobs) -> None:
    # engineArgs is an open object in the CRD (CEL cannot iterate it), so the server accepts unknown engine
    # flags; the operator validates with the typed model and refuses, naming the field, before any pod exists.
    jobs.create(rollout={"replicas": 2, "gpusPerReplica": 0, "engineArgs": {"gpu-memory-utilization": "0.9"}})
    st = jobs.wait_phase("ValidationFailed")
    assert "spec.rollout.engineArgs" in st["message"] and "fp32Head" in st["message"], st["message"]
    assert jobs.condition("SpecValid")["status"] == "False"
    time.sleep(2)
    assert not jobs.pods()
    jobs.patch({"spec": {"rollout": {"engineArgs": None}}})  # the corrected spec is picked up
    jobs.wait_pods(4)
