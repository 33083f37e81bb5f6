"""What the job's pods look like once the real API server has admitted them: hardening (the namespace
enforces the ``restricted`` Pod Security level), Ray token auth from a per-job Secret, the NetworkPolicy,
start-up order, GPUs, gang scheduling, Kueue's suspend, and pod overrides for private clusters."""

from typing import Any

from tests.support.apiserver import ApiServer
from tests.support.jobs import Jobs, wait_for


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env") or []}


def test_pods_are_hardened_and_authenticate_ray_with_the_jobs_secret(jobs: Jobs, kube: Any) -> None:
    jobs.create()
    pods = jobs.wait_pods(4)  # admitted by the restricted Pod Security level of the namespace
    uid = jobs.get()["metadata"]["uid"]
    secret = jobs.core.read_namespaced_secret("job1-ray-token", jobs.ns)
    assert secret.metadata.owner_references[0].uid == uid and secret.data.get("token")
    for name, pod in pods.items():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert spec["securityContext"].get("fsGroup") is not None
        for c in spec["containers"] + (spec.get("initContainers") or []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], (name, c["name"])
        env = env_of(spec["containers"][0])
        token = [e for e in env.values() if (e.get("valueFrom") or {}).get("secretKeyRef", {}).get("name")
                 == "job1-ray-token"]
        assert token, (name, sorted(env))
        assert env.get("RAY_AUTH_MODE", {}).get("value") != "disabled", name
    from kubernetes.client import NetworkingV1Api

    (policy,) = NetworkingV1Api(kube).list_namespaced_network_policy(jobs.ns).items
    assert policy.metadata.owner_references[0].uid == uid
    assert policy.spec.pod_selector.match_labels == {"asyncrl.io/job": "job1"}
    sources = [p for rule in policy.spec.ingress for p in rule._from or []]
    assert any((s.pod_selector and s.pod_selector.match_labels == {"asyncrl.io/job": "job1"}
                and s.namespace_selector is None) for s in sources), sources


def test_workers_wait_for_the_head_and_report_ray_membership(jobs: Jobs) -> None:
    jobs.create()
    pods = jobs.wait_pods(4)
    driver = pods["job1-driver-0"]["spec"]
    # the driver waits for nothing; its one init container is the status sidecar (test_server_dataset_volume.py)
    assert [(c["name"], c.get("restartPolicy")) for c in driver["initContainers"]] == [("status", "Always")]
    assert driver["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/api/gcs_healthz"
    for name in ("job1-rollout-0", "job1-actor-0"):
        spec = pods[name]["spec"]
        (init,) = spec["initContainers"]
        assert "job1-driver-0.job1" in " ".join(init.get("command", []) + init.get("args", []))
        main = spec["containers"][0]
        assert main["readinessProbe"], name
        cmd = " ".join(main["command"])
        assert "--num-cpus=" in cmd and "--memory=" in cmd and "--num-gpus=" in cmd
        shm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"].get("sizeLimit")


def test_gpus_are_requested_where_the_job_asks(jobs: Jobs) -> None:
    jobs.create(rollout={"replicas": 2, "gpusPerReplica": 1}, actor={"replicas": 1, "gpusPerReplica": 1})
    pods = jobs.wait_pods(4)
    for name in ("job1-rollout-0", "job1-rollout-1", "job1-actor-0"):
        c = pods[name]["spec"]["containers"][0]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert "--num-gpus=1" in c["command"]
    assert "nvidia.com/gpu" not in pods["job1-driver-0"]["spec"]["containers"][0]["resources"].get("limits", {})


def test_volcano_gang_scheduling_creates_the_pod_group(jobs: Jobs, kube: Any) -> None:
    from kubernetes.client import CustomObjectsApi

    jobs.create(scheduling={"gangScheduler": "volcano"})
    pods = jobs.wait_pods(4)
    group = CustomObjectsApi(kube).get_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", jobs.ns,
                                                                "podgroups", "job1")
    assert group["spec"]["minMember"] == 4
    assert group["metadata"]["ownerReferences"][0]["uid"] == jobs.get()["metadata"]["uid"]
    for pod in pods.values():
        assert pod["spec"]["schedulerName"] == "volcano"
        assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "job1"


def test_coscheduling_pod_group(jobs: Jobs, kube: Any) -> None:
    from kubernetes.client import CustomObjectsApi

    jobs.create(scheduling={"gangScheduler": "coscheduling"})
    pods = jobs.wait_pods(4)
    group = CustomObjectsApi(kube).get_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", jobs.ns,
                                                                "podgroups", "job1")
    assert group["spec"]["minMember"] == 4
    assert {p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] for p in pods.values()} == {"job1"}


def test_kueue_admits_a_suspended_job_by_flipping_suspend(jobs: Jobs, apiserver: ApiServer) -> None:
    from tests.support.helpers import job_manifest

    body = job_manifest("job1", jobs.ns, runPolicy={"suspend": True})
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "gpu-queue"}
    apiserver.apply(body)
    jobs.wait_phase("Suspended")
    assert not jobs.pods()
    jobs.patch({"spec": {"runPolicy": {"suspend": False}}})  # what Kueue does when it admits the workload
    pods = jobs.wait_pods(4)
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for p in pods.values()} == {"gpu-queue"}


def test_pod_overrides_for_private_clusters(jobs: Jobs, apiserver: ApiServer) -> None:
    apiserver.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hf", "namespace": jobs.ns},
                     "stringData": {"token": "x"}})
    template = {
        "imagePullSecrets": [{"name": "registry-creds"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu.class", "operator": "In", "values": ["h100"]}]}]}}},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
                {"name": "LOG_LEVEL", "value": "debug"}],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "podSecurityContext": {"runAsUser": 2000},
    }
    jobs.create(actor={"replicas": 1, "gpusPerReplica": 0, "template": template})
    pods = jobs.wait_pods(4)
    spec = pods["job1-actor-0"]["spec"]
    assert spec["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert spec["affinity"]["nodeAffinity"]
    assert {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoSchedule"} in spec["tolerations"]
    env = env_of(spec["containers"][0])
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf" and env["LOG_LEVEL"]["value"] == "debug"
    assert {"name": "data", "mountPath": "/data"}.items() <= next(
        m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "data").items()
    assert spec["securityContext"]["runAsUser"] == 2000 and spec["securityContext"]["runAsNonRoot"] is True
    assert "imagePullSecrets" not in pods["job1-rollout-0"]["spec"]  # per role
    wait_for(lambda: jobs.phase() == "Initializing", message="Initializing")
