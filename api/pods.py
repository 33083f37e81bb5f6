"""Pod-level sections of the spec: where the job's processes run and how they are watched.

The operator (``asyncrl.operator``) turns these into pods; ``asyncrl run`` (local) ignores the
placement fields. Quantities (``cpu``, ``memory``) are Kubernetes quantity strings.
"""

import re
from enum import StrEnum
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, RuleError, on_field, raise_all
from asyncrl.api.constants import reserved_label
from asyncrl.api.kube_types import (
    RESERVED_VOLUME_MESSAGE,  # noqa: F401 -- re-exported: the messages of a template live here
    PodSecurityContext,
    SecurityContext,
    Volume,
    VolumeMount,
)
from asyncrl.api.pod_security import (
    MOUNT_NEEDS_VOLUME_MESSAGE,
    RESERVED_ANNOTATION_MESSAGE,
    RESERVED_LABEL_MESSAGE,
    PodSecurityLevel,
    cel_rules,
    reserved_annotation,
    reserved_annotation_cel,
    reserved_label_cel,
    restricted_problems,
)
from asyncrl.api.weight_sync import WeightSyncSpec

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
# A device plugin's extended resource: <domain>/<name> (Kubernetes wants whole numbers, request = limit).
_DEVICE_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_GPU = "nvidia.com/gpu"
EXTRA_RESOURCE_MESSAGE = (
    "resources.extra holds device-plugin resources as <domain>/<name>: count >= 1, e.g. {rdma/hca: 1}; the "
    "GPUs are gpusPerReplica, not nvidia.com/gpu here"
)

# Environment names the operator sets itself (asyncrl.api.constants, Ray's own); a pod override
# may not shadow them.
RESERVED_ENV_PREFIXES = ("ASYNCRL_", "RAY_")
RESERVED_ENV_MESSAGE = (
    "env names starting with ASYNCRL_ or RAY_ are set by the operator and cannot be overridden; rename the variable"
)
ENV_SOURCE_MESSAGE = (
    "an env entry needs exactly one of value and valueFrom, e.g. value: '1', or "
    "valueFrom: {secretKeyRef: {name: my-secret, key: token}}"
)
PIPELINE_PARALLEL_MESSAGE = (
    "pipeline parallelism is refused: the actor's token_logprobs forward does not run under megatron's pipeline "
    "schedule; set actor.megatron.pipelineParallel: 1 and scale out with tensorParallel and actor.replicas "
    "(data parallel)"
)
EXPERT_PARALLEL_CPU_MESSAGE = (
    "expert parallelism is refused on CPU actor pods: megatron-core 0.16.1's CPU expert dispatch gives wrong "
    "expert gradients (unexplained); set actor.megatron.expertParallel: 1 or run the actor on GPUs "
    "(actor.gpusPerReplica >= 1)"
)
TP_DIVIDES_GPUS_MESSAGE = (
    "actor.megatron.tensorParallel must divide actor.gpusPerReplica (a tensor-parallel group stays inside one "
    "pod); set tensorParallel to a divisor of gpusPerReplica"
)
MP_DIVIDES_WORLD_MESSAGE = (
    "actor.megatron.tensorParallel x expertParallel must divide the actor's ranks (actor.replicas x "
    "max(gpusPerReplica, 1); a CPU pod runs one rank); raise actor.replicas or lower the parallel sizes"
)
ENGINES = ("transformers", "vllm")  # every one has a backend (asyncrl.rollout.engine_registry.ENGINES; a test keeps both equal)
ROLLOUT_GPUS_MESSAGE = (
    "a rollout worker uses at most one GPU in this build (both engines run on one device): set "
    "rollout.gpusPerReplica to 0 or 1 (for more rollout throughput raise rollout.replicas)"
)
TRANSFORMERS_ENGINE_ARGS: dict[str, type] = {"fp32Head": bool}  # what asyncrl.rollout.engine_registry.make_engine takes
# What the vllm engine takes (asyncrl.rollout.vllm_engine.VLLM_ENGINE_ARGS; a test keeps both equal). ints >= 0.
VLLM_ENGINE_ARGS: dict[str, type] = {
    "enforceEager": bool, "maxNumSeqs": int, "kvCacheMemoryBytes": int, "enablePrefixCaching": bool,
    "cpuThreads": int,
}
DEFAULT_TRAINING_SIDE_MEMORY = "16Gi"
# Pods one job may ask for per role: what a cluster can schedule, and what the operator's builder and its
# 512 Mi limit handle per reconcile (20 000 pods took 4 s and 277 MB).
MAX_ROLLOUT_REPLICAS = 512
MAX_ACTOR_REPLICAS = 64


class Resources(SpecModel):
    """CPU and memory requests of one pod (limits equal requests for memory)."""

    cpu: str = Field(default="4", pattern=_QUANTITY, description="CPU request, e.g. '4' or '500m'.")
    memory: str = Field(default="32Gi", pattern=_QUANTITY, description="Memory request and limit, e.g. '32Gi'.")
    extra: dict[str, int] = Field(
        default_factory=dict, max_length=8,
        description="Device-plugin resources per pod, request = limit, e.g. {'rdma/hca': 1} for RDMA (GPUs are "
        "gpusPerReplica).",
        # CEL only by map lookup: a regex over every key exceeds kube-apiserver 1.36's cost budget even at
        # 8 keys (the model checks the key's form; the API server checks a pod's resource names again).
        json_schema_extra=on_field(CelRule(f"!('{_GPU}' in self) && !('cpu' in self) && !('memory' in self) && "
                                           "self.all(k, self[k] >= 1)", EXTRA_RESOURCE_MESSAGE)),
    )

    @field_validator("extra")
    @classmethod
    def _device_resources(cls, v: dict[str, int]) -> dict[str, int]:
        if bad := sorted(f"{k}: {n}" for k, n in v.items()
                         if not re.match(_DEVICE_RESOURCE, k) or k in (_GPU, "cpu", "memory") or n < 1):
            raise ValueError(f"{EXTRA_RESOURCE_MESSAGE} (got {', '.join(bad)})")
        return v


class DriverResources(SpecModel):
    """CPU and memory of the driver pod: the Ray head and the job driver (no GPU, no device resources)."""

    cpu: str = Field(default="2", pattern=_QUANTITY, description="CPU request, e.g. '2' or '500m'.")
    memory: str = Field(default="8Gi", pattern=_QUANTITY, description="Memory request and limit, e.g. '8Gi'.")


class DriverSpec(SpecModel):
    """``spec.driver``: the driver pod (Ray head + job driver). It runs the actor's image (``actor.template``)."""

    resources: DriverResources = Field(
        default_factory=DriverResources, description="CPU and memory of the driver pod. The default suits a GPU "
        "node; a small CPU-only node (a laptop's or CI's one-node cluster) needs less: with 2 CPUs the default "
        "alone fills the node and the pod is never scheduled.",
    )


class Toleration(SpecModel):
    """A Kubernetes toleration (the common fields)."""

    key: str | None = Field(default=None, description="Taint key the toleration applies to (null: all).")
    operator: str = Field(default="Equal", pattern=r"^(Equal|Exists)$", description="Equal or Exists.")
    value: str | None = Field(default=None, description="Taint value to match (operator Equal).")
    effect: str | None = Field(
        default=None,
        pattern=r"^(NoSchedule|PreferNoSchedule|NoExecute)$",
        description="Taint effect to match (null: all effects).",
    )


class LocalObjectReference(SpecModel):
    """A reference to an object in the job's namespace by name (e.g. an image pull Secret)."""

    name: str = Field(min_length=1, max_length=253, description="Name of the object.")


class EnvVar(SpecModel):
    """A container environment variable: ``value``, or ``valueFrom`` (Kubernetes EnvVarSource)."""

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Variable name (not ASYNCRL_* or RAY_*: the operator sets those).",
        json_schema_extra=on_field(CelRule(
            " && ".join(f"!self.startsWith('{p}')" for p in RESERVED_ENV_PREFIXES), RESERVED_ENV_MESSAGE
        )),
    )
    value: str | None = Field(
        default=None,
        description="Literal value (exactly one of value and valueFrom). Not for secrets: a literal is stored in "
        "the AsyncRLJob and in the job's spec ConfigMap, which everyone with the view role in the namespace can read; "
        "put tokens and passwords in a Secret and use valueFrom.secretKeyRef.",
    )

    # valueFrom is an object with open fields, but typed (type: object), so CEL can test its presence.
    cel_rules: ClassVar[tuple[CelRule, ...]] = (CelRule("has(self.value) != has(self.valueFrom)", ENV_SOURCE_MESSAGE),)
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="Kubernetes EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef "
        "(exactly one of value and valueFrom).",
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.startswith(RESERVED_ENV_PREFIXES):
            raise ValueError(f"{RESERVED_ENV_MESSAGE} (got {v!r})")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "EnvVar":
        if (self.value is None) == (self.value_from is None):
            raise ValueError(f"{ENV_SOURCE_MESSAGE} (env {self.name!r})")
        return self


class PodOverrides(SpecModel):
    """Per-role pod-template overrides applied on top of what the operator builds."""

    image: str | None = Field(
        default=None, description="Container image of this role (null: the operator's configured job image)."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, max_length=32, description="Secrets the kubelet uses to pull the image ({name})."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Extra environment variables ({name, value} or {name, valueFrom}); ASYNCRL_* and RAY_* "
        "are the operator's.",
    )
    labels: dict[str, str] = Field(
        default_factory=dict, max_length=64,
        description="Extra pod labels (not the operator's: asyncrl.io/*, ray.io/*, app.kubernetes.io/name, "
        "instance, managed-by, part-of, component, scheduling.x-k8s.io/pod-group).",
        json_schema_extra=on_field(CelRule(reserved_label_cel(), RESERVED_LABEL_MESSAGE)),
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, max_length=64,
        description="Extra pod annotations (not the operator's: asyncrl.io/*, kopf.asyncrl.io/*, "
        "scheduling.k8s.io/group-name).",
        json_schema_extra=on_field(CelRule(reserved_annotation_cel(), RESERVED_ANNOTATION_MESSAGE)),
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels this role's pods must match (merged over scheduling's)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Extra tolerations of this role's pods."
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description="Kubernetes Affinity of this role's pods (nodeAffinity, podAffinity, ...)."
    )
    pod_security_level: PodSecurityLevel = Field(
        default=PodSecurityLevel.RESTRICTED,
        description="restricted (default): the pods pass the restricted Pod Security level, and the fields below "
        "may not weaken it. privileged: ask for more (privileged, root, capabilities, hostPath, ...); the operator "
        "honours it only in namespaces the cluster admin lists in the chart value podSecurity.privilegedNamespaces, "
        "elsewhere the job fails validation and nothing is created.",
    )
    pod_security_context: PodSecurityContext | None = Field(
        default=None,
        description="Kubernetes PodSecurityContext fields set over the operator's hardened defaults (runAsNonRoot, "
        "uid/gid 10001, fsGroup, seccomp RuntimeDefault).",
    )
    security_context: SecurityContext | None = Field(
        default=None,
        description="Kubernetes SecurityContext fields of the container set over the operator's hardened defaults "
        "(allowPrivilegeEscalation false, capabilities drop [ALL]).",
    )
    volumes: list[Volume] = Field(
        default_factory=list, max_length=64,
        description="Extra Kubernetes Volumes of this role's pods (not named spec, dshm, checkpoints, status-relay or "
        "status-token).",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=64, description="Where the extra volumes are mounted in the container."
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *cel_rules(),
        CelRule("!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
                "self.volumes.exists(v, v.name == m.name))", MOUNT_NEEDS_VOLUME_MESSAGE, ".volumeMounts"),
    )

    @model_validator(mode="after")
    def _hardened(self) -> "PodOverrides":
        problems = restricted_problems(self.model_dump(mode="json", by_alias=True))
        if bad := sorted(k for k in self.labels if reserved_label(k)):
            problems.append(("labels", f"{RESERVED_LABEL_MESSAGE} (got {bad})"))
        if bad := sorted(k for k in self.annotations if reserved_annotation(k)):
            problems.append(("annotations", f"{RESERVED_ANNOTATION_MESSAGE} (got {bad})"))
        declared = {v.name for v in self.volumes}
        if missing := [m.name for m in self.volume_mounts if m.name not in declared]:
            problems.append(("volumeMounts", f"{MOUNT_NEEDS_VOLUME_MESSAGE} (not declared: {missing}; declared: "
                             f"{sorted(declared) or 'none'})"))
        raise_all(problems)
        return self


class RolloutSpec(SpecModel):
    """``spec.rollout``: the rollout workers (inference engines)."""

    replicas: int = Field(
        default=2, ge=1, le=MAX_ROLLOUT_REPLICAS,
        description=f"Number of rollout workers (pods in a cluster), at most {MAX_ROLLOUT_REPLICAS}.",
    )
    engine: str = Field(
        default="transformers",
        pattern=f"^({'|'.join(ENGINES)})$",
        description="Inference backend: transformers (CPU-friendly, default) or vllm (its own engine process; "
        "on CPU it needs the vLLM environment, `make vllm-env`, float32 rolloutDtype and a head dimension the CPU "
        "attention kernel supports, e.g. 64).",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra arguments of the engine: transformers takes only fp32Head: true|false (final norm "
        "and LM head in float32); vllm takes enforceEager, enablePrefixCaching (booleans), maxNumSeqs, "
        "kvCacheMemoryBytes and cpuThreads (integers >= 0).",
    )
    gpus_per_replica: int = Field(
        default=1, ge=0, le=16, description="GPUs (nvidia.com/gpu) per rollout pod; 0 runs on CPU."
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of a rollout pod.")
    training_side_memory: str = Field(
        default=DEFAULT_TRAINING_SIDE_MEMORY,
        pattern=_QUANTITY,
        description="Extra memory a rollout pod requests to host the training-side model code that scores "
        "partial trajectories during the interrupt-sync window (oldLogits.strategy interruptSync only).",
    )
    template: PodOverrides = Field(default_factory=PodOverrides, description="Pod-template overrides.")

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule("!has(self.gpusPerReplica) || self.gpusPerReplica <= 1", ROLLOUT_GPUS_MESSAGE, ".gpusPerReplica"),
    )

    @model_validator(mode="after")
    def _fits_the_engine(self) -> "RolloutSpec":
        problems = []
        if self.gpus_per_replica > 1:
            problems.append(("gpusPerReplica", f"{ROLLOUT_GPUS_MESSAGE} (got {self.gpus_per_replica})"))
        # engineArgs is free-form in the CRD (each engine takes its own flags), so only the model checks it.
        if self.engine == "transformers":
            bad = {k: v for k, v in self.engine_args.items()
                   if k not in TRANSFORMERS_ENGINE_ARGS or type(v) is not TRANSFORMERS_ENGINE_ARGS[k]}
            if bad:
                problems.append(("engineArgs", f"the transformers engine takes only fp32Head: true|false; got {bad}"))
        else:
            bad = {k: v for k, v in self.engine_args.items()
                   if k not in VLLM_ENGINE_ARGS or type(v) is not VLLM_ENGINE_ARGS[k]
                   or (type(v) is int and v < 0)}
            if bad:
                takes = ", ".join(f"{k} ({t.__name__})" for k, t in VLLM_ENGINE_ARGS.items())
                problems.append(("engineArgs", f"the vllm engine takes {takes}, integers >= 0; got {bad}"))
        if problems:
            raise RuleError(problems)
        return self


def actor_layout_problems(replicas: int, gpus: int, tp: int, pp: int, ep: int) -> list[tuple[str, str]]:
    """What cannot work in an actor layout: ``(path below spec.actor, message)`` for every problem.

    ``replicas x max(gpus, 1)`` ranks (one per GPU; a CPU pod runs one rank): TP must divide ``gpus`` on a
    GPU pod, ``TP x EP`` the ranks; PP > 1 and EP > 1 on CPU are refused with the reason.
    """
    world = replicas * max(gpus, 1)
    out: list[tuple[str, str]] = []
    if pp > 1:
        out.append(("megatron.pipelineParallel", f"{PIPELINE_PARALLEL_MESSAGE} (got {pp})"))
    if ep > 1 and gpus == 0:
        out.append(("megatron.expertParallel", f"{EXPERT_PARALLEL_CPU_MESSAGE} (got {ep} with gpusPerReplica 0)"))
    if gpus > 0 and gpus % tp:
        out.append(("megatron.tensorParallel", f"{TP_DIVIDES_GPUS_MESSAGE} (got tensorParallel {tp} with "
                                               f"gpusPerReplica {gpus})"))
    elif world % (tp * ep):
        out.append(("megatron.tensorParallel", f"{MP_DIVIDES_WORLD_MESSAGE} (got tensorParallel {tp} x "
                                               f"expertParallel {ep} = {tp * ep} with {replicas} x "
                                               f"{max(gpus, 1)} = {world} ranks)"))
    return out


class MegatronSpec(SpecModel):
    """Megatron model parallelism of the actor; data parallelism is what remains."""

    tensor_parallel: int = Field(
        default=1, ge=1, le=64,
        description="Tensor-model-parallel size: divides gpusPerReplica on GPU pods (the actor's ranks on CPU) "
        "and the model's heads, KV heads and vocabulary.",
    )
    pipeline_parallel: int = Field(
        default=1, ge=1, le=64, description="Pipeline-model-parallel size: 1 (see the refusal's reason).",
        json_schema_extra=on_field(CelRule("self <= 1", PIPELINE_PARALLEL_MESSAGE)),
    )
    expert_parallel: int = Field(
        default=1, ge=1, le=64,
        description="Expert-model-parallel size of a MoE model (GPU actor pods only; 1 on CPU).",
    )
    precision: Literal["auto", "bf16", "fp32"] = Field(
        default="auto", description="Parameter dtype of the actor: bf16 = bf16 params with fp32 main params "
        "in megatron's optimizer; auto = bf16 on a GPU, fp32 on the CPU.",
    )
    distributed_optimizer: bool | None = Field(
        default=None, description="Megatron's DistributedOptimizer (fp32 main params and Adam state sharded "
        "over the data-parallel ranks). Unset: on for a GPU actor, off on the CPU (a torch AdamW; true runs "
        "megatron's optimizer on the CPU too).",
    )


_TP = "(has(self.megatron) && has(self.megatron.tensorParallel) ? self.megatron.tensorParallel : 1)"
_EP = "(has(self.megatron) && has(self.megatron.expertParallel) ? self.megatron.expertParallel : 1)"
_GPUS = "(has(self.gpusPerReplica) ? self.gpusPerReplica : 1)"
_REPLICAS = "(has(self.replicas) ? self.replicas : 1)"


class ActorSpec(SpecModel):
    """``spec.actor``: the trainer (Megatron actor): ``replicas x max(gpusPerReplica, 1)`` ranks."""

    replicas: int = Field(
        default=1, ge=1, le=MAX_ACTOR_REPLICAS, description="Actor pods (nodes); data parallelism is what the "
        "ranks leave over tensor parallelism.",
    )
    gpus_per_replica: int = Field(
        default=1, ge=0, le=16, description="GPUs per actor pod, one rank each; 0 = a CPU pod running one rank.",
    )
    megatron: MegatronSpec = Field(default_factory=MegatronSpec, description="Model parallelism.")
    weight_sync: WeightSyncSpec = Field(default_factory=WeightSyncSpec, description="How each new version's "
                                        "weights reach rollout: transport and bucket size.")
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of an actor pod.")
    template: PodOverrides = Field(default_factory=PodOverrides, description="Pod-template overrides.")

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(f"{_EP} <= 1 || {_GPUS} > 0", EXPERT_PARALLEL_CPU_MESSAGE, ".megatron.expertParallel"),
        CelRule(f"{_GPUS} == 0 || {_GPUS} % {_TP} == 0", TP_DIVIDES_GPUS_MESSAGE, ".megatron.tensorParallel"),
        CelRule(f"({_GPUS} > 0 && {_GPUS} % {_TP} != 0) || "
                f"({_REPLICAS} * ({_GPUS} > 0 ? {_GPUS} : 1)) % ({_TP} * {_EP}) == 0",
                MP_DIVIDES_WORLD_MESSAGE, ".megatron.tensorParallel"),
    )

    @model_validator(mode="after")
    def _layout_can_work(self) -> "ActorSpec":
        m = self.megatron
        raise_all(actor_layout_problems(self.replicas, self.gpus_per_replica, m.tensor_parallel,
                                        m.pipeline_parallel, m.expert_parallel))
        return self

    @property
    def world_size(self) -> int:
        """Actor ranks: one per GPU, one per pod on CPU."""
        return self.replicas * max(self.gpus_per_replica, 1)

    @property
    def data_parallel(self) -> int:
        """Data-parallel size: the world size divided by the model-parallel size."""
        return self.world_size // (self.megatron.tensor_parallel * self.megatron.pipeline_parallel)


_YEAR = 365 * 24 * 3600  # the longest time limit a job may state, in seconds


class RunPolicySpec(SpecModel):
    """``spec.runPolicy``: failure, time limits and suspension of the whole job."""

    backoff_limit: int = Field(
        default=3,
        ge=0,
        le=1000,
        description="Restarts from checkpoint allowed before the job is Failed (a lost driver or actor "
        "pod); preemptions (the pod's DisruptionTarget condition) count against preemptionLimit instead.",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, le=_YEAR, description="Fail the job this long after it started (or resumed); null: no limit."
    )
    pre_running_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=_YEAR,
        description="Fail the job when its pods are not all running this long after they were created "
        "(image pulls, scheduling); null: no limit.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=_YEAR, description="Delete the finished job (and its children) this long after it ended."
    )
    preemption_limit: int = Field(
        default=10,
        ge=0,
        le=10_000,
        description="Gang restarts caused by preemption allowed before the job fails; they do not count "
        "against backoffLimit.",
    )
    suspend: bool = Field(
        default=False,
        description="true deletes the job's pods and keeps its checkpoint; false resumes from it.",
    )
    termination_grace_period_seconds: int = Field(
        default=300,
        ge=10,
        le=3600,
        description="Seconds a pod has between SIGTERM (preemption, drain, suspend) and the kill; the operator "
        "sets it as the pods' terminationGracePeriodSeconds. The driver uses it to finish the step in progress "
        "and write a final checkpoint, then exits 0 and the job resumes there: make it longer than one step "
        "plus one checkpoint write (the default fits a few-GB checkpoint on a network volume; Kubernetes' own "
        "default of 30 s does not).",
    )


class GangScheduler(StrEnum):
    """Who schedules the job's pods all-or-nothing (the operator creates that scheduler's PodGroup)."""

    NONE = "none"
    VOLCANO = "volcano"
    COSCHEDULING = "coscheduling"


class SchedulingSpec(SpecModel):
    """``spec.scheduling``: placement of the job's pods."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels every pod must match.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations of every pod.")
    priority_class_name: str | None = Field(default=None, description="PriorityClass of every pod.")
    scheduler_name: str | None = Field(
        default=None, description="Scheduler of every pod (e.g. volcano for gang scheduling)."
    )
    gang_scheduler: GangScheduler = Field(
        default=GangScheduler.NONE,
        description="Gang scheduling of all the job's pods: none, volcano (a Volcano PodGroup) or "
        "coscheduling (the scheduler-plugins PodGroup); minMember is every pod of the job.",
    )


class MaskGuardAction(StrEnum):
    """What the operator does when the reported keep ratio falls below ``criticalKeepRatio``."""

    ALERT = "Alert"
    SUSPEND = "Suspend"
    FAIL = "Fail"


MASK_GUARD_ORDER_MESSAGE = (
    "criticalKeepRatio must not exceed warnKeepRatio (e.g. warnKeepRatio: 0.9, criticalKeepRatio: 0.7)"
)


class MaskGuardSpec(SpecModel):
    """Turns a reported train–inference mask collapse into a condition, an event and an action."""

    enabled: bool = Field(default=True, description="Whether the guard acts on the reported keep ratio.")
    warn_keep_ratio: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Below this keep ratio: Degraded (MaskDegrading) and an event."
    )
    critical_keep_ratio: float = Field(
        default=0.7, gt=0.0, le=1.0, description="Below this keep ratio: Degraded (MaskCollapse) and the action."
    )
    action: MaskGuardAction = Field(
        default=MaskGuardAction.ALERT,
        description="On collapse: Alert (condition and event only), Suspend (set runPolicy.suspend), Fail.",
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.warnKeepRatio) || !has(self.criticalKeepRatio) || "
            "self.criticalKeepRatio <= self.warnKeepRatio",
            MASK_GUARD_ORDER_MESSAGE,
        ),
    )

    @model_validator(mode="after")
    def _ordered(self) -> "MaskGuardSpec":
        if self.critical_keep_ratio > self.warn_keep_ratio:
            raise ValueError(
                f"{MASK_GUARD_ORDER_MESSAGE}; got criticalKeepRatio {self.critical_keep_ratio} and warnKeepRatio "
                f"{self.warn_keep_ratio}"
            )
        return self


class MonitoringSpec(SpecModel):
    """``spec.monitoring``: the job's Prometheus exporter and the mask guard."""

    enabled: bool = Field(default=True, description="Serve Prometheus metrics from the driver.")
    port: int = Field(default=9400, ge=1, le=65535, description="Port of the /metrics endpoint.")
    mask_guard: MaskGuardSpec = Field(
        default_factory=MaskGuardSpec, description="Reaction to a reported mask collapse (keep ratio)."
    )
