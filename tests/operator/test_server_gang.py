"""A multi-rank actor on the real API server: the operator builds a gang of two actor pods (stable DNS
names, one Ray unit per rank, GPUs and RDMA devices, the checkpoint volume on both, a PodGroup over
every pod), and the loss of either actor pod restarts the whole gang once, from the checkpoint."""

import time
from typing import Any

import pytest
from kubernetes.client import ApiException, CustomObjectsApi

from tests.support.jobs import Jobs, wait_for
from tests.support.kubelet import Kubelet

ACTOR = {"replicas": 2, "gpusPerReplica": 2, "megatron": {"tensorParallel": 2},
         "resources": {"cpu": "1", "memory": "2Gi", "extra": {"rdma/hca": 1}}}
NAMES = {"job1-driver-0", "job1-rollout-0", "job1-rollout-1", "job1-actor-0", "job1-actor-1"}


def _terminate(kubelet: Kubelet, name: str) -> None:
    try:
        kubelet.terminate(name, exit_code=1, message="NCCL watchdog: rank 2 timed out")
    except ApiException as exc:  # the operator's gang restart may have deleted it already
        if exc.status != 404:
            raise


def test_two_actor_pod_gang_is_built_and_restarted_whole_once(jobs: Jobs, kubelet: Kubelet, kube: Any) -> None:
    jobs.create(actor=ACTOR, checkpoint={"volumeClaimName": "shared-ckpt"}, scheduling={"gangScheduler": "volcano"})
    pods = jobs.wait_pods(5)  # admitted by the namespace's restricted Pod Security level
    assert set(pods) == NAMES
    group = CustomObjectsApi(kube).get_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", jobs.ns,
                                                                "podgroups", "job1")
    assert group["spec"]["minMember"] == 5
    assert group["spec"]["minResources"]["nvidia.com/gpu"] == "4"  # 2 actor pods x 2 (rollout pods: CPU)
    assert group["spec"]["minResources"]["rdma/hca"] == "2"
    assert jobs.core.read_namespaced_service("job1", jobs.ns).spec.cluster_ip == "None"
    for i in (0, 1):
        spec = pods[f"job1-actor-{i}"]["spec"]
        assert (spec["hostname"], spec["subdomain"]) == (f"job1-actor-{i}", "job1")  # job1-actor-<i>.job1.<ns>.svc
        c = spec["containers"][0]
        assert f'--resources={{"actor": 2, "actor-{i}": 2}}' in c["command"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" and c["resources"]["limits"]["rdma/hca"] == "1"
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1" and env["ASYNCRL_WORLD_SIZE"] == "4"
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared-ckpt"}} in spec["volumes"]

    for name in pods:
        kubelet.run(name)
    jobs.wait_phase("Running")
    before = {n: p["metadata"]["uid"] for n, p in jobs.live_pods().items()}
    (epoch,) = {int(p["metadata"]["annotations"]["asyncrl.io/epoch"]) for p in jobs.live_pods().values()}
    # one actor rank's pod dies, and its peer follows before or after the operator has seen the first
    _terminate(kubelet, "job1-actor-1")
    _terminate(kubelet, "job1-actor-0")
    wait_for(lambda: jobs.status().get("restarts") == 1, message="one counted restart")
    # The Restarting phase's message is the status only until the new pods are created ("restart (epoch 1):
    # resuming ..."), which a loaded machine can reach before the status is read; its Warning event stays.
    restarting = wait_for(lambda: [m for kind, reason, m in jobs.events() if (kind, reason) == ("Warning", "PodFailed")],
                          message="the gang restart's Warning event")
    assert len(restarting) == 1 and "job1-actor-1 Failed" in restarting[0] \
        and "restart 1/2 from the last checkpoint" in restarting[0], restarting
    # every pod of the gang is new, of the next epoch: the driver, the rollout pods and both actor pods
    wait_for(lambda: set(jobs.live_pods()) == NAMES and all(
        p["metadata"]["uid"] != before[n] for n, p in jobs.live_pods().items()), timeout=30,
        message="the whole gang recreated")
    assert {p["metadata"]["annotations"]["asyncrl.io/epoch"] for p in jobs.live_pods().values()} == {str(epoch + 1)}
    for name in jobs.live_pods():
        kubelet.run(name)
    jobs.wait_phase("Running")
    time.sleep(2)  # two resync periods: the dead peer is not counted a second time
    assert jobs.status()["restarts"] == 1 and jobs.status().get("preemptions", 0) == 0


def test_the_server_refuses_gpus_or_zero_counts_among_the_device_resources(jobs: Jobs) -> None:
    for extra in ({"nvidia.com/gpu": 1}, {"rdma/hca": 0}):
        with pytest.raises(ApiException) as err:
            jobs.create(actor={"resources": {"extra": extra}})
        assert err.value.status == 422 and "spec.actor.resources.extra" in err.value.body, err.value.body
        assert "gpusPerReplica, not nvidia.com/gpu" in err.value.body
    assert jobs.get() is None
