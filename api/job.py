"""The AsyncRLJob resource: ``spec`` sections and the top-level object.

Defaults live only in the section models; derived values are properties. ``spec.model`` has a module of
its own (:mod:`asyncrl.api.model`), below the architecture table that reads it and that this module uses.
"""

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, RuleError, on_field, raise_all
from asyncrl.api.constants import (
    API_VERSION,
    CHECKPOINT_MOUNT,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
)
from asyncrl.api.correction import CorrectionSpec, ReferencePolicy
from asyncrl.api.evaluation import EvalSpec
from asyncrl.api.lora import lora_problems
from asyncrl.api.metadata import ObjectMeta
from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import known_arch, parallel_problems
from asyncrl.api.old_logits import (
    SCORER_TP_DIVIDES_GPUS_MESSAGE,
    OldLogitsSpec,
    OldLogitStrategy,
    scorer_layout_problems,
)
from asyncrl.api.old_logits_route import OldLogitsRoute, old_logits_route
from asyncrl.api.paths import CHECKPOINT_DIR_RULE, MAX_PATH_LENGTH, checkpoint_dir_problem
from asyncrl.api.pods import (
    DEFAULT_TRAINING_SIDE_MEMORY,
    ActorSpec,
    DriverSpec,
    MonitoringSpec,
    RolloutSpec,
    RunPolicySpec,
    SchedulingSpec,
)
from asyncrl.api.routing_replay import routing_replay_problems, visible_arch
from asyncrl.api.task import TaskSpec

MAX_SEED = 2**32 - 1  # numpy's generators take seeds below 2^32


class AsyncSpec(SpecModel):
    """``spec.async``: how far rollout may run ahead of training."""

    max_staleness: int = Field(
        default=2,
        ge=0,
        le=64,
        description="W: the largest version gap (actor version - token version) a token may have when it "
        "reaches the actor; older data is dropped and counted. 0 = synchronous training.",
    )
    partial_rollout: bool = Field(
        default=True,
        description="On a weight update, interrupt in-flight trajectories and continue them under the new "
        "version (prefix keeps its versions and mu); false lets them finish under the old version.",
    )


class TrainSpec(SpecModel):
    """``spec.train``: optimisation of the actor.

    A *policy version* is what rollout receives: the actor makes one version per consumed rollout batch,
    after all of that batch's optimizer updates (``epochs x minibatches`` of them, each accumulating the
    gradient of its micro-batches). ``steps`` counts versions, and so does ``async.maxStaleness``: a token
    sampled by version ``v`` and trained while the actor is at ``v + n`` has gap ``n``, however many
    optimizer updates those ``n`` versions took.
    """

    steps: int = Field(
        default=200,
        ge=1,
        le=1_000_000,
        description="Policy versions to train: one per consumed rollout batch, after all of its optimizer "
        "updates (epochs x minibatches).",
    )
    prompts_per_step: int = Field(
        default=16, ge=1, le=4096, description="Prompt groups consumed per policy version (one rollout batch)."
    )
    minibatches: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Optimizer updates per pass over a rollout batch: its rows (promptsPerStep x groupSize) "
        "are shuffled and split into this many minibatches, each one update against the reference held "
        "since the batch arrived. Rollout still receives one version per batch.",
    )
    epochs: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Passes over each rollout batch (PPO epochs); the batch makes epochs x minibatches "
        "optimizer updates.",
    )
    micro_batch_tokens: int = Field(
        default=0,
        ge=0,
        le=1 << 24,
        description="Token budget of one forward (padded rows x sequence length): a minibatch runs as "
        "micro-batches of at most this many tokens whose gradients accumulate into one update (one row is "
        "never split); 0 = the whole minibatch in one forward.",
    )
    learning_rate: float = Field(
        default=3e-4, gt=0.0, le=1.0,
        description="AdamW learning rate of the actor for RL (after the warm start), in (0, 1].",
    )
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0, description="AdamW weight decay, in [0, 1].")
    max_grad_norm: float | None = Field(
        default=1.0, gt=0.0, le=1000.0,
        description="Gradient-norm clip of every optimizer update, in (0, 1000] (null: none).",
    )
    warm_start_steps: int = Field(
        default=300, ge=0, le=1_000_000,
        description="Supervised steps on generated demonstrations before RL (0: none).",
    )
    seed: int = Field(
        default=0, ge=0, le=MAX_SEED, description="Seed of every random generator in the job (0 .. 2^32-1)."
    )

    @property
    def updates_per_version(self) -> int:
        """Optimizer updates per rollout batch: ``epochs * minibatches``."""
        return self.epochs * self.minibatches


class CheckpointSpec(SpecModel):
    """``spec.checkpoint``: where and how often the job saves, and whether it resumes."""

    dir: str = Field(
        default="checkpoints",
        max_length=MAX_PATH_LENGTH,
        description="Checkpoint folder: relative paths are inside the run directory (locally) or the "
        f"job's volume (in a cluster); an absolute path must be under {CHECKPOINT_MOUNT}/ (the volume's mount); "
        "no '..' segments.",
        json_schema_extra=on_field(CHECKPOINT_DIR_RULE),
    )
    every_steps: int = Field(default=50, ge=1, le=1_000_000, description="Save every this many optimizer steps.")
    keep: int = Field(default=2, ge=1, le=100, description="Most recent checkpoints kept (at most 100).")
    resume: bool = Field(default=True, description="Resume from the newest checkpoint when one exists.")
    export_every_steps: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Also write the policy as a Hugging Face model folder (config.json, safetensors shards, "
        "tokenizer) every this many policy versions and at the last one, into <dir>/exports/step-NNNNNN, "
        "atomically; 0 = no exports (asyncrl export makes one from any checkpoint).",
    )
    export_keep: int = Field(
        default=2, ge=1, le=100, description="Most recent exports kept (exportEverySteps > 0), at most 100."
    )
    volume_claim_name: str | None = Field(
        default=None, description="PersistentVolumeClaim mounted at the checkpoint folder in a cluster."
    )

    @field_validator("dir")
    @classmethod
    def _confined(cls, v: str) -> str:
        problem = checkpoint_dir_problem(v)
        if problem:
            raise ValueError(problem)
        return v


_DEFAULT_W = AsyncSpec.model_fields["max_staleness"].default
_DEFAULT_PROMPTS = TrainSpec.model_fields["prompts_per_step"].default
# A dedicated scorer's layout in force (DedicatedSpec.layout_for): its own fields, else the actor's, else defaults.
_ACTOR_TP = ("(has(self.actor) && has(self.actor.megatron) && has(self.actor.megatron.tensorParallel) ? "
             f"self.actor.megatron.tensorParallel : {ActorSpec().megatron.tensor_parallel})")
_ACTOR_GPUS = ("(has(self.actor) && has(self.actor.gpusPerReplica) ? self.actor.gpusPerReplica : "
               f"{ActorSpec.model_fields['gpus_per_replica'].default})")
_SCORER_TP = ("(has(self.oldLogits.dedicated.tensorParallel) ? self.oldLogits.dedicated.tensorParallel : "
              f"{_ACTOR_TP})")
_SCORER_GPUS = ("(has(self.oldLogits.dedicated.gpusPerReplica) ? self.oldLogits.dedicated.gpusPerReplica : "
                f"({_ACTOR_GPUS} > 0 ? {_SCORER_TP} : 0))")
_DEFAULT_GROUP = TaskSpec.model_fields["group_size"].default
_DEFAULT_AGENT_PORT = 8100  # AgentEndpointSpec.port's default
_DEFAULT_METRICS_PORT = 9400  # MonitoringSpec.port's default
AGENT_PORT_MESSAGE = (
    "task.endpoint.port is the rollout pods' agent endpoint and must differ from monitoring.port (their /metrics); "
    "choose another port"
)
EXACT_NEEDS_STRATEGY_MESSAGE = (
    "correction.reference 'exact' needs oldLogits.strategy (how the exact old logits are recovered): "
    + ", ".join(s.value for s in list(OldLogitStrategy)[:-1]) + f" or {list(OldLogitStrategy)[-1].value}"
)
STRATEGY_NEEDS_EXACT_MESSAGE = (
    "oldLogits.strategy is only used with correction.reference: exact; set reference: exact, or remove the strategy"
)
MAX_VERSIONS_MESSAGE = (
    "oldLogits.snapshot.maxVersions cannot hold every version async.maxStaleness (W) admits: a token may be W "
    "versions old and each version needs its snapshot; set maxVersions to 0 (auto) or >= W+1"
)
TRAINING_SIDE_MEMORY_UNUSED_MESSAGE = (
    "rollout.trainingSideMemory is only used by oldLogits.strategy interruptSync (the rollout workers then host "
    "the training-side model to score); remove it or set the strategy to interruptSync"
)
MINIBATCHES_MESSAGE = (
    "train.minibatches cannot exceed the rows of a rollout batch (train.promptsPerStep x task.groupSize): "
    "each minibatch needs at least one trajectory; lower minibatches or raise promptsPerStep"
)
MODEL_IMMUTABLE_MESSAGE = (
    "spec.model is immutable: the checkpoint holds these weights; create a new job to change the model"
)


class AsyncRLJobSpec(SpecModel):
    """``spec`` of an AsyncRLJob."""

    correction: CorrectionSpec = Field(default_factory=CorrectionSpec, description="Off-policy correction.")
    old_logits: OldLogitsSpec = Field(
        default_factory=OldLogitsSpec, description="Exact old-logit recovery (reference: exact)."
    )
    async_: AsyncSpec = Field(
        default_factory=AsyncSpec, alias="async", description="Asynchrony: staleness bound, partial rollouts."
    )
    model: ModelSpec = Field(
        default_factory=ModelSpec,
        description="The policy model (immutable once the job exists).",
        # Defaulted to {} on the server, so the transition rule always has both old and new values.
        json_schema_extra=on_field(CelRule("self == oldSelf", MODEL_IMMUTABLE_MESSAGE), default={}),
    )
    task: TaskSpec = Field(default_factory=TaskSpec, description="The environment / agent task.")
    train: TrainSpec = Field(default_factory=TrainSpec, description="Optimisation of the actor.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoints and resume.")
    eval: EvalSpec = Field(
        default_factory=EvalSpec,
        description="Periodic evaluation of the current policy on a fixed held-out prompt set (off by default).",
    )
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="Rollout workers.")
    actor: ActorSpec = Field(default_factory=ActorSpec, description="Actor (trainer) processes.")
    driver: DriverSpec = Field(default_factory=DriverSpec, description="The driver pod (Ray head + job driver).")
    run_policy: RunPolicySpec = Field(default_factory=RunPolicySpec, description="Failure and time limits.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Pod placement.")
    monitoring: MonitoringSpec = Field(default_factory=MonitoringSpec, description="Prometheus metrics.")

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.correction) || !has(self.correction.reference) || "
            "self.correction.reference != 'exact' || (has(self.oldLogits) && has(self.oldLogits.strategy))",
            EXACT_NEEDS_STRATEGY_MESSAGE,
        ),
        CelRule(
            "!has(self.oldLogits) || !has(self.oldLogits.strategy) || (has(self.correction) && "
            "has(self.correction.reference) && self.correction.reference == 'exact')",
            STRATEGY_NEEDS_EXACT_MESSAGE,
        ),
        CelRule(
            "!has(self.oldLogits) || !has(self.oldLogits.snapshot) || !has(self.oldLogits.snapshot.maxVersions) "
            "|| self.oldLogits.snapshot.maxVersions == 0 || self.oldLogits.snapshot.maxVersions >= "
            f"(has(self.async) && has(self.async.maxStaleness) ? self.async.maxStaleness : {_DEFAULT_W}) + 1",
            MAX_VERSIONS_MESSAGE,
            ".oldLogits.snapshot.maxVersions",
        ),
        CelRule(
            "!has(self.rollout) || !has(self.rollout.trainingSideMemory) || "
            f"self.rollout.trainingSideMemory == '{DEFAULT_TRAINING_SIDE_MEMORY}' || (has(self.oldLogits) && "
            f"has(self.oldLogits.strategy) && self.oldLogits.strategy == '{OldLogitStrategy.INTERRUPT_SYNC.value}')",
            TRAINING_SIDE_MEMORY_UNUSED_MESSAGE,
            ".rollout.trainingSideMemory",
        ),
        CelRule(
            f"!has(self.oldLogits) || !has(self.oldLogits.dedicated) || {_SCORER_GPUS} == 0 || "
            f"{_SCORER_GPUS} % {_SCORER_TP} == 0",
            SCORER_TP_DIVIDES_GPUS_MESSAGE,
            ".oldLogits.dedicated.tensorParallel",
        ),
        CelRule(
            "!has(self.train) || !has(self.train.minibatches) || self.train.minibatches <= "
            f"(has(self.train.promptsPerStep) ? self.train.promptsPerStep : {_DEFAULT_PROMPTS}) * "
            f"(has(self.task) && has(self.task.groupSize) ? self.task.groupSize : {_DEFAULT_GROUP})",
            MINIBATCHES_MESSAGE,
            ".train.minibatches",
        ),
        CelRule(
            "!has(self.task) || !has(self.task.agent) || "
            f"(has(self.task.endpoint) && has(self.task.endpoint.port) ? self.task.endpoint.port : {_DEFAULT_AGENT_PORT})"
            f" != (has(self.monitoring) && has(self.monitoring.port) ? self.monitoring.port : {_DEFAULT_METRICS_PORT})",
            AGENT_PORT_MESSAGE,
            ".task.endpoint.port",
        ),
    )

    @model_validator(mode="after")
    def _agent_port_is_its_own(self) -> "AsyncRLJobSpec":
        if self.task.agent is not None and self.task.endpoint.port == self.monitoring.port:
            raise RuleError([("task.endpoint.port",
                              f"{AGENT_PORT_MESSAGE}; both are {self.monitoring.port}")])
        return self

    @model_validator(mode="after")
    def _exact_needs_strategy(self) -> "AsyncRLJobSpec":
        ref, strategy = self.correction.reference, self.old_logits.strategy
        if ref is ReferencePolicy.EXACT and strategy is None:
            raise ValueError(f"{EXACT_NEEDS_STRATEGY_MESSAGE}; correction.reference is 'exact' but no strategy is set")
        if ref is not ReferencePolicy.EXACT and strategy is not None:
            raise ValueError(
                f"{STRATEGY_NEEDS_EXACT_MESSAGE}; oldLogits.strategy is '{strategy.value}' but correction.reference "
                f"is '{ref.value}'"
            )
        return self

    @model_validator(mode="after")
    def _snapshots_cover_the_window(self) -> "AsyncRLJobSpec":
        # Whatever the strategy (the CEL rule cannot see it either): a snapshot section set without
        # strategy snapshot is refused on its own, by OldLogitsSpec.
        kept, w = self.old_logits.snapshot.max_versions, self.async_.max_staleness
        if 0 < kept < w + 1:
            raise RuleError([(
                "oldLogits.snapshot.maxVersions",
                f"{MAX_VERSIONS_MESSAGE}; got maxVersions={kept} with async.maxStaleness={w} (W+1 = {w + 1})",
            )])
        return self

    @model_validator(mode="after")
    def _training_side_memory_with_interrupt_sync(self) -> "AsyncRLJobSpec":
        memory = self.rollout.training_side_memory
        if memory != DEFAULT_TRAINING_SIDE_MEMORY and self.old_logits.strategy is not OldLogitStrategy.INTERRUPT_SYNC:
            strategy = self.old_logits.strategy.value if self.old_logits.strategy else "none"
            raise RuleError([(
                "rollout.trainingSideMemory",
                f"{TRAINING_SIDE_MEMORY_UNUSED_MESSAGE} (got {memory!r} with oldLogits.strategy {strategy})",
            )])
        return self

    @model_validator(mode="after")
    def _layout_fits_the_model(self) -> "AsyncRLJobSpec":
        m = self.actor.megatron
        if m.tensor_parallel == m.pipeline_parallel == m.expert_parallel == 1:
            return self
        arch = known_arch(self.model)
        if arch is not None:
            raise_all([("actor.megatron", f"{p} (spec.model)")
                       for p in parallel_problems(arch, m.tensor_parallel, m.pipeline_parallel, m.expert_parallel)])
        return self

    @model_validator(mode="after")
    def _lora_can_be_served(self) -> "AsyncRLJobSpec":
        lora = self.model.lora
        if lora is None:
            return self
        arch = known_arch(self.model)
        smallest = None if arch is None else min(arch.hidden_size, arch.head_dim * arch.num_attention_heads,
                                                 arch.moe_ffn_hidden_size if arch.is_moe else arch.ffn_hidden_size)
        raise_all(lora_problems(lora, engine=self.rollout.engine, smallest_dim=smallest,
                                tensor_parallel=self.actor.megatron.tensor_parallel))
        return self

    @model_validator(mode="after")
    def _scorer_layout_can_work(self) -> "AsyncRLJobSpec":
        if self.old_logits.strategy is not OldLogitStrategy.DEDICATED:
            return self  # a dedicated section set under another strategy is refused by OldLogitsSpec
        layout = self.old_logits.dedicated.layout_for(self.actor)
        raise_all(scorer_layout_problems(layout, known_arch(self.model) if layout.tensor_parallel > 1 else None))
        return self

    @model_validator(mode="after")
    def _routing_replay_can_work(self) -> "AsyncRLJobSpec":
        c = self.correction
        raise_all(routing_replay_problems(c.routing_replay, c.reference, self.rollout.engine,
                                          visible_arch(self.model) if c.routing_replay != "none" else None))
        return self

    @model_validator(mode="after")
    def _minibatches_fit_the_batch(self) -> "AsyncRLJobSpec":
        rows = self.train.prompts_per_step * self.task.group_size
        if self.train.minibatches > rows:
            raise RuleError([(
                "train.minibatches",
                f"{MINIBATCHES_MESSAGE}; got minibatches={self.train.minibatches} with promptsPerStep="
                f"{self.train.prompts_per_step} x groupSize={self.task.group_size} = {rows} rows",
            )])
        return self

    @property
    def old_logits_route(self) -> OldLogitsRoute:
        """How ``pi_old`` is obtained (``none`` for a cheap reference, else the exact strategy): the one place
        that reads ``correction.reference`` with ``oldLogits.strategy`` (:mod:`asyncrl.api.old_logits_route`)."""
        return old_logits_route(self.correction, self.old_logits)

    @property
    def snapshot_versions(self) -> int:
        """The snapshot cap in force: ``oldLogits.snapshot.maxVersions``, or W+1 when it is 0 (auto)."""
        return self.old_logits.snapshot.max_versions or self.async_.max_staleness + 1

    @property
    def ewma_decay(self) -> float:
        """The configured EWMA decay: ``W/(W+2)`` with ``W = async.maxStaleness`` when decay is omitted."""
        decay = self.correction.ewma.decay
        if decay is None:
            w = self.async_.max_staleness
            return w / (w + 2)
        return decay


__all__ = ["API_VERSION", "GROUP", "KIND", "PLURAL", "SHORT_NAMES", "SINGULAR", "VERSION"]  # re-exported


class AsyncRLJob(BaseModel):
    """A whole AsyncRLJob object, as ``kubectl apply`` and ``asyncrl run`` take it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    api_version: Literal["asyncrl.io/v1alpha1"] = Field(alias="apiVersion", description="asyncrl.io/v1alpha1")
    kind: Literal["AsyncRLJob"] = Field(description="AsyncRLJob")
    metadata: ObjectMeta = Field(description="Object metadata.")
    spec: AsyncRLJobSpec = Field(default_factory=AsyncRLJobSpec, description="The job's specification.")
    status: dict[str, Any] | None = Field(default=None, description="Written by the operator; ignored on input.")
