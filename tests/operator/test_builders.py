"""Pure builders: names, labels, owner references, resources and roles of every child; hardening,
start-up order, Ray token auth, the NetworkPolicy, gang scheduling and the pod overrides."""

import hashlib
import json
from typing import Any

import kubernetes_validate
import pytest

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits import OldLogitStrategy
from asyncrl.operator import names
from asyncrl.operator.builders import Desired, JobRef, add_memory, desired, quantity_bytes, spec_hash
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.pod_policy import cpu_millis, merge, ray_num_cpus, shm_size_limit
from asyncrl.trainer.cli.commands import build_parser

REF = JobRef("j", "ns", "uid-1", {"team": "rl", "app.kubernetes.io/name": "spoofed"})
CFG = OperatorSettings(job_image="img:1")
TOKEN = "t0ken"


def spec_of(**sections: Any) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate(sections)


def build(ref: JobRef = REF, settings: OperatorSettings = CFG, **sections: Any) -> Desired:
    return desired(ref, spec_of(**sections), settings, epoch=3, ray_token=TOKEN)


def beyond_validation(spec: AsyncRLJobSpec, section: str, **fields: Any) -> AsyncRLJobSpec:
    """``spec`` with fields the driver cannot run yet (validation refuses them): the builders' code
    paths for a later driver, exercised without the validators."""
    part = getattr(spec, section).model_copy(update=fields)
    return spec.model_copy(update={section: part})


def container(d: Desired, name: str) -> dict[str, Any]:
    return d.pods[name].manifest["spec"]["containers"][0]


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def child(d: Desired, kind: str) -> dict[str, Any]:
    (c,) = [c for c in d.children if c.kind == kind]
    return c.manifest


def test_names_labels_and_owner() -> None:
    d = build(rollout={"replicas": 3})
    assert sorted(d.pods) == ["j-actor-0", "j-driver-0", "j-rollout-0", "j-rollout-1", "j-rollout-2"]
    meta = d.pods["j-rollout-2"].manifest["metadata"]
    assert meta["labels"][names.LABEL_JOB] == "j" and meta["labels"][names.LABEL_ROLE] == "rollout"
    assert meta["labels"]["app.kubernetes.io/name"] == "asyncrl"  # ours win over the job's own labels
    assert meta["labels"]["team"] == "rl" and meta["labels"][names.LABEL_INDEX] == "2"
    assert meta["annotations"][names.ANNOTATION_EPOCH] == "3"
    owner = [{"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "name": "j",
              "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    assert meta["ownerReferences"] == owner
    assert [c.kind for c in d.children] == ["Secret", "ConfigMap", "Service", "NetworkPolicy", "ServiceAccount",
                                            "Role", "RoleBinding"]  # creation order: the Secret first
    assert all(c.manifest["metadata"]["ownerReferences"] == owner for c in d.children)
    assert {c.name for c in d.children if c.kind in ("Secret", "NetworkPolicy")} == \
        {names.ray_token_secret_name("j"), names.network_policy_name("j")}


def test_every_manifest_is_a_valid_kubernetes_object() -> None:
    d = build(rollout={"replicas": 1, "gpusPerReplica": 1},
              actor={"template": {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf",
                                                                                              "key": "t"}}}],
                                  "imagePullSecrets": [{"name": "regcred"}],
                                  "volumes": [{"name": "data", "emptyDir": {}}],
                                  "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}]}})
    for doc in [s.manifest for s in d.pods.values()] + [c.manifest for c in d.children]:
        kubernetes_validate.validate(doc, "1.33", strict=True)  # raises with the field path


def test_gpus_and_engine_args_on_rollout_pods() -> None:
    d = build(rollout={"replicas": 1, "gpusPerReplica": 1, "engineArgs": {"fp32Head": True},
                       "template": {"image": "custom:2"}})
    c = container(d, "j-rollout-0")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1" and c["image"] == "custom:2"
    env = env_of(c)
    assert env["ASYNCRL_ENGINE_ARGS"] == "--fp32Head True" and env["ASYNCRL_ROLLOUT_ENGINE"] == "transformers"
    assert "--num-gpus=1" in c["command"]
    assert container(d, "j-driver-0")["image"] == "img:1"  # the operator's default job image


def test_ray_start_gets_what_the_pod_holds_and_shm_is_sized() -> None:
    d = build(rollout={"replicas": 1, "gpusPerReplica": 0, "resources": {"cpu": "500m", "memory": "3Gi"}},
              actor={"gpusPerReplica": 1, "resources": {"cpu": "6", "memory": "12Gi"}})
    ro = container(d, "j-rollout-0")["command"]
    # 500m rounds up to one whole CPU; 3 GiB = 3 * 2^30 = 3221225472 bytes
    assert ro[:4] == ["ray", "start", "--block", f"--address=j-driver-0.j.ns.svc:{C.PORT_GCS}"]
    assert {"--num-cpus=1", "--memory=3221225472", "--num-gpus=0"} <= set(ro)
    assert json.loads(next(a for a in ro if a.startswith("--resources="))[len("--resources="):]) == \
        {C.RESOURCE_ROLLOUT: 1}
    assert {"--num-cpus=6", f"--memory={12 * 2**30}", "--num-gpus=1"} <= set(container(d, "j-actor-0")["command"])
    # /dev/shm: memory-backed, half the pod's memory limit (3 GiB -> 1536 MiB; the driver's 8 GiB -> 4096 MiB)
    for pod, limit in (("j-rollout-0", "1536Mi"), ("j-actor-0", "6144Mi"), ("j-driver-0", "4096Mi")):
        spec = d.pods[pod].manifest["spec"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": limit}} in spec["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]


def test_the_driver_pod_takes_spec_driver_resources_and_the_default_keeps_the_spec_hash() -> None:
    """Found on the real one-node cluster (tests/cluster/): the driver's fixed 2 CPUs (+ 50m for its status
    sidecar) exceed a 2-CPU node's allocatable 2000m, so the pod stayed Pending; spec.driver.resources sizes it."""
    d = build(driver={"resources": {"cpu": "500m", "memory": "3Gi"}})
    res = container(d, "j-driver-0")["resources"]
    assert res == {"requests": {"cpu": "500m", "memory": "3Gi"}, "limits": {"memory": "3Gi"}}
    default = build()
    assert container(default, "j-driver-0")["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}
    # an upgraded operator restarts no running job: the default section is left out of the hash
    doc = spec_of().to_spec_dict()  # what an operator before spec.driver hashed (spec_hash's docstring)
    for key in ("driver", "runPolicy"):
        doc.pop(key)
    doc["monitoring"].pop("maskGuard")
    doc["task"].pop("agent")
    doc["task"].pop("endpoint")
    before = hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    assert spec_hash(spec_of()) == before
    assert spec_hash(spec_of(driver={"resources": {"cpu": "1"}})) != spec_hash(spec_of())


# -------------------------------------------------------------------- hardening

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                   "projected", "secret"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """The Pod Security Standards' ``restricted`` level (kubernetes.io/docs/concepts/security/
    pod-security-standards), checked field by field; the real server's admission checks it again in
    the API-server suite."""
    spec, out = pod["spec"], []
    psc = spec.get("securityContext", {})
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(key)
    if psc.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        out.append("pod seccompProfile")
    for v in spec.get("volumes", []):
        if not set(v) - {"name"} <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}")
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        sc = c.get("securityContext", {})
        caps = sc.get("capabilities", {})
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c['name']}: allowPrivilegeEscalation")
        if sc.get("privileged"):
            out.append(f"{c['name']}: privileged")
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{c['name']}: capabilities")
        if not sc.get("runAsNonRoot", psc.get("runAsNonRoot")) or sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{c['name']}: runAsNonRoot")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{c['name']}: hostPort")
    return out


def test_every_pod_passes_the_restricted_level_by_default() -> None:
    d = desired(REF, beyond_validation(spec_of(checkpoint={"volumeClaimName": "ckpt"}), "old_logits",
                                       strategy=OldLogitStrategy.DEDICATED), CFG, 0)
    assert "j-oldlogit-0" in d.pods
    for name, slot in d.pods.items():
        assert restricted_violations(slot.manifest) == [], name
        psc = slot.manifest["spec"]["securityContext"]
        # the job image's user (docker/job.Dockerfile); fsGroup makes a fresh checkpoint volume writable
        assert (psc["runAsUser"], psc["runAsGroup"], psc["fsGroup"]) == (10001, 10001, 10001)
    assert restricted_violations({"spec": {"containers": [{"name": "x"}]}}) != []  # the checker can fail


def test_role_security_overrides_merge_over_the_defaults() -> None:
    d = build(actor={"template": {"podSecurityContext": {"runAsUser": 2000, "supplementalGroups": [5]},
                                  "securityContext": {"readOnlyRootFilesystem": True,
                                                      "capabilities": {"add": ["NET_BIND_SERVICE"]}}}})
    for pod in ("j-actor-0", "j-driver-0"):  # the driver runs the actor's image: same user settings
        spec = d.pods[pod].manifest["spec"]
        assert spec["securityContext"]["runAsUser"] == 2000 and spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["supplementalGroups"] == [5]
        sc = spec["containers"][0]["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}  # nested: merged
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert restricted_violations(d.pods[pod].manifest) == []
    assert d.pods["j-rollout-0"].manifest["spec"]["securityContext"]["runAsUser"] == 10001
    assert merge({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"b": 3}, "d": [2]}) == {"a": {"b": 3, "c": 2}, "d": [2]}


# -------------------------------------------------------------------- start-up order and Ray auth

def test_workers_wait_for_the_gcs_and_are_ready_once_joined() -> None:
    d = build(rollout={"replicas": 1})
    parser = build_parser()
    for pod, resource in (("j-rollout-0", C.RESOURCE_ROLLOUT), ("j-actor-0", C.RESOURCE_ACTOR)):
        spec = d.pods[pod].manifest["spec"]
        (init,) = spec["initContainers"]
        main = spec["containers"][0]
        assert init["image"] == main["image"] and init["securityContext"] == main["securityContext"]
        address = env_of(main)["RAY_ADDRESS"]
        # the commands the pods run are commands the asyncrl CLI takes
        assert init["command"][0] == "asyncrl"
        args = parser.parse_args(init["command"][1:])
        assert (args.check, args.address, args.wait) == ("gcs", address, 900.0)
        probe = main["readinessProbe"]["exec"]["command"]
        args = parser.parse_args(probe[1:])
        assert (args.check, args.address, args.resource) == ("joined", address, resource)
        ray_resources = json.loads(next(a for a in main["command"] if a.startswith("--resources="))[12:])
        assert resource in ray_resources  # the probe looks for what ray start advertises
        assert "livenessProbe" not in main  # `ray start --block` exits when its raylet dies
    drv = d.pods["j-driver-0"].manifest["spec"]
    assert [c["name"] for c in drv["initContainers"]] == ["status"]  # the status sidecar, waiting for nothing
    c = drv["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": C.GCS_HEALTH_PATH, "port": C.PORT_DASHBOARD}
    live = c["livenessProbe"]
    assert live["httpGet"] == c["readinessProbe"]["httpGet"]
    # generous: a minute to start, then 15 failures 20 s apart (5 minutes) before the pod is failed
    assert (live["initialDelaySeconds"], live["periodSeconds"], live["failureThreshold"]) == (60, 20, 15)


def test_every_container_uses_the_jobs_ray_token() -> None:
    d = build()
    secret = child(d, "Secret")
    assert secret["stringData"] == {"token": TOKEN} and secret["type"] == "Opaque"
    ref = {"secretKeyRef": {"name": names.ray_token_secret_name("j"), "key": "token"}}
    for name, slot in d.pods.items():
        spec = slot.manifest["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            env = env_of(c)
            if c["name"] == "status":  # the status sidecar is no part of Ray: no Ray token (test_builders_user_code)
                assert "RAY_AUTH_TOKEN" not in env
                continue
            assert env["RAY_AUTH_MODE"] == "token" and env["RAY_AUTH_TOKEN"] == ref, (name, c["name"])
    # without a token from the caller no Secret is built (the pods still read it by name)
    assert "Secret" not in {c.kind for c in desired(REF, spec_of(), CFG, 0).children}


# -------------------------------------------------------------------- network, gang, kueue

def test_network_policy_admits_the_job_and_prometheus_on_the_metrics_port() -> None:
    pol = child(build(monitoring={"port": 9500}), "NetworkPolicy")["spec"]
    job_pods = {"matchLabels": {names.LABEL_JOB: "j"}}
    assert pol["podSelector"] == job_pods and pol["policyTypes"] == ["Ingress"]
    assert pol["ingress"] == [
        {"from": [{"podSelector": job_pods}]},  # the job's own pods, every port (Ray)
        # by default Prometheus pods of the job's own namespace only: no namespaceSelector at all
        {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
         "ports": [{"protocol": "TCP", "port": 9500}]},
    ]
    anywhere = OperatorSettings(prometheus_namespace_selector={})  # the admin's explicit "any namespace"
    assert child(build(settings=anywhere), "NetworkPolicy")["spec"]["ingress"][1]["from"][0]["namespaceSelector"] \
        == {"matchLabels": {}}
    cfg = OperatorSettings(prometheus_namespace_selector={"kubernetes.io/metadata.name": "monitoring"},
                           prometheus_pod_selector={"prometheus": "kps"})
    prom = child(build(settings=cfg), "NetworkPolicy")["spec"]["ingress"][1]["from"][0]
    assert prom == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    "podSelector": {"matchLabels": {"prometheus": "kps"}}}
    quiet = child(build(monitoring={"enabled": False}), "NetworkPolicy")["spec"]
    assert quiet["ingress"] == [{"from": [{"podSelector": job_pods}]}]  # no metrics: the job's pods only


def test_volcano_pod_group_holds_every_pod() -> None:
    ref = JobRef("j", "ns", "uid-1", {"volcano.sh/queue-name": "research"})
    d = build(ref, rollout={"replicas": 2, "gpusPerReplica": 0, "resources": {"cpu": "500m", "memory": "2Gi"}},
              actor={"gpusPerReplica": 1, "resources": {"cpu": "3", "memory": "4Gi"}},
              scheduling={"gangScheduler": "volcano", "priorityClassName": "high"})
    pg = child(d, "PodGroup")
    assert pg["apiVersion"] == "scheduling.volcano.sh/v1beta1" and pg["metadata"]["name"] == names.pod_group_name("j")
    # driver 2 CPU + 2 x 500m + 3 = 6000m; 8 Gi + 2 x 2 Gi + 4 Gi = 16 Gi = 16384 Mi; the actor's one GPU
    assert pg["spec"] == {"minMember": 4, "minResources": {"cpu": "6000m", "memory": "16384Mi", "nvidia.com/gpu": "1"},
                          "queue": "research", "priorityClassName": "high"}
    assert len(d.pods) == 4
    for slot in d.pods.values():
        m = slot.manifest
        assert m["spec"]["schedulerName"] == "volcano"
        assert m["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == pg["metadata"]["name"]
    assert d.children[-1].kind == "PodGroup"


def test_coscheduling_pod_group_and_scheduler_names() -> None:
    d = build(scheduling={"gangScheduler": "coscheduling"})
    pg = child(d, "PodGroup")
    assert pg["apiVersion"] == "scheduling.x-k8s.io/v1alpha1" and pg["spec"]["minMember"] == len(d.pods)
    for slot in d.pods.values():
        assert slot.manifest["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == pg["metadata"]["name"]
        assert slot.manifest["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    custom = build(scheduling={"gangScheduler": "coscheduling", "schedulerName": "gang"})
    assert {s.manifest["spec"]["schedulerName"] for s in custom.pods.values()} == {"gang"}
    plain = build()
    assert "PodGroup" not in {c.kind for c in plain.children}
    assert all("schedulerName" not in s.manifest["spec"] for s in plain.pods.values())


def test_kueue_queue_label_reaches_every_pod() -> None:
    d = build(JobRef("j", "ns", "uid-1", {"kueue.x-k8s.io/queue-name": "team-a"}))
    assert {s.manifest["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] for s in d.pods.values()} == {"team-a"}


# -------------------------------------------------------------------- overrides

def test_pod_overrides_are_applied() -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}}
    d = build(actor={"template": {
        "imagePullSecrets": [{"name": "regcred"}], "affinity": affinity,
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "env": [{"name": "HF_HOME", "value": "/data/hf"},
                {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True, "subPath": "hf"}],
    }})
    spec = d.pods["j-actor-0"].manifest["spec"]
    c = spec["containers"][0]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}] and spec["affinity"] == affinity
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    names_in_order = [e["name"] for e in c["env"]]
    assert names_in_order[-2:] == ["HF_HOME", "HF_TOKEN"]  # ours first, the user's appended
    assert len(set(names_in_order)) == len(names_in_order)
    assert c["env"][-1] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}} in spec["volumes"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True, "subPath": "hf"} in c["volumeMounts"]
    assert "data" not in {m["name"] for m in spec["initContainers"][0].get("volumeMounts", [])}
    drv = d.pods["j-driver-0"].manifest["spec"]  # pulls the actor's image: its pull secret, nothing else
    assert drv["imagePullSecrets"] == [{"name": "regcred"}]
    assert "affinity" not in drv and "tolerations" not in drv and "HF_HOME" not in env_of(drv["containers"][0])
    assert "imagePullSecrets" not in d.pods["j-rollout-0"].manifest["spec"]


# -------------------------------------------------------------------- spec hash

def test_spec_hash_covers_what_shapes_the_pods() -> None:
    base = spec_of(rollout={"replicas": 2})
    h = spec_hash(base)
    assert len(h) == 16 and int(h, 16) >= 0 and spec_hash(spec_of(rollout={"replicas": 2})) == h
    assert spec_hash(spec_of(rollout={"replicas": 3})) != h
    assert spec_hash(spec_of(rollout={"replicas": 2}, train={"steps": 7})) != h
    # what the operator does, not what the pods are: no restart for these
    assert spec_hash(spec_of(rollout={"replicas": 2}, runPolicy={"backoffLimit": 9, "suspend": True})) == h
    assert spec_hash(spec_of(rollout={"replicas": 2}, monitoring={"maskGuard": {"action": "Fail"}})) == h
    assert spec_hash(spec_of(rollout={"replicas": 2}, monitoring={"port": 9500})) != h
    d = desired(REF, base, CFG, 0)
    assert d.spec_hash == h
    assert {s.manifest["metadata"]["annotations"][names.ANNOTATION_SPEC_HASH] for s in d.pods.values()} == {h}


# -------------------------------------------------------------------- unchanged behaviour

def test_interrupt_sync_rollout_pods_host_the_training_side_model() -> None:
    spec = beyond_validation(spec_of(rollout={"replicas": 1, "resources": {"memory": "32Gi"}}),
                             "old_logits", strategy=OldLogitStrategy.INTERRUPT_SYNC)
    d = desired(REF, spec, CFG, 0)
    c = container(d, "j-rollout-0")
    assert c["resources"]["requests"]["memory"] == "49152Mi"  # 32 Gi + the default 16 Gi = 48 * 1024 Mi
    assert env_of(c)["ASYNCRL_HOSTED_ROLES"] == "rollout,oldlogits"
    assert json.loads(next(a for a in c["command"] if a.startswith("--resources="))[12:]) == \
        {C.RESOURCE_ROLLOUT: 1, C.RESOURCE_OLD_LOGITS: 1}
    assert not [n for n in d.pods if "oldlogit" in n]


def test_dedicated_old_logit_pods_and_megatron_env() -> None:
    spec = spec_of()
    spec = beyond_validation(spec, "old_logits", strategy=OldLogitStrategy.DEDICATED,
                             dedicated=spec.old_logits.dedicated.model_copy(update={"replicas": 2}))
    spec = beyond_validation(spec, "actor", replicas=2, gpus_per_replica=4,
                             megatron=spec.actor.megatron.model_copy(update={"tensor_parallel": 2,
                                                                             "pipeline_parallel": 2}))
    d = desired(REF, spec, CFG, 0)
    assert {"j-oldlogit-0", "j-oldlogit-1", "j-actor-1"} <= set(d.pods)
    env = env_of(container(d, "j-actor-1"))
    # world 2 pods x 4 GPUs = 8; TP 2 x PP 2 = 4 -> DP 2
    assert (env["ASYNCRL_WORLD_SIZE"], env["ASYNCRL_DATA_PARALLEL"]) == ("8", "2")


def test_only_the_driver_gets_the_status_token() -> None:
    d = build()
    drv = d.pods["j-driver-0"].manifest["spec"]
    # the token is the status sidecar's own projected volume (tests/operator/test_builders_user_code.py)
    assert drv["serviceAccountName"] == "j-status" and drv["automountServiceAccountToken"] is False
    assert d.pods["j-actor-0"].manifest["spec"]["automountServiceAccountToken"] is False
    role = child(d, "Role")
    assert role["rules"] == [{"apiGroups": ["asyncrl.io"], "resources": ["asyncrljobs/status"],
                              "resourceNames": ["j"], "verbs": ["get", "patch"]}]


def test_checkpoint_volume_and_scheduling() -> None:
    d = build(checkpoint={"volumeClaimName": "ckpt"},
              scheduling={"nodeSelector": {"pool": "gpu"}, "priorityClassName": "high",
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]})
    drv = d.pods["j-driver-0"].manifest["spec"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in drv["volumes"]
    assert drv["nodeSelector"] == {"pool": "gpu"} and drv["priorityClassName"] == "high"
    assert drv["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    ro = d.pods["j-rollout-0"].manifest["spec"]
    assert not [v for v in ro["volumes"] if v["name"] == "checkpoints"]
    # The driver resumes from the shared volume; the rollout pods never write checkpoints.
    assert env_of(container(d, "j-driver-0"))["ASYNCRL_CHECKPOINT_DIR"] == "/checkpoints"
    assert env_of(container(d, "j-actor-0"))["ASYNCRL_CHECKPOINT_DIR"] == "/checkpoints"
    assert "ASYNCRL_CHECKPOINT_DIR" not in env_of(container(d, "j-rollout-0"))
    # Without a volume there is nothing shared to resume from: the variable stays unset.
    assert "ASYNCRL_CHECKPOINT_DIR" not in env_of(container(build(), "j-driver-0"))


@pytest.mark.parametrize(("q", "nbytes"), [("1Gi", 2**30), ("500M", 500 * 10**6), ("1536Mi", 1536 * 2**20)])
def test_quantities(q: str, nbytes: int) -> None:
    assert quantity_bytes(q) == nbytes
    assert add_memory("1Gi", "512Mi") == "1536Mi"
    assert [cpu_millis(c) for c in ("4", "500m", "1.5")] == [4000, 500, 1500]
    assert [ray_num_cpus(c) for c in ("4", "500m", "1.5", "100m")] == [4, 1, 2, 1]  # whole CPUs, rounded up
    assert shm_size_limit("3Gi") == "1536Mi" and shm_size_limit("1001Mi") == "501Mi"  # 500.5 Mi rounds up


def test_containers_report_their_last_log_lines_on_error() -> None:
    d = build()
    for slot in d.pods.values():
        assert slot.manifest["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_ownership_labels_of_the_job_are_not_copied_onto_children() -> None:
    # metadata.labels of the AsyncRLJob travel to every child, except the keys the operator owns and
    # selects on: another job's name there would draw these pods into that job (Service, NetworkPolicy,
    # the other job's PodGroup).
    ref = JobRef("j", "ns", "uid-1", {"team": "rl", "asyncrl.io/job": "victim", "ray.io/cluster": "victim",
                                      "app.kubernetes.io/instance": "victim",
                                      "scheduling.x-k8s.io/pod-group": "victims-group"})
    d = build(ref, scheduling={"gangScheduler": "coscheduling"})
    for slot in d.pods.values():
        labels = slot.manifest["metadata"]["labels"]
        assert labels["team"] == "rl" and labels["asyncrl.io/job"] == "j" and labels["ray.io/cluster"] == "j"
        assert labels["app.kubernetes.io/instance"] == "j" and labels["scheduling.x-k8s.io/pod-group"] == "j"
    for c in d.children:
        assert c.manifest["metadata"]["labels"]["asyncrl.io/job"] == "j", c.kind
        assert "scheduling.x-k8s.io/pod-group" not in c.manifest["metadata"]["labels"], c.kind


def test_every_pod_gets_the_jobs_termination_grace_period() -> None:
    # SIGTERM -> the driver finishes its step and writes a final checkpoint within this many seconds
    assert {p.manifest["spec"]["terminationGracePeriodSeconds"] for p in build().pods.values()} == {300}
    d = build(runPolicy={"terminationGracePeriodSeconds": 900})
    assert {p.manifest["spec"]["terminationGracePeriodSeconds"] for p in d.pods.values()} == {900}


def test_actor_pod_defers_sigterm_until_its_ray_exits(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from asyncrl.operator.builders import ACTOR_SIGTERM_SHELL
    from tests.support.helpers import wait_for

    d = build(actor={"gpusPerReplica": 0})
    actor = container(d, "j-actor-0")["command"]
    assert actor[:len(ACTOR_SIGTERM_SHELL)] == ACTOR_SIGTERM_SHELL
    assert actor[len(ACTOR_SIGTERM_SHELL):][:3] == ["ray", "start", "--block"]
    assert container(d, "j-rollout-0")["command"][:3] == ["ray", "start", "--block"]  # rollout pods end at once
    # The real shell: SIGTERM to PID 1 (the shell) leaves the child running; the pod ends with the child's code.
    # No timing: the signal goes once the shell holds its TERM trap (its SigCgt mask says so), and the child ends
    # only when the test opens its FIFO, after the shell has said that it keeps running.
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    child = f"open({str(gate)!r}).read(); print('child finished', flush=True); raise SystemExit(3)"
    proc = subprocess.Popen([*ACTOR_SIGTERM_SHELL, sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)

    def traps_term() -> bool:
        caught = next(line for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
                      if line.startswith("SigCgt:"))
        return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)

    wait_for(traps_term, timeout=30, message="the actor shell's TERM trap")
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout is not None and proc.stdout.readline().startswith("SIGTERM: the actor keeps running")
    with open(gate, "w"):
        pass  # the child (ray start) may end now
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, out
    assert "child finished" in out
