"""Pure builders: names, labels, owner references, resources and roles of every child."""

from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator import names
from asyncrl.operator.builders import JobRef, add_memory, desired, quantity_bytes
from asyncrl.operator.config import OperatorSettings

REF = JobRef("j", "ns", "uid-1", {"team": "rl", "app.kubernetes.io/name": "spoofed"})
CFG = OperatorSettings(job_image="img:1")


def build(**sections: Any) -> Any:
    return desired(REF, AsyncRLJobSpec.model_validate(sections), CFG, epoch=3)


def container(d: Any, name: str) -> dict[str, Any]:
    return d.pods[name].manifest["spec"]["containers"][0]


def test_names_labels_and_owner() -> None:
    d = build(rollout={"replicas": 3}, actor={"replicas": 2})
    assert sorted(d.pods) == ["j-actor-0", "j-actor-1", "j-driver-0", "j-rollout-0", "j-rollout-1", "j-rollout-2"]
    meta = d.pods["j-rollout-2"].manifest["metadata"]
    assert meta["labels"][names.LABEL_JOB] == "j" and meta["labels"][names.LABEL_ROLE] == "rollout"
    assert meta["labels"]["app.kubernetes.io/name"] == "asyncrl"  # ours win over the job's own labels
    assert meta["labels"]["team"] == "rl" and meta["labels"][names.LABEL_INDEX] == "2"
    assert meta["annotations"][names.ANNOTATION_EPOCH] == "3"
    assert meta["ownerReferences"] == [{"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "name": "j",
                                        "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    assert {c.kind for c in d.children} == {"ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding"}


def test_gpu_and_engine_args_on_rollout_pods() -> None:
    d = build(rollout={"replicas": 1, "gpusPerReplica": 2, "engine": "vllm",
                       "engineArgs": {"tensor-parallel-size": 2}, "template": {"image": "custom:2"}})
    c = container(d, "j-rollout-0")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2" and c["image"] == "custom:2"
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ASYNCRL_ENGINE_ARGS"] == "--tensor-parallel-size 2" and env["ASYNCRL_ROLLOUT_ENGINE"] == "vllm"
    assert "--num-gpus=2" in c["command"]
    assert container(d, "j-driver-0")["image"] == "img:1"  # the operator's default job image


def test_interrupt_sync_rollout_pods_host_the_training_side_model() -> None:
    d = build(correction={"reference": "exact"}, oldLogits={"strategy": "interruptSync"},
              rollout={"replicas": 1, "resources": {"memory": "32Gi"}, "trainingSideMemory": "16Gi"})
    c = container(d, "j-rollout-0")
    assert c["resources"]["requests"]["memory"] == "49152Mi"  # 32 Gi + 16 Gi = 48 * 1024 Mi
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ASYNCRL_HOSTED_ROLES"] == "rollout,oldlogits"
    assert not [n for n in d.pods if "oldlogit" in n]


def test_dedicated_old_logit_pods_and_megatron_env() -> None:
    d = build(correction={"reference": "exact"}, oldLogits={"strategy": "dedicated", "dedicated": {"replicas": 2}},
              actor={"replicas": 2, "gpusPerReplica": 4, "megatron": {"tensorParallel": 2, "pipelineParallel": 2}})
    assert {"j-oldlogit-0", "j-oldlogit-1"} <= set(d.pods)
    env = {e["name"]: e["value"] for e in container(d, "j-actor-1")["env"]}
    # world 2 pods x 4 GPUs = 8; TP 2 x PP 2 = 4 -> DP 2
    assert (env["ASYNCRL_WORLD_SIZE"], env["ASYNCRL_DATA_PARALLEL"]) == ("8", "2")


def test_only_the_driver_gets_the_status_token() -> None:
    d = build()
    drv = d.pods["j-driver-0"].manifest["spec"]
    assert drv["serviceAccountName"] == "j-status" and drv["automountServiceAccountToken"] is True
    assert d.pods["j-actor-0"].manifest["spec"]["automountServiceAccountToken"] is False
    (role,) = [c for c in d.children if c.kind == "Role"]
    assert role.manifest["rules"] == [{"apiGroups": ["asyncrl.io"], "resources": ["asyncrljobs/status"],
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

    def env(built: Any, pod: str) -> dict[str, str]:
        return {e["name"]: e["value"] for e in container(built, pod)["env"]}

    # The driver resumes from the shared volume; the rollout pods never write checkpoints.
    assert env(d, "j-driver-0")["ASYNCRL_CHECKPOINT_DIR"] == "/checkpoints"
    assert env(d, "j-actor-0")["ASYNCRL_CHECKPOINT_DIR"] == "/checkpoints"
    assert "ASYNCRL_CHECKPOINT_DIR" not in env(d, "j-rollout-0")
    # Without a volume there is nothing shared to resume from: the variable stays unset.
    assert "ASYNCRL_CHECKPOINT_DIR" not in env(build(), "j-driver-0")
    # Ray's per-node auth tokens would make the job's own pods refuse each other.
    assert all(env(d, pod)["RAY_AUTH_MODE"] == "disabled" for pod in d.pods)


def test_quantities() -> None:
    assert quantity_bytes("1Gi") == 2**30 and quantity_bytes("500M") == 500 * 10**6
    assert add_memory("1Gi", "512Mi") == "1536Mi"
