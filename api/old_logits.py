"""``spec.oldLogits``: how the exact training-side old log-probs ``pi_old`` are recovered.

Used when ``correction.reference`` is ``exact`` (paper §5.1, docs/architecture.md, notation). Every strategy runs;
what validation refuses is a knob of a section the chosen strategy does not use (it would be
accepted and then ignored), with the same words from the model and the CRD's CEL rule.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from pydantic import BaseModel, Field, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, at_defaults_cel, changed_from_defaults, raise_all
from asyncrl.api.model_arch import ModelArch, parallel_problems
from asyncrl.api.pods import ActorSpec


class OldLogitStrategy(StrEnum):
    """The three exact routes of paper §5.1."""

    SNAPSHOT = "snapshot"
    DEDICATED = "dedicated"
    INTERRUPT_SYNC = "interruptSync"


RUNNABLE_STRATEGIES = tuple(OldLogitStrategy)  # the driver runs every strategy


class SnapshotDevice(StrEnum):
    """Where the weight snapshots of the snapshot strategy live."""

    CPU = "cpu"
    DISK = "disk"


def unused_message(section: str, strategy: OldLogitStrategy) -> str:
    """The refusal of a knob of ``oldLogits.<section>`` while the strategy is not ``strategy``."""
    return (
        f"oldLogits.{section} is only used with oldLogits.strategy: {strategy.value}; remove it or set "
        f"the strategy to {strategy.value}"
    )


SNAPSHOT_UNUSED_MESSAGE = unused_message("snapshot", OldLogitStrategy.SNAPSHOT)
DEDICATED_UNUSED_MESSAGE = unused_message("dedicated", OldLogitStrategy.DEDICATED)
INTERRUPT_SYNC_UNUSED_MESSAGE = unused_message("interruptSync", OldLogitStrategy.INTERRUPT_SYNC)


class SnapshotSpec(SpecModel):
    """Keep the weights of every version a not-yet-trained token still references."""

    max_versions: int = Field(
        default=0,
        ge=0,
        le=65,  # W+1 for the largest W (async.maxStaleness <= 64): more snapshots are never needed
        description="Hard cap on the weight snapshots kept. 0 = auto: async.maxStaleness + 1 (W+1), the most "
        "the staleness window W admits. Otherwise at least W+1 (validation refuses less); when the cap is "
        "reached the oldest trajectories holding the oldest version are dropped and counted.",
    )
    device: SnapshotDevice = Field(
        default=SnapshotDevice.CPU,
        description="Where snapshots live: cpu = host memory; disk = safetensors files under the run "
        "directory (<run dir>/snapshots/), loaded for each scoring (less host memory, more time).",
    )


class DedicatedSpec(SpecModel):
    """A separate old-logit model that follows the versions and scores trajectories as they arrive."""

    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Old-logit scorers (pods in a cluster): each receives every weight version; trajectory "
        "segments are spread over them.",
    )
    max_lag_versions: int = Field(
        default=1,
        ge=0,
        le=64,
        description="How many versions the scorers may trail the actor before the driver waits for them "
        "(the wait is counted).",
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Tensor-parallel size of one scorer: a scorer is a gang of this many ranks (one per GPU, "
        "processes on a CPU pod) that load their shards of each version and score together. Omitted = "
        "actor.megatron.tensorParallel. Divides the scorer's GPUs per pod and the model's heads, KV heads "
        "and vocabulary.",
    )
    gpus_per_replica: int | None = Field(
        default=None,
        ge=0,
        le=16,
        description="GPUs of one scorer pod (one rank per GPU, tensorParallel of them used). Omitted = "
        "tensorParallel when the actor has GPUs (a gang uses exactly its TP GPUs: no GPU idles), else 0; 0 = a "
        "CPU pod running tensorParallel rank processes.",
    )

    def layout_for(self, actor: ActorSpec) -> "ScorerLayout":
        """The scorer's layout in force: the fields set here; where omitted, the actor's TP and, on GPUs, one
        GPU per scorer rank (a scorer has no data parallelism, so more GPUs than its TP would idle)."""
        tp = self.tensor_parallel if self.tensor_parallel is not None else actor.megatron.tensor_parallel
        if self.gpus_per_replica is not None:
            gpus = self.gpus_per_replica
        else:
            gpus = tp if actor.gpus_per_replica > 0 else 0
        return ScorerLayout(tensor_parallel=tp, gpus_per_replica=gpus)


SCORER_TP_DIVIDES_GPUS_MESSAGE = (
    "oldLogits.dedicated.tensorParallel must divide the scorer's GPUs per pod (oldLogits.dedicated.gpusPerReplica, "
    "omitted = tensorParallel on GPUs; a scorer's ranks stay inside its pod, one per GPU); set tensorParallel to a "
    "divisor of the GPUs or set gpusPerReplica to tensorParallel"
)
SCORER_TP_FIX = "set spec.oldLogits.dedicated.tensorParallel to a common divisor"


@dataclass(frozen=True)
class ScorerLayout:
    """One dedicated scorer's layout in force (:meth:`DedicatedSpec.layout_for`): ``tensor_parallel`` ranks,
    a pod of ``gpus_per_replica`` GPUs (0 = CPU)."""

    tensor_parallel: int
    gpus_per_replica: int

    @property
    def world_size(self) -> int:
        """Ranks of one scorer gang (pipeline and data parallelism are 1 inside a scorer)."""
        return self.tensor_parallel


def scorer_layout_problems(layout: ScorerLayout, arch: ModelArch | None) -> list[tuple[str, str]]:
    """What cannot work in a scorer layout: ``(path below spec, message)`` for every problem (GPUs per pod
    not a multiple of TP; heads, KV heads or vocabulary not divisible by TP, as for the actor)."""
    tp, gpus = layout.tensor_parallel, layout.gpus_per_replica
    out: list[tuple[str, str]] = []
    if gpus > 0 and gpus % tp:
        out.append(("oldLogits.dedicated.tensorParallel",
                    f"{SCORER_TP_DIVIDES_GPUS_MESSAGE} (got tensorParallel {tp} with {gpus} GPUs per scorer pod)"))
    if arch is not None and tp > 1:
        out += [("oldLogits.dedicated.tensorParallel", f"{p} (spec.model)")
                for p in parallel_problems(arch, tp, fix=SCORER_TP_FIX)]
    return out


class InterruptSyncSpec(SpecModel):
    """Before each update v -> v+1: interrupt rollouts, score partial trajectories with version v on
    the rollout workers' own resources, then take the weight sync and resume generation."""

    phase_timeout_seconds: int = Field(
        default=300,
        ge=1,
        le=86_400,
        description="A sync phase (interrupt, score, update, resume) running longer than this sets the job's "
        "SyncStuck condition with a Warning event (operator).",
    )
    release_rollout_resources: bool = Field(
        default=True,
        description="Release the rollout engine's memory while the training-side model scores (needed "
        "when both do not fit at once).",
    )


# (camelCase section key, python attribute, its strategy, message), in one place for the model and the CEL.
_SECTIONS: tuple[tuple[str, str, OldLogitStrategy, str, type[BaseModel]], ...] = (
    ("snapshot", "snapshot", OldLogitStrategy.SNAPSHOT, SNAPSHOT_UNUSED_MESSAGE, SnapshotSpec),
    ("dedicated", "dedicated", OldLogitStrategy.DEDICATED, DEDICATED_UNUSED_MESSAGE, DedicatedSpec),
    ("interruptSync", "interrupt_sync", OldLogitStrategy.INTERRUPT_SYNC, INTERRUPT_SYNC_UNUSED_MESSAGE,
     InterruptSyncSpec),
)


class OldLogitsSpec(SpecModel):
    """``spec.oldLogits``: the exact old-logit strategy and its knobs."""

    strategy: OldLogitStrategy | None = Field(
        default=None,
        description="Required when correction.reference is exact: snapshot (keep the weights of every "
        "version in flight and score under them), dedicated (separate scorer models follow the versions "
        "and score as trajectories arrive), interruptSync (before each update the rollout workers score "
        "their partial trajectories with the training-side model).",
    )
    snapshot: SnapshotSpec = Field(default_factory=SnapshotSpec, description="Knobs of the snapshot strategy.")
    dedicated: DedicatedSpec = Field(default_factory=DedicatedSpec, description="Knobs of the dedicated strategy.")
    interrupt_sync: InterruptSyncSpec = Field(
        default_factory=InterruptSyncSpec, description="Knobs of the interruptSync strategy."
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = tuple(
        CelRule(
            f"!has(self.{key}) || (has(self.strategy) && self.strategy == '{strategy.value}') || "
            f"({at_defaults_cel(model, f'self.{key}')})",
            message,
            f".{key}",
        )
        for key, _, strategy, message, model in _SECTIONS
    )

    @model_validator(mode="after")
    def _no_ignored_knobs(self) -> "OldLogitsSpec":
        problems: list[tuple[str, str]] = []
        for key, attr, strategy, message, _ in _SECTIONS:
            changed = changed_from_defaults(getattr(self, attr))
            if changed and self.strategy is not strategy:
                problems.append((key, f"{message} (set here: {', '.join(changed)})"))
        raise_all(problems)
        return self
