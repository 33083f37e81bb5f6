"""Pure builders: an AsyncRLJob's spec -> the manifests of its children.

No API calls and no clock here; ``tests/operator/test_builders.py`` checks them without a server.
The job's pods form one Ray cluster: the driver pod runs the Ray head and the job driver, rollout,
actor and old-logit pods join it as workers with a custom Ray resource named after their role.

Job-image contract (``docker/job.Dockerfile``): the image has ``asyncrl`` and ``ray`` on PATH;
the driver runs ``asyncrl driver --spec /etc/asyncrl/job.yaml`` (the validated spec from the
ConfigMap, defaults filled in) and reports ``status.training`` as ``asyncrl.api.status`` documents.
"""

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from asyncrl.api import constants as C
from asyncrl.api.constants import API_VERSION, KIND
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits import OldLogitStrategy
from asyncrl.api.pods import PodOverrides, Resources, Toleration
from asyncrl.operator import names
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.names import Role

SPEC_DIR, SPEC_FILE, CHECKPOINT_MOUNT = C.SPEC_DIR, C.SPEC_FILE, C.CHECKPOINT_MOUNT
PORT_GCS, PORT_DASHBOARD, PORT_CLIENT = C.PORT_GCS, C.PORT_DASHBOARD, C.PORT_CLIENT
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class JobRef:
    """The identity of the owning AsyncRLJob (what owner references and labels need)."""

    name: str
    namespace: str
    uid: str
    labels: dict[str, str] = field(default_factory=dict)

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class PodSlot:
    """One desired pod: its role, index and manifest."""

    role: Role
    index: int
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Child:
    """One desired non-pod child (kind as the API names it, e.g. ``ConfigMap``)."""

    kind: str
    name: str
    manifest: dict[str, Any]


@dataclass(frozen=True)
class Desired:
    """Everything a job should own: pods by name, and the other children."""

    pods: dict[str, PodSlot]
    children: list[Child]


# ---------------------------------------------------------------- quantities

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity_bytes(q: str) -> int:
    """Bytes of a memory quantity like ``32Gi`` or ``500M`` (the spec's pattern admits only these)."""
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * _SUFFIX[suffix])
    if q.endswith("m"):
        return int(float(q[:-1]) / 1000)
    return int(float(q))


def add_memory(a: str, b: str) -> str:
    """``a + b`` as a quantity in whole MiB (rounded up)."""
    total = quantity_bytes(a) + quantity_bytes(b)
    return f"{-(-total // 2**20)}Mi"


# ---------------------------------------------------------------- pods

def _meta(job: JobRef, name: str, role: Role | None = None, index: int | None = None) -> dict[str, Any]:
    reserved = {k: v for k, v in job.labels.items() if not k.startswith(("app.kubernetes.io/", names.GROUP))}
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {**reserved, **names.labels(job.name, role, index)},
        "ownerReferences": [job.owner_reference()],
    }


def _tolerations(items: list[Toleration]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in items]


def _env(job: JobRef, role: Role, index: int, extra: dict[str, str]) -> list[dict[str, Any]]:
    base = {
        C.ENV_JOB_NAME: job.name,
        C.ENV_JOB_NAMESPACE: job.namespace,
        C.ENV_ROLE: role.value,
        C.ENV_REPLICA_INDEX: str(index),
        C.ENV_SPEC: f"{SPEC_DIR}/{SPEC_FILE}",
        "RAY_ADDRESS": f"{head_host(job)}:{PORT_GCS}",
        # Ray 2.60 turns token auth on by default and writes a fresh token per node: the pods of
        # one job would refuse each other. The job's network is its own headless Service.
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    merged = {**base, **extra}
    return [{"name": k, "value": v} for k, v in merged.items()]


def _ray_resources(*resources: str) -> str:
    """The ``ray start --resources`` JSON: one unit of each role resource this pod advertises."""
    return json.dumps({r: 1 for r in resources})


def head_host(job: JobRef) -> str:
    """DNS name of the driver pod through the headless Service."""
    return f"{names.pod_name(job.name, Role.DRIVER, 0)}.{names.service_name(job.name)}.{job.namespace}.svc"


def _command(job: JobRef, role: Role, gpus: int, ray_resources: str) -> list[str]:
    if role is Role.DRIVER:
        return ["asyncrl", "driver", "--spec", f"{SPEC_DIR}/{SPEC_FILE}"]
    return [
        "ray", "start", "--block", f"--address={head_host(job)}:{PORT_GCS}",
        f"--num-gpus={gpus}", f"--resources={ray_resources}",
    ]


def _pod(
    job: JobRef,
    spec: AsyncRLJobSpec,
    settings: OperatorSettings,
    epoch: int,
    role: Role,
    index: int,
    *,
    gpus: int,
    resources: Resources,
    memory: str,
    overrides: PodOverrides,
    ray_resources: str,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    name = names.pod_name(job.name, role, index)
    meta = _meta(job, name, role, index)
    meta["labels"] = {**overrides.labels, **meta["labels"]}
    meta["annotations"] = {**overrides.annotations, names.ANNOTATION_EPOCH: str(epoch)}
    limits: dict[str, str] = {"memory": memory}
    requests: dict[str, str] = {"cpu": resources.cpu, "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(gpus)
    mounts = [{"name": "spec", "mountPath": SPEC_DIR, "readOnly": True}]
    volumes: list[dict[str, Any]] = [{"name": "spec", "configMap": {"name": names.configmap_name(job.name)}}]
    if role is not Role.DRIVER:
        # NCCL and vLLM need more than the container runtime's 64 MiB /dev/shm.
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
    # Only a shared volume makes checkpoints survive a gang restart: without one the driver keeps
    # its local run directory and a restart starts over (ASYNCRL_CHECKPOINT_DIR stays unset).
    checkpoint_env: dict[str, str] = {}
    if spec.checkpoint.volume_claim_name and role in (Role.DRIVER, Role.ACTOR):
        checkpoint_env[C.ENV_CHECKPOINT_DIR] = CHECKPOINT_MOUNT
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint.volume_claim_name}}
        )
    ports = [{"name": "metrics", "containerPort": spec.monitoring.port}]
    if role is Role.DRIVER:
        ports += [
            {"name": "gcs", "containerPort": PORT_GCS},
            {"name": "dashboard", "containerPort": PORT_DASHBOARD},
            {"name": "client", "containerPort": PORT_CLIENT},
        ]
    container: dict[str, Any] = {
        "name": role.value,
        "image": overrides.image or settings.job_image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": _command(job, role, gpus, ray_resources),
        "env": _env(job, role, index, {**checkpoint_env, **(extra_env or {}), **overrides.env}),
        "ports": ports,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mounts,
    }
    if role is Role.DRIVER:
        container["readinessProbe"] = {
            "httpGet": {"path": C.GCS_HEALTH_PATH, "port": PORT_DASHBOARD},
            "periodSeconds": 10,
            "failureThreshold": 6,
        }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator owns restarts (gang semantics, backoffLimit)
        "hostname": name,
        "subdomain": names.service_name(job.name),
        "automountServiceAccountToken": role is Role.DRIVER,
        "containers": [container],
        "volumes": volumes,
    }
    if role is Role.DRIVER:
        pod_spec["serviceAccountName"] = names.status_account_name(job.name)
    node_selector = {**spec.scheduling.node_selector, **overrides.node_selector}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = _tolerations([*spec.scheduling.tolerations, *overrides.tolerations])
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    if spec.scheduling.scheduler_name:
        pod_spec["schedulerName"] = spec.scheduling.scheduler_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def desired_pods(job: JobRef, spec: AsyncRLJobSpec, settings: OperatorSettings, epoch: int) -> dict[str, PodSlot]:
    """All pods of the job for pod generation ``epoch``, keyed by name."""
    slots: list[PodSlot] = []

    def add(role: Role, index: int, **kw: Any) -> None:
        slots.append(PodSlot(role, index, _pod(job, spec, settings, epoch, role, index, **kw)))

    actor = spec.actor
    driver = Resources(cpu="2", memory="8Gi")  # Ray head + driver: no GPU, modest memory
    add(Role.DRIVER, 0, gpus=0, resources=driver, memory=driver.memory,
        overrides=PodOverrides(image=actor.template.image), ray_resources=_ray_resources(C.RESOURCE_DRIVER))

    interrupt_sync = spec.old_logits.strategy is OldLogitStrategy.INTERRUPT_SYNC
    ro = spec.rollout
    rollout_memory = add_memory(ro.resources.memory, ro.training_side_memory) if interrupt_sync else ro.resources.memory
    rollout_env = {C.ENV_ROLLOUT_ENGINE: ro.engine}
    if ro.engine_args:
        rollout_env[C.ENV_ENGINE_ARGS] = " ".join(f"--{k} {v}" for k, v in sorted(ro.engine_args.items()))
    if interrupt_sync:
        # The rollout pods also run the training-side model code for pi_old (paper §5.1).
        rollout_env[C.ENV_HOSTED_ROLES] = "rollout,oldlogits"
    for i in range(ro.replicas):
        add(Role.ROLLOUT, i, gpus=ro.gpus_per_replica, resources=ro.resources, memory=rollout_memory,
            overrides=ro.template,
            ray_resources=_ray_resources(C.RESOURCE_ROLLOUT, *((C.RESOURCE_OLD_LOGITS,) if interrupt_sync else ())),
            extra_env=rollout_env)

    mega = actor.megatron
    actor_env = {
        C.ENV_TENSOR_PARALLEL: str(mega.tensor_parallel),
        C.ENV_PIPELINE_PARALLEL: str(mega.pipeline_parallel),
        C.ENV_DATA_PARALLEL: str(actor.data_parallel),
        C.ENV_WORLD_SIZE: str(actor.world_size),
    }
    for i in range(actor.replicas):
        add(Role.ACTOR, i, gpus=actor.gpus_per_replica, resources=actor.resources, memory=actor.resources.memory,
            overrides=actor.template, ray_resources=_ray_resources(C.RESOURCE_ACTOR), extra_env=actor_env)

    if spec.old_logits.strategy is OldLogitStrategy.DEDICATED:
        for i in range(spec.old_logits.dedicated.replicas):
            add(Role.OLD_LOGIT, i, gpus=actor.gpus_per_replica, resources=actor.resources,
                memory=actor.resources.memory, overrides=actor.template, ray_resources=_ray_resources(C.RESOURCE_OLD_LOGITS),
                extra_env=actor_env)
    return {s.manifest["metadata"]["name"]: s for s in slots}


# ---------------------------------------------------------------- other children

def spec_document(job: JobRef, spec: AsyncRLJobSpec) -> str:
    """The validated job (defaults filled in) as the YAML the driver reads."""
    doc = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": job.name, "namespace": job.namespace}, "spec": spec.to_spec_dict()}
    return yaml.safe_dump(doc, sort_keys=False)


def desired_children(job: JobRef, spec: AsyncRLJobSpec) -> list[Child]:
    """ConfigMap (validated spec), headless Service, and the driver's status-reporting identity."""
    sa = names.status_account_name(job.name)
    ports = [
        {"name": "gcs", "port": PORT_GCS, "targetPort": PORT_GCS},
        {"name": "dashboard", "port": PORT_DASHBOARD, "targetPort": PORT_DASHBOARD},
        {"name": "client", "port": PORT_CLIENT, "targetPort": PORT_CLIENT},
        {"name": "metrics", "port": spec.monitoring.port, "targetPort": spec.monitoring.port},
    ]
    return [
        Child("ConfigMap", names.configmap_name(job.name), {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, names.configmap_name(job.name)),
            "data": {SPEC_FILE: spec_document(job, spec)},
        }),
        Child("Service", names.service_name(job.name), {
            "apiVersion": "v1", "kind": "Service", "metadata": _meta(job, names.service_name(job.name)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": names.selector(job.name), "ports": ports},
        }),
        Child("ServiceAccount", sa, {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, sa),
            "automountServiceAccountToken": False,
        }),
        Child("Role", sa, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(job, sa),
            "rules": [{"apiGroups": [names.GROUP], "resources": [f"{C.PLURAL}/status"],
                       "resourceNames": [job.name], "verbs": ["get", "patch"]}],
        }),
        Child("RoleBinding", sa, {
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(job, sa),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": job.namespace}],
        }),
    ]


def desired(job: JobRef, spec: AsyncRLJobSpec, settings: OperatorSettings, epoch: int) -> Desired:
    return Desired(pods=desired_pods(job, spec, settings, epoch), children=desired_children(job, spec))
