"""``spec.oldLogits``: how the exact training-side old log-probs ``pi_old`` are recovered.

Used when ``correction.reference`` is ``exact`` (paper §5.1, ARCHITECTURE §1).
"""

from enum import StrEnum

from pydantic import Field

from asyncrl.api.base import SpecModel


class OldLogitStrategy(StrEnum):
    """The three exact routes of paper §5.1."""

    SNAPSHOT = "snapshot"
    DEDICATED = "dedicated"
    INTERRUPT_SYNC = "interruptSync"


class SnapshotSpec(SpecModel):
    """Keep the weights of every version an in-flight token still references."""

    max_versions: int = Field(
        default=0,
        ge=0,
        description="Most weight snapshots kept in host memory; 0 = async.maxStaleness + 1, the most "
        "any admitted token can need.",
    )
    device: str = Field(
        default="cpu", pattern=r"^(cpu|disk)$", description="Where snapshots live: cpu (host memory) or disk."
    )


class DedicatedSpec(SpecModel):
    """A separate old-logit model that follows the versions and scores trajectories as they arrive."""

    replicas: int = Field(default=1, ge=1, description="Old-logit model replicas (pods in a cluster).")
    max_lag_versions: int = Field(
        default=1,
        ge=0,
        description="How many versions the old-logit model may trail the actor before the driver waits for it.",
    )


class InterruptSyncSpec(SpecModel):
    """Before each update v -> v+1: interrupt rollouts, score partial trajectories with version v on
    the rollout workers' own resources, then resume generation."""

    phase_timeout_seconds: int = Field(
        default=300,
        ge=1,
        description="A sync phase (interrupt, score, resume) running longer than this is reported as stuck.",
    )
    release_rollout_resources: bool = Field(
        default=True,
        description="Release the rollout engine's memory while the training-side model scores (needed "
        "when both do not fit at once).",
    )


class OldLogitsSpec(SpecModel):
    """``spec.oldLogits``: the exact old-logit strategy and its knobs."""

    strategy: OldLogitStrategy | None = Field(
        default=None,
        description="snapshot, dedicated or interruptSync; required when correction.reference is exact.",
    )
    snapshot: SnapshotSpec = Field(default_factory=SnapshotSpec, description="Knobs of the snapshot strategy.")
    dedicated: DedicatedSpec = Field(default_factory=DedicatedSpec, description="Knobs of the dedicated strategy.")
    interrupt_sync: InterruptSyncSpec = Field(
        default_factory=InterruptSyncSpec, description="Knobs of the interruptSync strategy."
    )
