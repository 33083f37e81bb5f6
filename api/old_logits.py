"""``spec.oldLogits``: how the exact training-side old log-probs ``pi_old`` are recovered.

Used when ``correction.reference`` is ``exact`` (paper §5.1, ARCHITECTURE §1).
"""

from enum import StrEnum
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, at_defaults_cel, changed_from_defaults, on_field, raise_all


class OldLogitStrategy(StrEnum):
    """The three exact routes of paper §5.1 (the driver runs :data:`RUNNABLE_STRATEGIES` today)."""

    SNAPSHOT = "snapshot"
    DEDICATED = "dedicated"
    INTERRUPT_SYNC = "interruptSync"


RUNNABLE_STRATEGIES = (OldLogitStrategy.SNAPSHOT,)
STRATEGY_MESSAGE = (
    "is not implemented by the driver yet; use oldLogits.strategy: snapshot (exact old logits from kept "
    "weight versions), or correction.reference: ewma"
)
SNAPSHOT_DEVICE_MESSAGE = (
    "oldLogits.snapshot.device 'disk' is not implemented yet: snapshots are kept in host memory; use device: cpu"
)
SNAPSHOT_UNUSED_MESSAGE = (
    "oldLogits.snapshot is only used with oldLogits.strategy: snapshot; remove it or set the strategy"
)
DEDICATED_UNUSED_MESSAGE = (
    "oldLogits.dedicated configures strategy dedicated, which the driver does not run yet; remove it"
)
INTERRUPT_SYNC_UNUSED_MESSAGE = (
    "oldLogits.interruptSync configures strategy interruptSync, which the driver does not run yet; remove it"
)


class SnapshotSpec(SpecModel):
    """Keep the weights of every version an in-flight token still references."""

    max_versions: int = Field(
        default=0,
        ge=0,
        description="Most weight snapshots kept in host memory; 0 = async.maxStaleness + 1, the most "
        "any admitted token can need.",
    )
    device: str = Field(
        default="cpu",
        pattern=r"^(cpu|disk)$",
        description="Where snapshots live: cpu (host memory); disk is refused until it is implemented.",
        json_schema_extra=on_field(CelRule("self == 'cpu'", SNAPSHOT_DEVICE_MESSAGE)),
    )

    @field_validator("device")
    @classmethod
    def _host_memory_only(cls, v: str) -> str:
        if v != "cpu":
            raise ValueError(SNAPSHOT_DEVICE_MESSAGE)
        return v


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
        description="Required when correction.reference is exact: snapshot (dedicated and interruptSync are "
        "refused until the driver runs them).",
        json_schema_extra=on_field(CelRule(
            " || ".join(f"self == '{s.value}'" for s in RUNNABLE_STRATEGIES), f"this oldLogits.strategy {STRATEGY_MESSAGE}"
        )),
    )
    snapshot: SnapshotSpec = Field(default_factory=SnapshotSpec, description="Knobs of the snapshot strategy.")
    dedicated: DedicatedSpec = Field(default_factory=DedicatedSpec, description="Knobs of the dedicated strategy.")
    interrupt_sync: InterruptSyncSpec = Field(
        default_factory=InterruptSyncSpec, description="Knobs of the interruptSync strategy."
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.snapshot) || (has(self.strategy) && self.strategy == 'snapshot') || "
            f"({at_defaults_cel(SnapshotSpec, 'self.snapshot')})",
            SNAPSHOT_UNUSED_MESSAGE,
            ".snapshot",
        ),
        CelRule(
            f"!has(self.dedicated) || ({at_defaults_cel(DedicatedSpec, 'self.dedicated')})",
            DEDICATED_UNUSED_MESSAGE,
            ".dedicated",
        ),
        CelRule(
            f"!has(self.interruptSync) || ({at_defaults_cel(InterruptSyncSpec, 'self.interruptSync')})",
            INTERRUPT_SYNC_UNUSED_MESSAGE,
            ".interruptSync",
        ),
    )

    @field_validator("strategy")
    @classmethod
    def _runnable(cls, v: OldLogitStrategy | None) -> OldLogitStrategy | None:
        if v is not None and v not in RUNNABLE_STRATEGIES:
            raise ValueError(f"oldLogits.strategy '{v.value}' {STRATEGY_MESSAGE}")
        return v

    @model_validator(mode="after")
    def _no_ignored_knobs(self) -> "OldLogitsSpec":
        problems: list[tuple[str, str]] = []
        changed = changed_from_defaults(self.snapshot)
        if changed and self.strategy is not OldLogitStrategy.SNAPSHOT:
            problems.append(("snapshot", f"{SNAPSHOT_UNUSED_MESSAGE} (set here: {', '.join(changed)})"))
        for key, section, message in (
            ("dedicated", self.dedicated, DEDICATED_UNUSED_MESSAGE),
            ("interruptSync", self.interrupt_sync, INTERRUPT_SYNC_UNUSED_MESSAGE),
        ):
            changed = changed_from_defaults(section)
            if changed:
                problems.append((key, f"{message} (set here: {', '.join(changed)})"))
        raise_all(problems)
        return self
