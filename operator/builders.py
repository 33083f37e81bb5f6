"""Pure builders: an AsyncRLJob's spec -> the manifests of its children.

No API calls, no clock and no randomness here (the job's Ray token comes in from the caller);
``tests/operator/test_builders.py`` checks them without a server. The job's pods form one Ray
cluster: the driver pod runs the Ray head and the job driver; rollout, actor and old-logit pods join
it as workers with a custom Ray resource named after their role (actor pod ``i`` one unit of ``actor`` and
of ``actor-<i>`` per rank it hosts: :func:`actor_ray_resources`). Hardening, gang scheduling, the
NetworkPolicy and the /dev/shm rule are in :mod:`asyncrl.operator.pod_policy`; the agent endpoint's
port, environment, Service and NetworkPolicy (``spec.task.agent``) in :mod:`asyncrl.operator.agent_endpoint`.

Start-up order, as KubeRay's: a worker pod's init container (``asyncrl probe gcs``) waits until the
head's GCS answers; its readiness probe (``asyncrl probe joined``) means "this pod's raylet is an
ALIVE node of the job's Ray cluster". The driver is ready when ``GET :8265/api/gcs_healthz`` answers
and is restarted (the pod fails; the operator restarts the gang) only after minutes without it.
Workers need no liveness probe: ``ray start --block`` exits when its raylet dies.

Ray token auth is on in every pod: ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN`` from the job's
Secret (``names.ray_token_secret_name``, key ``token``), as KubeRay's ``authOptions: {mode: token}``.
One token per job: the pods accept each other and nothing else.

Job-image contract (``docker/job.Dockerfile``): the image has ``asyncrl`` and ``ray`` on PATH and
runs as uid 10001; the driver runs ``asyncrl driver --spec /etc/asyncrl/job.yaml`` (the validated
spec from the ConfigMap, defaults filled in) and reports ``status.training`` as
``asyncrl.api.status`` documents, through the pod's ``status`` sidecar (``asyncrl status-relay``), the
only container with the ``<job>-status`` token (:mod:`asyncrl.operator.driver_pod`).
"""

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from asyncrl.api import constants as C
from asyncrl.api.constants import API_VERSION, KIND
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits import OldLogitStrategy
from asyncrl.api.pods import DriverSpec, EnvVar, GangScheduler, PodOverrides, Resources, Toleration
from asyncrl.api.task_services import header_env
from asyncrl.operator import agent_endpoint, driver_pod, names, pod_policy
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.names import Role
from asyncrl.operator.pod_policy import GPU_RESOURCE, add_memory, quantity_bytes

SPEC_DIR, SPEC_FILE, CHECKPOINT_MOUNT = C.SPEC_DIR, C.SPEC_FILE, C.CHECKPOINT_MOUNT
PORT_GCS, PORT_DASHBOARD, PORT_CLIENT = C.PORT_GCS, C.PORT_DASHBOARD, C.PORT_CLIENT

# Ray's own environment (read by ``ray start`` and ``ray.init`` in every pod).
RAY_ADDRESS, RAY_AUTH_MODE, RAY_AUTH_TOKEN = C.ENV_RAY_ADDRESS, C.ENV_RAY_AUTH_MODE, C.ENV_RAY_AUTH_TOKEN
TOKEN_KEY = C.TOKEN_KEY  # key of the token in the job's Secret
GCS_WAIT_SECONDS = 900  # a worker's init container gives up after this long (as the driver's --wait-timeout)
INIT_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}


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
    follows_spec: bool = False
    """Patched to the desired ``spec`` when the server's differs (the agent endpoint's Service and
    NetworkPolicy); the others are created once (the ConfigMap's data and a PodGroup follow by kind)."""
    note: str = ""
    """Said in the event of its creation (e.g. the agent endpoint's URL)."""


@dataclass(frozen=True)
class Unwanted:
    """A child the job may have made under an earlier spec and this one does not want: deleted if it is ours."""

    kind: str
    name: str
    why: str
    api_version: str = "v1"


@dataclass(frozen=True)
class Desired:
    """Everything a job should own: pods by name, and the other children."""

    pods: dict[str, PodSlot]
    children: list[Child]
    spec_hash: str = ""
    """:func:`spec_hash` of the spec the pods were built from (also their ``names.ANNOTATION_SPEC_HASH``)."""
    unwanted: list[Unwanted] = field(default_factory=list)
    """Optional children this spec does not want (:func:`unwanted_children`)."""


# ---------------------------------------------------------------- pods

def spec_hash(spec: AsyncRLJobSpec) -> str:
    """sha256 (first 16 hex digits) of the pod-shaping spec: everything but ``runPolicy`` and
    ``monitoring.maskGuard`` (those change what the operator does, not what the pods are), and
    ``task.agent``/``task.endpoint`` when the agent is unset (an endpoint nobody serves shapes no pod)."""
    doc = spec.to_spec_dict()
    doc.pop("runPolicy", None)
    doc.get("monitoring", {}).pop("maskGuard", None)
    task = doc.get("task", {})
    if task.get("agent") is None:  # no endpoint: the hash of an operator before task.agent (an upgrade restarts nothing)
        task.pop("agent", None)
        task.pop("endpoint", None)
    if doc.get("driver") == DriverSpec().to_spec_dict():  # the default: the hash of an operator before spec.driver
        doc.pop("driver", None)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _meta(job: JobRef, name: str, role: Role | None = None, index: int | None = None) -> dict[str, Any]:
    # The job's own labels travel to its children, except the ownership labels the operator sets and
    # selects on (another job's name there would draw these children into that job).
    copied = {k: v for k, v in job.labels.items() if not C.reserved_label(k)}
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": {**copied, **names.labels(job.name, role, index)},
        "ownerReferences": [job.owner_reference()],
    }


def _tolerations(items: list[Toleration]) -> list[dict[str, Any]]:
    return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in items]


def head_host(job: JobRef) -> str:
    """DNS name of the driver pod through the headless Service."""
    return f"{names.pod_name(job.name, Role.DRIVER, 0)}.{names.service_name(job.name)}.{job.namespace}.svc"


def _gcs_address(job: JobRef) -> str:
    return f"{head_host(job)}:{PORT_GCS}"


def _ray_env(job: JobRef) -> list[dict[str, Any]]:
    """Ray's environment in every container: the head's address and token auth with the job's token."""
    return [
        {"name": RAY_ADDRESS, "value": _gcs_address(job)},
        {"name": RAY_AUTH_MODE, "value": "token"},
        {"name": RAY_AUTH_TOKEN, "valueFrom": {"secretKeyRef": {
            "name": names.ray_token_secret_name(job.name), "key": TOKEN_KEY}}},
        {"name": "RAY_USAGE_STATS_ENABLED", "value": "0"},
    ]


def _env(job: JobRef, role: Role, index: int, extra: dict[str, str], user: list[EnvVar],
         entries: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Ours first (then ``entries``, whole env entries such as a downward-API value), then the role's
    ``template.env`` (validation refuses ASYNCRL_* and RAY_* there)."""
    ours = {
        C.ENV_JOB_NAME: job.name,
        C.ENV_JOB_NAMESPACE: job.namespace,
        C.ENV_ROLE: role.value,
        C.ENV_REPLICA_INDEX: str(index),
        C.ENV_SPEC: f"{SPEC_DIR}/{SPEC_FILE}",
        **extra,
    }
    return [
        *({"name": k, "value": v} for k, v in ours.items()),
        *(entries or ()),
        *_ray_env(job),
        *(e.model_dump(mode="json", by_alias=True, exclude_none=True) for e in user),
    ]


def _ray_resources(*resources: str, units: int = 1) -> str:
    """The ``ray start --resources`` JSON: ``units`` of each role resource this pod advertises."""
    return json.dumps({r: units for r in resources})


def actor_ray_resources(index: int, gpus_per_replica: int) -> str:
    """Actor pod ``index``: one unit of ``actor`` and of ``actor-<index>`` per rank process it hosts
    (``g = max(gpusPerReplica, 1)``: one per GPU, one on a CPU pod), so the driver's rank
    ``r = index*g + j`` asks for ``{"actor-<index>": 1}`` (and a GPU) and lands on this pod."""
    return _ray_resources(C.RESOURCE_ACTOR, C.actor_pod_resource(index), units=max(gpus_per_replica, 1))


def _command(job: JobRef, role: Role, gpus: int, cpu: str, memory: str, ray_resources: str) -> list[str]:
    if role is Role.DRIVER:
        return ["asyncrl", "driver", "--spec", f"{SPEC_DIR}/{SPEC_FILE}"]
    # What the pod holds, as KubeRay passes it: Ray would otherwise count the node's CPUs and memory.
    ray_start = [
        "ray", "start", "--block", f"--address={_gcs_address(job)}",
        f"--num-cpus={pod_policy.ray_num_cpus(cpu)}", f"--memory={quantity_bytes(memory)}",
        f"--num-gpus={gpus}", f"--resources={ray_resources}", "--disable-usage-stats",
    ]
    if role is Role.ACTOR:
        return [*ACTOR_SIGTERM_SHELL, *ray_start]
    return ray_start


# A gang-wide SIGTERM (preemption, drain) reaches every pod at once, but the driver's final checkpoint needs
# the actor ranks alive: the actor pod's PID 1 is this shell, which keeps SIGTERM from ``ray start`` (the
# runtime signals PID 1 only) and waits; the pod ends when its raylet exits (the head is gone) or at the
# grace period's SIGKILL (runPolicy.terminationGracePeriodSeconds).
ACTOR_SIGTERM_SCRIPT = (
    '"$@" & pid=$!; '
    "trap 'echo \"SIGTERM: the actor keeps running until the driver has written its final checkpoint\"' TERM; "
    # a wait the trap interrupts returns 143; the child's own status is the last wait's (the shell keeps it, even
    # when the child ended, and was reaped, during the trap: exiting with the 143 then lost the raylet's code)
    'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; done; wait "$pid"'
)
ACTOR_SIGTERM_SHELL = ["sh", "-c", ACTOR_SIGTERM_SCRIPT, "actor-pod"]


def _probes(job: JobRef, role: Role) -> dict[str, Any]:
    if role is Role.DRIVER:
        health = {"httpGet": {"path": C.GCS_HEALTH_PATH, "port": PORT_DASHBOARD}, "timeoutSeconds": 5}
        return {
            "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 6},
            # generous: 60 s to start, then 5 minutes without an answer before the pod is failed
            "livenessProbe": {**health, "initialDelaySeconds": 60, "periodSeconds": 20, "failureThreshold": 15},
        }
    return {"readinessProbe": {
        "exec": {"command": ["asyncrl", "probe", "joined", "--address", _gcs_address(job),
                             "--resource", role.ray_resource]},
        "initialDelaySeconds": 5, "periodSeconds": 15, "timeoutSeconds": 10, "failureThreshold": 3,
    }}


def _wait_for_gcs(job: JobRef, image: str, settings: OperatorSettings, security: dict[str, Any]) -> dict[str, Any]:
    """KubeRay's ``wait-gcs-ready``: the worker starts only once the head's GCS answers (bounded)."""
    return {
        "name": "wait-gcs",
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["asyncrl", "probe", "gcs", "--address", _gcs_address(job), "--wait", str(GCS_WAIT_SECONDS)],
        "env": _ray_env(job),
        "resources": INIT_RESOURCES,
        "securityContext": security,
    }


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
    spec_digest: str,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One pod of ``role``. A rollout pod of a job with an external agent (``spec.task.agent: external``) also
    gets the agent endpoint's port and environment (:mod:`asyncrl.operator.agent_endpoint`)."""
    name = names.pod_name(job.name, role, index)
    gang = spec.scheduling.gang_scheduler
    gang_labels, gang_annotations = pod_policy.gang_metadata(gang, names.pod_group_name(job.name))
    meta = _meta(job, name, role, index)
    meta["labels"] = {**overrides.labels, **meta["labels"], **gang_labels}  # ours last: validation refuses them
    meta["annotations"] = {**overrides.annotations, **gang_annotations, names.ANNOTATION_EPOCH: str(epoch),
                           names.ANNOTATION_SPEC_HASH: spec_digest}
    limits: dict[str, str] = {"memory": memory}
    requests: dict[str, str] = {"cpu": resources.cpu, "memory": memory}
    if gpus:
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(gpus)
    for device, count in sorted(resources.extra.items()):  # device-plugin resources (RDMA HCAs, ...)
        limits[device] = requests[device] = str(count)
    mounts: list[dict[str, Any]] = [
        {"name": "spec", "mountPath": SPEC_DIR, "readOnly": True},
        {"name": "dshm", "mountPath": C.SHM_MOUNT},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "spec", "configMap": {"name": names.configmap_name(job.name)}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": pod_policy.shm_size_limit(memory)}},
    ]
    # Only a shared volume makes checkpoints survive a gang restart: without one the driver keeps
    # its local run directory and a restart starts over (ASYNCRL_CHECKPOINT_DIR stays unset).
    checkpoint_env: dict[str, str] = {}
    # weightSync.transport disk: the receivers read the versions from the same volume (ReadWriteMany).
    reads_weights = spec.actor.weight_sync.transport == "disk" and role in (Role.ROLLOUT, Role.OLD_LOGIT)
    if spec.checkpoint.volume_claim_name and (role in (Role.DRIVER, Role.ACTOR) or reads_weights):
        if not reads_weights:
            checkpoint_env[C.ENV_CHECKPOINT_DIR] = CHECKPOINT_MOUNT
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
        volumes.append(
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": spec.checkpoint.volume_claim_name}}
        )
    mounts += [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in overrides.volume_mounts]
    volumes += [v.model_dump(mode="json", by_alias=True) for v in overrides.volumes]
    if role is Role.DRIVER:  # the relay's socket, the token for the sidecar only, the task's volumes (driver_pod.py)
        task_mounts, task_volumes = driver_pod.task_volumes(spec)
        mounts += [driver_pod.relay_mount(), *task_mounts]
        volumes += [driver_pod.status_relay_volume(), driver_pod.status_token_volume(), *task_volumes]
    ports = [{"name": "metrics", "containerPort": spec.monitoring.port}]
    serves_agent = role is Role.ROLLOUT and agent_endpoint.exposed(spec)  # an in-process agent: loopback
    if serves_agent:
        ports.append(agent_endpoint.rollout_port(spec))
    if role is Role.DRIVER:
        ports += [
            {"name": "gcs", "containerPort": PORT_GCS},
            {"name": "dashboard", "containerPort": PORT_DASHBOARD},
            {"name": "client", "containerPort": PORT_CLIENT},
        ]
    image = overrides.image or settings.job_image
    security = pod_policy.container_security_context(overrides.security_context)
    container: dict[str, Any] = {
        "name": role.value,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": _command(job, role, gpus, resources.cpu, memory, ray_resources),
        "env": [*_env(job, role, index, {**checkpoint_env, **(extra_env or {})}, overrides.env,
                      agent_endpoint.rollout_env(job.name, spec) if serves_agent else None),
                # a service's headersFrom Secrets where the task is built (driver's check) and called (rollout)
                *(header_env(spec.task) if role in (Role.DRIVER, Role.ROLLOUT) else ())],
        "ports": ports,
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mounts,
        "securityContext": security,
        # A refused spec (exit 2) or a crash is explained on stderr: the kubelet copies its tail into the
        # termination message, which the operator puts into the job's status and event.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        **_probes(job, role),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # the operator owns restarts (gang semantics, backoffLimit)
        # SIGTERM -> the driver finishes its step and checkpoints within this (runPolicy), then exits 0
        "terminationGracePeriodSeconds": spec.run_policy.termination_grace_period_seconds,
        "hostname": name,
        "subdomain": names.service_name(job.name),
        "automountServiceAccountToken": False,  # the driver's token: the status sidecar's own volume only
        "securityContext": pod_policy.pod_security_context(overrides.pod_security_context),
        "containers": [container],
        "volumes": volumes,
    }
    if role is not Role.DRIVER:
        pod_spec["initContainers"] = [_wait_for_gcs(job, image, settings, security)]
    else:  # a native sidecar: the only container with the <job>-status token
        pod_spec["initContainers"] = [driver_pod.status_sidecar(job.name, job.namespace, image, settings, security)]
    if role is Role.DRIVER:
        pod_spec["serviceAccountName"] = names.status_account_name(job.name)
    if overrides.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [s.model_dump(mode="json") for s in overrides.image_pull_secrets]
    node_selector = {**spec.scheduling.node_selector, **overrides.node_selector}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if overrides.affinity:
        pod_spec["affinity"] = dict(overrides.affinity)
    tolerations = _tolerations([*spec.scheduling.tolerations, *overrides.tolerations])
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    if scheduler := pod_policy.scheduler_name(gang, spec.scheduling.scheduler_name):
        pod_spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def _driver_overrides(actor_template: PodOverrides) -> PodOverrides:
    """The driver runs the actor's image, so it takes what pulling and running that image needs from
    the actor's template; the actor's placement, env and volumes stay with the actor."""
    t = actor_template
    return PodOverrides(image=t.image, image_pull_secrets=t.image_pull_secrets, pod_security_level=t.pod_security_level,
                        pod_security_context=t.pod_security_context, security_context=t.security_context)


def desired_pods(job: JobRef, spec: AsyncRLJobSpec, settings: OperatorSettings, epoch: int) -> dict[str, PodSlot]:
    """All pods of the job for pod generation ``epoch``, keyed by name."""
    slots: list[PodSlot] = []
    digest = spec_hash(spec)

    def add(role: Role, index: int, **kw: Any) -> None:
        slots.append(PodSlot(role, index, _pod(job, spec, settings, epoch, role, index, spec_digest=digest, **kw)))

    actor = spec.actor
    driver = Resources(cpu=spec.driver.resources.cpu, memory=spec.driver.resources.memory)  # no GPU
    add(Role.DRIVER, 0, gpus=0, resources=driver, memory=driver.memory,
        overrides=_driver_overrides(actor.template), ray_resources=_ray_resources(C.RESOURCE_DRIVER),
        extra_env={C.ENV_STATUS_RELAY: C.STATUS_RELAY_SOCKET})

    interrupt_sync = spec.old_logits.strategy is OldLogitStrategy.INTERRUPT_SYNC
    ro = spec.rollout
    rollout_memory = add_memory(ro.resources.memory, ro.training_side_memory) if interrupt_sync else ro.resources.memory
    rollout_env = {C.ENV_ROLLOUT_ENGINE: ro.engine}
    if ro.engine_args:
        rollout_env[C.ENV_ENGINE_ARGS] = " ".join(f"--{k} {v}" for k, v in sorted(ro.engine_args.items()))
    if interrupt_sync:
        # The rollout pods also run the training-side model code for pi_old (paper §5.1).
        rollout_env[C.ENV_HOSTED_ROLES] = "rollout,oldlogits"
    rollout_resources = (C.RESOURCE_ROLLOUT, C.RESOURCE_OLD_LOGITS) if interrupt_sync else (C.RESOURCE_ROLLOUT,)
    for i in range(ro.replicas):
        add(Role.ROLLOUT, i, gpus=ro.gpus_per_replica, resources=ro.resources, memory=rollout_memory,
            overrides=ro.template, ray_resources=_ray_resources(*rollout_resources), extra_env=rollout_env)

    mega = actor.megatron
    actor_env = {
        C.ENV_TENSOR_PARALLEL: str(mega.tensor_parallel),
        C.ENV_PIPELINE_PARALLEL: str(mega.pipeline_parallel),
        C.ENV_DATA_PARALLEL: str(actor.data_parallel),
        C.ENV_WORLD_SIZE: str(actor.world_size),
    }
    # Every rank of a GPU pod sees all the pod's GPUs (NCCL within the node); its device is its Ray GPU id.
    rank_env = {C.ENV_RAY_NOSET_CUDA_VISIBLE_DEVICES: "1"} if actor.gpus_per_replica else {}
    for i in range(actor.replicas):
        add(Role.ACTOR, i, gpus=actor.gpus_per_replica, resources=actor.resources, memory=actor.resources.memory,
            overrides=actor.template, ray_resources=actor_ray_resources(i, actor.gpus_per_replica),
            extra_env={**actor_env, **rank_env})

    if spec.old_logits.strategy is OldLogitStrategy.DEDICATED:
        # A scorer pod runs one gang of the scorer's own layout (oldLogits.dedicated: tensorParallel ranks, one
        # per GPU), so its env says that layout, not the actor's; a gang of k > 1 ranks also advertises
        # oldlogits-<i>: k, so all of them land on this pod (trainer/driver/hosts/fleet.py dedicated_spawner).
        scorer = spec.old_logits.dedicated.layout_for(actor)
        scorer_env = {
            C.ENV_TENSOR_PARALLEL: str(scorer.tensor_parallel),
            C.ENV_PIPELINE_PARALLEL: "1",
            C.ENV_DATA_PARALLEL: "1",
            C.ENV_WORLD_SIZE: str(scorer.world_size),
        }
        for i in range(spec.old_logits.dedicated.replicas):
            gang = {C.old_logits_pod_resource(i): scorer.tensor_parallel} if scorer.tensor_parallel > 1 else {}
            add(Role.OLD_LOGIT, i, gpus=scorer.gpus_per_replica, resources=actor.resources,
                memory=actor.resources.memory, overrides=actor.template,
                ray_resources=json.dumps({C.RESOURCE_OLD_LOGITS: 1, **gang}), extra_env=scorer_env)
    return {s.manifest["metadata"]["name"]: s for s in slots}


# ---------------------------------------------------------------- other children

def spec_document(job: JobRef, spec: AsyncRLJobSpec) -> str:
    """The validated job (defaults filled in) as the YAML the driver reads."""
    doc = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": job.name, "namespace": job.namespace}, "spec": spec.to_spec_dict()}
    return yaml.safe_dump(doc, sort_keys=False)


def ray_token_secret(job: JobRef, token: str) -> Child:
    """The job's Ray token (``stringData.token``): created once, never patched; every pod reads it."""
    name = names.ray_token_secret_name(job.name)
    return Child("Secret", name, {
        "apiVersion": "v1", "kind": "Secret", "metadata": _meta(job, name), "type": "Opaque",
        "stringData": {TOKEN_KEY: token},
    })


def desired_children(job: JobRef, spec: AsyncRLJobSpec, settings: OperatorSettings,
                     pods: dict[str, PodSlot], *, ray_token: str | None = None,
                     agent_key: str | None = None) -> list[Child]:
    """In creation order: the Ray token Secret (only with ``ray_token``), the ConfigMap (validated
    spec), the headless Service, the NetworkPolicy, the driver's status-reporting identity, the
    agent endpoint's key Secret, Service and NetworkPolicy (only with ``spec.task.agent: external``, the key
    only with ``agent_key`` and no ``sessionKeyFrom``, the policy only with ``allowFrom``: :func:`agent_children`),
    and the PodGroup of the gang scheduler (only with one)."""
    sa = names.status_account_name(job.name)
    ports = [
        {"name": "gcs", "port": PORT_GCS, "targetPort": PORT_GCS},
        {"name": "dashboard", "port": PORT_DASHBOARD, "targetPort": PORT_DASHBOARD},
        {"name": "client", "port": PORT_CLIENT, "targetPort": PORT_CLIENT},
        {"name": "metrics", "port": spec.monitoring.port, "targetPort": spec.monitoring.port},
    ]
    netpol = names.network_policy_name(job.name)
    children = [] if ray_token is None else [ray_token_secret(job, ray_token)]
    children += [
        Child("ConfigMap", names.configmap_name(job.name), {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, names.configmap_name(job.name)),
            "data": {SPEC_FILE: spec_document(job, spec)},
        }),
        Child("Service", names.service_name(job.name), {
            "apiVersion": "v1", "kind": "Service", "metadata": _meta(job, names.service_name(job.name)),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": names.selector(job.name), "ports": ports},
        }),
        Child("NetworkPolicy", netpol, pod_policy.network_policy(
            _meta(job, netpol), names.selector(job.name),
            metrics_port=spec.monitoring.port if spec.monitoring.enabled else None,
            prometheus_namespaces=settings.prometheus_namespace_selector,
            prometheus_pods=settings.prometheus_pod_selector,
        )),
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
    children += agent_children(job, spec, agent_key=agent_key)
    gang = spec.scheduling.gang_scheduler
    if gang is not GangScheduler.NONE:
        group = names.pod_group_name(job.name)
        children.append(Child("PodGroup", group, pod_policy.pod_group(
            gang, _meta(job, group), [s.manifest for s in pods.values()],
            queue=job.labels.get(pod_policy.VOLCANO_QUEUE_LABEL),
            priority_class_name=spec.scheduling.priority_class_name,
        )))
    return children


def agent_children(job: JobRef, spec: AsyncRLJobSpec, *, agent_key: str | None = None) -> list[Child]:
    """An external agent's key Secret (the operator's, with ``agent_key`` and no ``sessionKeyFrom``), Service, and
    NetworkPolicy (with ``allowFrom`` too). An in-process agent has none: its endpoint stays on loopback."""
    if not agent_endpoint.exposed(spec):
        return []
    svc, netpol = names.agent_service_name(job.name), names.agent_network_policy_name(job.name)
    out: list[Child] = []
    if agent_key is not None and agent_endpoint.generates_key(spec):
        secret = names.agent_key_secret_name(job.name)
        out.append(Child("Secret", secret, agent_endpoint.key_secret(_meta(job, secret), agent_key),
                         note=f"the key a harness sends to take a session (POST /v1/sessions), in its key "
                         f"{names.AGENT_KEY_KEY!r}"))
    out += [Child("Service", svc, agent_endpoint.service(_meta(job, svc), job.name, spec), follows_spec=True,
                 note=f"the agent endpoint: {agent_endpoint.api_base(job.name, job.namespace, spec)}")]
    if agent_endpoint.admits_peers(spec):
        out.append(Child("NetworkPolicy", netpol, agent_endpoint.network_policy(_meta(job, netpol), job.name, spec),
                         follows_spec=True, note=f"admits spec.task.endpoint.allowFrom to port "
                         f"{spec.task.endpoint.port} of the rollout pods"))
    return out


def unwanted_children(job: JobRef, spec: AsyncRLJobSpec) -> list[Unwanted]:
    """The optional children an earlier spec of this job may have made and this one does not want."""
    return [Unwanted(kind, name, why, api) for kind, name, api, why in agent_endpoint.unwanted(job.name, spec)]


def desired(job: JobRef, spec: AsyncRLJobSpec, settings: OperatorSettings, epoch: int, *,
            ray_token: str | None = None, agent_key: str | None = None) -> Desired:
    """Everything ``job`` should own at pod generation ``epoch``.

    ``ray_token``: the job's Ray token, generated by the caller (``secrets.token_urlsafe(32)``) and
    only used to create the Secret; without it the Secret is not among the children (the pods still
    read it by name, so pass it whenever the Secret may be missing). ``agent_key``: the same for an external
    agent's session key (``secrets.token_urlsafe(agent_endpoint.KEY_BYTES)``, the Secret ``<job>-agent-key``).
    """
    pods = desired_pods(job, spec, settings, epoch)
    return Desired(pods=pods, children=desired_children(job, spec, settings, pods, ray_token=ray_token,
                                                        agent_key=agent_key),
                   spec_hash=spec_hash(spec), unwanted=unwanted_children(job, spec))
