"""What the actor is built from: :class:`ActorSettings`, adapted once from the job spec.

``max_staleness`` here is W, the *setting* (``async.maxStaleness``), never an observed gap.
"""

from dataclasses import dataclass
from typing import Literal

from asyncrl.api.correction import CorrectionSpec
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.lora import LoraSpec
from asyncrl.api.model_arch import LlamaArch, resolve_arch
from asyncrl.api.old_logits import OldLogitsSpec
from asyncrl.trainer.megatron import compat, parallel
from asyncrl.trainer.megatron.logprobs import DEFAULT_CHUNK_BYTES

_BF16: dict[str, bool | None] = {"auto": None, "bf16": True, "fp32": False}  # spec.actor.megatron.precision


@dataclass(frozen=True)
class ActorSettings:
    """Everything the actor needs, adapted once from the job spec (:meth:`from_spec`)."""

    arch: LlamaArch
    correction: CorrectionSpec
    optimizer: compat.OptimizerSettings
    temperature: float = 1.0  # rollout sampling temperature; logp_theta uses the same
    seed: int = 0
    max_staleness: int = 2  # W (async.maxStaleness): EWMA decay auto, linear/loglinear gap bound
    num_threads: int | None = None  # torch intra-op threads of this process (None: leave as is)
    max_chunk_bytes: int = DEFAULT_CHUNK_BYTES  # fp32 logits alive per log-prob chunk
    init_weights: str | None = None  # folder of HF-named safetensors (None: random init)
    device: Literal["auto", "cpu", "cuda"] = "auto"  # compat.init_megatron: auto = CUDA if present
    old_logits: OldLogitsSpec = OldLogitsSpec()  # exact old-logit strategy (reference: exact)
    work_dir: str | None = None  # snapshot.device disk: folder of the snapshot files (None: private temp)
    minibatches: int = 1  # train.minibatches: optimizer updates per pass over a batch
    epochs: int = 1  # train.epochs: passes over a batch
    micro_batch_tokens: int = 0  # train.microBatchTokens: padded tokens per forward (0: the whole minibatch)
    group_size: int = 1  # task.groupSize: rows of a GRPO group (kept under one update when it fits)
    layout: parallel.Layout = parallel.Layout()  # this rank in the actor group (one process: the default)
    lora: LoraSpec | None = None  # spec.model.lora: adapters on a frozen base (trainer/megatron/lora.py)

    @classmethod
    def from_spec(
        cls,
        spec: AsyncRLJobSpec,
        vocab_size: int,
        *,
        num_threads: int | None = None,
        max_sequence_length: int | None = None,
        work_dir: str | None = None,
    ) -> "ActorSettings":
        arch = resolve_arch(spec.model, vocab_size, max_sequence_length)
        optimizer = compat.OptimizerSettings(
            lr=spec.train.learning_rate,
            weight_decay=spec.train.weight_decay,
            max_grad_norm=spec.train.max_grad_norm,
            bf16=_BF16[spec.actor.megatron.precision],  # None/auto: resolved by the runtime's device
            distributed_optimizer=spec.actor.megatron.distributed_optimizer,
        )
        return cls(
            arch=arch,
            correction=spec.correction,
            optimizer=optimizer,
            temperature=spec.task.temperature,
            seed=spec.train.seed,
            max_staleness=spec.async_.max_staleness,
            num_threads=num_threads,
            init_weights=spec.model.weights,
            old_logits=spec.old_logits,
            work_dir=work_dir,
            minibatches=spec.train.minibatches,
            epochs=spec.train.epochs,
            micro_batch_tokens=spec.train.micro_batch_tokens,
            group_size=spec.task.group_size,
            lora=spec.model.lora,
        )
