"""Pod-level sections of the spec: where the job's processes run and how they are watched.

The operator (``asyncrl.operator``) turns these into pods; ``asyncrl run`` (local) ignores the
placement fields. Quantities (``cpu``, ``memory``) are Kubernetes quantity strings.
"""

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field, model_validator

from asyncrl.api.base import SpecModel

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"


class Resources(SpecModel):
    """CPU and memory requests of one pod (limits equal requests for memory)."""

    cpu: str = Field(default="4", pattern=_QUANTITY, description="CPU request, e.g. '4' or '500m'.")
    memory: str = Field(default="32Gi", pattern=_QUANTITY, description="Memory request and limit, e.g. '32Gi'.")


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


class PodOverrides(SpecModel):
    """Per-role pod-template overrides applied on top of what the operator builds."""

    image: str | None = Field(
        default=None, description="Container image of this role (null: the operator's configured job image)."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables (name: value).")
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Extra pod annotations.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels this role's pods must match (merged over scheduling's)."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="Extra tolerations of this role's pods."
    )


class RolloutSpec(SpecModel):
    """``spec.rollout``: the rollout workers (inference engines)."""

    replicas: int = Field(default=2, ge=1, description="Number of rollout workers (pods in a cluster).")
    engine: str = Field(
        default="transformers",
        pattern=r"^(transformers|vllm)$",
        description="Inference backend: transformers (CPU-friendly, default) or vllm.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments passed to the engine unchanged (vllm: --key value).",
    )
    gpus_per_replica: int = Field(
        default=1, ge=0, le=16, description="GPUs (nvidia.com/gpu) per rollout pod; 0 runs on CPU."
    )
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of a rollout pod.")
    training_side_memory: str = Field(
        default="16Gi",
        pattern=_QUANTITY,
        description="Extra memory a rollout pod requests to host the training-side model code when "
        "oldLogits.strategy is interruptSync (added to resources.memory).",
    )
    template: PodOverrides = Field(default_factory=PodOverrides, description="Pod-template overrides.")


class MegatronSpec(SpecModel):
    """Megatron model parallelism of the actor; data parallelism is what remains."""

    tensor_parallel: int = Field(default=1, ge=1, le=64, description="Tensor-model-parallel size.")
    pipeline_parallel: int = Field(default=1, ge=1, le=64, description="Pipeline-model-parallel size.")


class ActorSpec(SpecModel):
    """``spec.actor``: the trainer (Megatron actor)."""

    replicas: int = Field(
        default=1, ge=1, description="Actor pods (nodes); each runs one process per GPU (one on CPU)."
    )
    gpus_per_replica: int = Field(default=1, ge=0, le=16, description="GPUs per actor pod; 0 runs on CPU.")
    megatron: MegatronSpec = Field(default_factory=MegatronSpec, description="Model parallelism.")
    resources: Resources = Field(default_factory=Resources, description="CPU and memory of an actor pod.")
    template: PodOverrides = Field(default_factory=PodOverrides, description="Pod-template overrides.")

    cel_rules: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "!has(self.megatron) || ((has(self.replicas) ? self.replicas : 1) * "
            "((has(self.gpusPerReplica) ? self.gpusPerReplica : 1) > 0 ? "
            "(has(self.gpusPerReplica) ? self.gpusPerReplica : 1) : 1)) % "
            "((has(self.megatron.tensorParallel) ? self.megatron.tensorParallel : 1) * "
            "(has(self.megatron.pipelineParallel) ? self.megatron.pipelineParallel : 1)) == 0",
            "actor world size (replicas x gpusPerReplica) must be a multiple of "
            "megatron.tensorParallel x megatron.pipelineParallel",
        ),
    )

    @property
    def world_size(self) -> int:
        """Actor processes: one per GPU, one per pod on CPU."""
        return self.replicas * max(self.gpus_per_replica, 1)

    @property
    def data_parallel(self) -> int:
        """Data-parallel size: the world size divided by the model-parallel size."""
        return self.world_size // (self.megatron.tensor_parallel * self.megatron.pipeline_parallel)

    @model_validator(mode="after")
    def _parallelism_divides(self) -> "ActorSpec":
        mp = self.megatron.tensor_parallel * self.megatron.pipeline_parallel
        if self.world_size % mp != 0:
            raise ValueError(
                f"actor world size replicas x gpusPerReplica = {self.world_size} is not a multiple of "
                f"megatron.tensorParallel x megatron.pipelineParallel = {mp}; change replicas, "
                "gpusPerReplica or the parallel sizes"
            )
        return self


class RunPolicySpec(SpecModel):
    """``spec.runPolicy``: failure, time limits and suspension of the whole job."""

    backoff_limit: int = Field(
        default=3,
        ge=0,
        description="Restarts from checkpoint allowed before the job is Failed (a lost driver or actor "
        "pod); preemptions (the pod's DisruptionTarget condition) are not counted.",
    )
    active_deadline_seconds: int | None = Field(
        default=None, ge=1, description="Fail the job this long after it started (or resumed); null: no limit."
    )
    pre_running_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Fail the job when its pods are not all running this long after they were created "
        "(image pulls, scheduling); null: no limit.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Delete the finished job (and its children) this long after it ended."
    )
    suspend: bool = Field(
        default=False,
        description="true deletes the job's pods and keeps its checkpoint; false resumes from it.",
    )


class SchedulingSpec(SpecModel):
    """``spec.scheduling``: placement of the job's pods."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels every pod must match.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Tolerations of every pod.")
    priority_class_name: str | None = Field(default=None, description="PriorityClass of every pod.")
    scheduler_name: str | None = Field(
        default=None, description="Scheduler of every pod (e.g. volcano for gang scheduling)."
    )


class MaskGuardAction(StrEnum):
    """What the operator does when the reported keep ratio falls below ``criticalKeepRatio``."""

    ALERT = "Alert"
    SUSPEND = "Suspend"
    FAIL = "Fail"


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

    cel_rules: ClassVar[tuple[tuple[str, str], ...]] = (
        (
            "!has(self.warnKeepRatio) || !has(self.criticalKeepRatio) || "
            "self.criticalKeepRatio <= self.warnKeepRatio",
            "criticalKeepRatio must not exceed warnKeepRatio",
        ),
    )

    @model_validator(mode="after")
    def _ordered(self) -> "MaskGuardSpec":
        if self.critical_keep_ratio > self.warn_keep_ratio:
            raise ValueError(
                f"criticalKeepRatio ({self.critical_keep_ratio}) must not exceed warnKeepRatio "
                f"({self.warn_keep_ratio}); e.g. warnKeepRatio: 0.9, criticalKeepRatio: 0.7"
            )
        return self


class MonitoringSpec(SpecModel):
    """``spec.monitoring``: the job's Prometheus exporter and the mask guard."""

    enabled: bool = Field(default=True, description="Serve Prometheus metrics from the driver.")
    port: int = Field(default=9400, ge=1, le=65535, description="Port of the /metrics endpoint.")
    mask_guard: MaskGuardSpec = Field(
        default_factory=MaskGuardSpec, description="Reaction to a reported mask collapse (keep ratio)."
    )
