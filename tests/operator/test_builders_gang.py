"""Pure builders for a multi-rank actor: 2-4 actor pods x g GPUs, each pod one Ray node with one
``actor`` and one ``actor-<i>`` unit per rank, a stable DNS name through the headless Service, the
checkpoint volume on every actor pod, a PodGroup that counts every rank pod, and RDMA through the
pod overrides (device-plugin resources; IPC_LOCK only with the admin's privileged opt-in)."""

import json
from typing import Any

import kubernetes_validate
import pytest
from pydantic import ValidationError

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.validation import problems_from
from asyncrl.operator import names
from asyncrl.operator.admission import admission_problems
from asyncrl.operator.builders import Desired, JobRef, desired
from asyncrl.operator.config import OperatorSettings

REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(job_image="img:1")


def build(**sections: Any) -> Desired:
    return desired(REF, AsyncRLJobSpec.model_validate(sections), CFG, epoch=1, ray_token="t")


def container(d: Desired, name: str) -> dict[str, Any]:
    return d.pods[name].manifest["spec"]["containers"][0]


def ray_resources(d: Desired, name: str) -> dict[str, int]:
    arg = next(a for a in container(d, name)["command"] if a.startswith("--resources="))
    return dict(json.loads(arg[len("--resources="):]))


def env_of(d: Desired, name: str) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(d, name)["env"]}


def child(d: Desired, kind: str) -> dict[str, Any]:
    (c,) = [c for c in d.children if c.kind == kind]
    return c.manifest


# (actor pods, GPUs per pod, tensorParallel): layouts the validation accepts (the default model: 4 heads, 2 KV heads)
LAYOUTS = [(2, 8, 2), (2, 8, 1), (3, 4, 2), (4, 2, 1), (2, 0, 1), (4, 0, 2)]


@pytest.mark.parametrize(("pods", "gpus", "tp"), LAYOUTS)
def test_every_rank_has_a_unit_on_its_own_pod(pods: int, gpus: int, tp: int) -> None:
    d = build(actor={"replicas": pods, "gpusPerReplica": gpus, "megatron": {"tensorParallel": tp},
                     "resources": {"cpu": "8", "memory": "64Gi"}},
              rollout={"replicas": 1, "gpusPerReplica": 0})
    g = max(gpus, 1)
    actor_pods = [names.pod_name("j", names.Role.ACTOR, i) for i in range(pods)]
    assert sorted(n for n in d.pods if "-actor-" in n) == actor_pods
    for i, name in enumerate(actor_pods):
        # one unit of `actor` and of `actor-<i>` per rank process, nothing of another pod's
        assert ray_resources(d, name) == {C.RESOURCE_ACTOR: g, C.actor_pod_resource(i): g}
        c = container(d, name)
        assert f"--num-gpus={gpus}" in c["command"]
        assert c["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
        env = env_of(d, name)
        assert env[C.ENV_WORLD_SIZE] == str(pods * g) and env[C.ENV_TENSOR_PARALLEL] == str(tp)
        assert env[C.ENV_DATA_PARALLEL] == str(pods * g // tp) and env[C.ENV_REPLICA_INDEX] == str(i)
        # GPU pods: every rank sees all the pod's GPUs (Ray would narrow CUDA_VISIBLE_DEVICES per worker)
        assert env.get(C.ENV_RAY_NOSET_CUDA_VISIBLE_DEVICES) == ("1" if gpus else None)
    # rank r = i*g + j asks for {"actor-<i>": 1}: exactly pod i holds it, with room for all g ranks
    for r in range(pods * g):
        holders = [i for i, n in enumerate(actor_pods) if C.actor_pod_resource(r // g) in ray_resources(d, n)]
        assert holders == [r // g]
    assert sum(ray_resources(d, n)[C.RESOURCE_ACTOR] for n in actor_pods) == pods * g  # = the world size
    # no other pod advertises actor units
    others = [n for n in d.pods if n not in actor_pods]
    assert not [n for n in others if C.RESOURCE_ACTOR in ray_resources_or_empty(d, n)]


def ray_resources_or_empty(d: Desired, name: str) -> dict[str, int]:
    return ray_resources(d, name) if any(a.startswith("--resources=") for a in container(d, name)["command"]) else {}


def test_actor_pods_have_stable_dns_names_through_the_headless_service() -> None:
    d = build(actor={"replicas": 3, "gpusPerReplica": 4, "megatron": {"tensorParallel": 2}})
    svc = child(d, "Service")
    assert svc["metadata"]["name"] == names.service_name("j") == "j"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    for i in range(3):
        m = d.pods[f"j-actor-{i}"].manifest
        # hostname + subdomain = the Service's name: j-actor-<i>.j.ns.svc resolves to this pod
        assert (m["spec"]["hostname"], m["spec"]["subdomain"]) == (f"j-actor-{i}", "j")
        assert svc["spec"]["selector"].items() <= m["metadata"]["labels"].items()
    for doc in [s.manifest for s in d.pods.values()] + [c.manifest for c in d.children]:
        kubernetes_validate.validate(doc, "1.33", strict=True)


@pytest.mark.parametrize("gang", ["volcano", "coscheduling"])
@pytest.mark.parametrize(("pods", "gpus"), [(2, 8), (4, 2)])
def test_pod_group_counts_every_rank_pod_and_their_gpus(gang: str, pods: int, gpus: int) -> None:
    d = build(actor={"replicas": pods, "gpusPerReplica": gpus, "resources": {"cpu": "4", "memory": "16Gi"}},
              rollout={"replicas": 2, "gpusPerReplica": 1, "resources": {"cpu": "1", "memory": "4Gi"}},
              scheduling={"gangScheduler": gang})
    pg = child(d, "PodGroup")
    assert pg["spec"]["minMember"] == 1 + 2 + pods == len(d.pods)  # driver + rollout + every actor pod
    assert pg["spec"]["minResources"]["nvidia.com/gpu"] == str(2 + pods * gpus)
    assert pg["spec"]["minResources"]["cpu"] == f"{2000 + 2 * 1000 + pods * 4000}m"


def test_checkpoint_volume_is_mounted_on_every_actor_pod() -> None:
    d = build(actor={"replicas": 2, "gpusPerReplica": 8}, checkpoint={"volumeClaimName": "shared"})
    for name in ("j-driver-0", "j-actor-0", "j-actor-1"):
        spec = d.pods[name].manifest["spec"]
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "shared"}} in spec["volumes"]
        assert {"name": "checkpoints", "mountPath": C.CHECKPOINT_MOUNT} in spec["containers"][0]["volumeMounts"]
        assert env_of(d, name)[C.ENV_CHECKPOINT_DIR] == C.CHECKPOINT_MOUNT
    assert not [v for v in d.pods["j-rollout-0"].manifest["spec"]["volumes"] if v["name"] == "checkpoints"]


RDMA_ACTOR = {"replicas": 2, "gpusPerReplica": 8, "megatron": {"tensorParallel": 2},
              "resources": {"cpu": "32", "memory": "256Gi", "extra": {"rdma/hca": 1}}}


def test_rdma_device_resources_reach_requests_limits_and_the_pod_group() -> None:
    d = build(actor=RDMA_ACTOR, scheduling={"gangScheduler": "volcano"})
    for i in range(2):
        res = container(d, f"j-actor-{i}")["resources"]
        assert res["requests"]["rdma/hca"] == res["limits"]["rdma/hca"] == "1"  # extended: request = limit
        assert res["limits"]["nvidia.com/gpu"] == "8"
    assert "rdma/hca" not in container(d, "j-rollout-0")["resources"]["limits"]
    assert child(d, "PodGroup")["spec"]["minResources"]["rdma/hca"] == "2"
    for slot in d.pods.values():
        kubernetes_validate.validate(slot.manifest, "1.33", strict=True)


def test_bad_device_resources_are_refused_with_the_path_and_the_rule() -> None:
    doc = {"actor": {"resources": {"extra": {"nvidia.com/gpu": 8, "hca": 1, "rdma/hca": 0}}}}
    with pytest.raises(ValidationError) as err:
        AsyncRLJobSpec.model_validate(doc)
    (problem,) = problems_from(err.value, doc)
    assert problem.path.endswith("actor.resources.extra")
    for said in ("<domain>/<name>", "gpusPerReplica", "hca: 1", "nvidia.com/gpu: 8", "rdma/hca: 0"):
        assert said in problem.message


IPC_LOCK = {"securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}


def test_ipc_lock_needs_the_admins_privileged_opt_in() -> None:
    # restricted allows adding only NET_BIND_SERVICE: IPC_LOCK (RDMA memory registration) is refused ...
    doc = {"actor": {**RDMA_ACTOR, "template": IPC_LOCK}}
    with pytest.raises(ValidationError) as err:
        AsyncRLJobSpec.model_validate(doc)
    found = problems_from(err.value, doc)
    assert any(p.path.endswith("actor.template.securityContext.capabilities.add") and "NET_BIND_SERVICE" in p.message
               for p in found), found
    # ... unless the template asks for privileged, which the operator honours only in the admin's namespaces
    spec = AsyncRLJobSpec.model_validate({"actor": {**RDMA_ACTOR, "template": {**IPC_LOCK,
                                                                               "podSecurityLevel": "privileged"}}})
    d = desired(REF, spec, CFG, epoch=1)
    admin = OperatorSettings(job_image="img:1", privileged_namespaces=("ns",))
    assert admission_problems(spec, "ns", admin, d.pods) == []
    refused = admission_problems(spec, "ns", CFG, d.pods)
    assert refused and refused[0].path == "spec.actor.template.podSecurityLevel"
    for i in range(2):
        caps = container(d, f"j-actor-{i}")["securityContext"]["capabilities"]
        assert caps == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
