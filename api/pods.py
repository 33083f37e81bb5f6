"""Pod-level sections of the spec: where the job's processes run and how they are watched.

These start minimal and grow with the operator (``rollout``, ``actor``, ``runPolicy``,
``scheduling``, ``monitoring``).
"""

from typing import Any

from pydantic import Field

from asyncrl.api.base import SpecModel


class RolloutSpec(SpecModel):
    """``spec.rollout``: the rollout workers (inference engines)."""

    replicas: int = Field(default=2, ge=1, description="Number of rollout workers (pods in a cluster).")
    engine: str = Field(
        default="transformers",
        pattern=r"^(transformers|vllm)$",
        description="Inference backend: transformers (CPU-friendly, default) or vllm.",
    )
    engine_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments passed to the engine unchanged."
    )


class ActorSpec(SpecModel):
    """``spec.actor``: the trainer (Megatron actor)."""

    replicas: int = Field(default=1, ge=1, description="Actor processes (data-parallel x model-parallel).")


class RunPolicySpec(SpecModel):
    """``spec.runPolicy``: failure and time limits of the whole job."""

    backoff_limit: int = Field(
        default=3, ge=0, description="Restarts from checkpoint allowed before the job is Failed."
    )


class SchedulingSpec(SpecModel):
    """``spec.scheduling``: placement of the job's pods."""

    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels every pod must match.")


class MonitoringSpec(SpecModel):
    """``spec.monitoring``: the job's Prometheus exporter."""

    enabled: bool = Field(default=True, description="Serve Prometheus metrics from the driver.")
    port: int = Field(default=9400, ge=1, le=65535, description="Port of the /metrics endpoint.")
