"""The training actor: a megatron-core Llama ``GPTModel``, its optimizer and the policy version.

One :meth:`MegatronActor.train_step` is one optimizer step and one version (paper §3.2, ARCHITECTURE §3):

1. the old-logit provider's own forwards, if it needs any (``ewma``: ``theta_prox``; ``exact``:
   each version's snapshot), run by the actor under the weights the provider names, no grad
   (:mod:`asyncrl.trainer.oldlogits`; the actor is the provider's :class:`Scorer`);
2. gradient forward: ``logp_theta`` ``[B, T]`` at the rollout temperature;
3. ``logp_ref = provider.logp_ref(batch, logp_theta, version, scored)``;
4. ``correction_loss(logp_theta, logp_ref, logp_mu, ...)``; a non-finite loss stops here: no
   backward, no update, the batch statistics are logged and the step is counted;
5. backward, clip (``train.maxGradNorm``), optimizer step, ``version += 1``;
6. the provider observes the update (``ewma``: the new weights, the step's keep ratio, which may
   reset ``theta_prox`` to the current weights, paper §6.5, and the batch's mean staleness).
"""

import dataclasses
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from asyncrl.api.correction import CorrectionSpec, ReferencePolicy
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.model_arch import LlamaArch, resolve_arch
from asyncrl.api.old_logits import OldLogitsSpec
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.batch import TrainBatch
from asyncrl.trainer.megatron.checkpoint import read_checkpoint, write_checkpoint
from asyncrl.trainer.megatron.convert import hf_to_megatron, load_hf, megatron_to_hf
from asyncrl.trainer.megatron.logprobs import DEFAULT_CHUNK_BYTES, token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model
from asyncrl.trainer.oldlogits import OldLogitProvider, ProviderSettings, make_provider, provider_key

log = logging.getLogger(__name__)


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

    @classmethod
    def from_spec(
        cls,
        spec: AsyncRLJobSpec,
        vocab_size: int,
        *,
        num_threads: int | None = None,
        max_sequence_length: int | None = None,
    ) -> "ActorSettings":
        arch = resolve_arch(spec.model, vocab_size, max_sequence_length)
        optimizer = compat.OptimizerSettings(
            lr=spec.train.learning_rate,
            weight_decay=spec.train.weight_decay,
            max_grad_norm=spec.train.max_grad_norm,
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
        )


@dataclass(frozen=True)
class TrainStepMetrics:
    """What one :meth:`MegatronActor.train_step` did. Counters (``*_total``) are cumulative."""

    version: int  # actor version after the step
    reference: str  # which reference produced logp_ref (ARCHITECTURE §5: always said)
    stepped: bool  # False: no update (non-finite loss or gradients)
    loss: float
    grad_norm: float  # before clipping; nan when the step stopped before backward
    valid_tokens: int  # loss_mask.sum()
    nonfinite_loss_total: int
    nonfinite_grad_total: int
    ewma_reset: bool
    ewma_reset_reason: str  # why the EWMA reference was reset this step ("" when it was not)
    ewma_resets_total: int
    reference_seconds: float  # the extra forward of the reference (0 when none)
    forward_seconds: float
    backward_seconds: float  # backward + clip + optimizer step
    # CorrectionStats.record(): the loss's counts and sums with the fractions derived from them, keyed
    # by the record's own names (CorrectionStats.from_record reads the counts back for the exporter).
    correction: dict[str, float] = field(default_factory=dict)

    def as_dict(self, prefix: str = "actor/") -> dict[str, float | str]:
        """Flat ``{name: value}`` for logs; correction metrics under ``<prefix>correction/``."""
        out: dict[str, float | str] = {}
        for f in dataclasses.fields(self):
            if f.name != "correction":
                value = getattr(self, f.name)
                out[prefix + f.name] = value if isinstance(value, str) else float(value)
        out |= {f"{prefix}correction/{k}": v for k, v in self.correction.items()}
        return out


@dataclass(frozen=True)
class SftStepMetrics:
    """What one :meth:`MegatronActor.sft_step` did."""

    version: int
    stepped: bool
    loss: float  # mean next-token cross-entropy over loss_mask tokens (nats)
    grad_norm: float
    valid_tokens: int
    seconds: float


class MegatronActor:
    """The policy being trained. Build with :meth:`from_spec`; one instance per process."""

    def __init__(self, settings: ActorSettings) -> None:
        self.settings = settings
        self.old_logits: OldLogitProvider = self._new_provider()  # an unknown reference fails here
        self.reference: ReferencePolicy = self.old_logits.reference
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        self.runtime = compat.init_megatron(settings.seed, device=settings.device)
        gpt = build_gpt_model(settings.arch, use_cpu_initialization=self.runtime.use_cpu_initialization)
        self._gpt = gpt.to(self.runtime.device)
        if settings.init_weights is not None:
            self.load_hf_state_dict(load_hf(settings.init_weights))
        self._ddp = compat.wrap_ddp(self._gpt)
        self._named = {n: p for n, p in self._gpt.named_parameters() if p.requires_grad}
        self._params = list(self._named.values())
        self._optimizer = compat.make_optimizer(self._ddp, settings.optimizer)
        self.version = 0
        self._scratch: dict[str, torch.Tensor] | None = None  # live weights while others are swapped in
        self.nonfinite_loss_total = 0
        self.nonfinite_grad_total = 0
        self.ewma_resets_total = 0

    @classmethod
    def from_spec(
        cls,
        spec: AsyncRLJobSpec,
        vocab_size: int,
        *,
        num_threads: int | None = None,
        max_sequence_length: int | None = None,
    ) -> "MegatronActor":
        """The actor of a job (``spec.model``, ``spec.train``, ``spec.correction``, ``spec.task.temperature``)."""
        return cls(
            ActorSettings.from_spec(
                spec, vocab_size, num_threads=num_threads, max_sequence_length=max_sequence_length
            )
        )

    # ---------------------------------------------------------------- forward passes
    def logprobs(self, tokens: torch.Tensor, *, temperature: float | None = None) -> torch.Tensor:
        """No-grad ``logp_theta`` ``[B, T]`` of ``tokens`` ``[B, T]`` under the current weights
        (position 0 = 0; default temperature: the rollout's)."""
        t = self.settings.temperature if temperature is None else temperature
        with torch.no_grad():
            return self._logprobs(tokens.to(self.runtime.device), t)

    def named_weights(self) -> Mapping[str, torch.Tensor]:
        """The live trainable parameters by name (the old-logit providers read them)."""
        return self._named

    def logprobs_under(self, weights: Mapping[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
        """No-grad log-probs ``[b, T]`` of ``tokens`` ``[b, T]`` under ``weights`` (named like
        :meth:`named_weights`): swapped in place, then the live weights are restored bit for bit.

        In place, not a second model: costs two weight copies and one forward. It must run before
        the gradient forward of a step (autograd saves the parameters it will need for backward).
        """
        missing = sorted(set(self._named) - set(weights))
        if missing:
            raise ValueError(f"logprobs_under: weights lack parameters {missing[:5]} (of {len(missing)})")
        with torch.no_grad():
            if self._scratch is None:
                self._scratch = {n: torch.empty_like(p) for n, p in self._named.items()}
            for name, p in self._named.items():
                self._scratch[name].copy_(p)
                p.copy_(weights[name])
            try:
                return self._logprobs(tokens.to(self.runtime.device), self.settings.temperature)
            finally:
                for name, p in self._named.items():
                    p.copy_(self._scratch[name])

    def _logprobs(self, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
        return token_logprobs(
            self._ddp, tokens, temperature=temperature, max_chunk_bytes=self.settings.max_chunk_bytes
        )

    # ---------------------------------------------------------------- training
    def set_learning_rate(self, lr: float) -> None:
        """Set the optimizer's learning rate (the driver's warm-start schedule, then train.learningRate)."""
        self._optimizer.set_learning_rate(lr)

    def train_step(self, batch: TrainBatch) -> TrainStepMetrics:
        """One RL optimizer step on ``batch`` with the job's correction (see the module docstring)."""
        from asyncrl.trainer.correction import correction_loss

        batch = batch.to(self.runtime.device)
        self._optimizer.zero_grad()
        t0 = time.perf_counter()
        scored = self.old_logits.score(batch, self)  # before the gradient forward (weight swaps)
        t1 = time.perf_counter()
        logp_theta = self._logprobs(batch.tokens, self.settings.temperature)
        logp_ref = self.old_logits.logp_ref(batch, logp_theta, self.version, scored)
        result = correction_loss(
            logp_theta,
            logp_ref,
            batch.logp_mu,
            batch.advantages,
            batch.loss_mask,
            self.settings.correction,
            turn_ids=batch.turn_ids,
        )
        correction = result.metrics.record()  # one device sync for every count
        loss = float(result.loss.detach())
        t2 = time.perf_counter()
        grad_norm, stepped, reset = math.nan, False, ""
        if not math.isfinite(loss):
            self.nonfinite_loss_total += 1
            log.warning(
                "non-finite loss %s at version %d (reference %s): step skipped; batch %s",
                loss,
                self.version,
                self.reference.value,
                batch.summary(),
            )
        else:
            result.loss.backward()
            outcome = self._optimizer.step()
            grad_norm, stepped = outcome.grad_norm, outcome.stepped
            if stepped:
                self.version += 1
                reset = self.old_logits.observe_update(batch, self, correction["keep_ratio"])
                if reset:
                    self.ewma_resets_total += 1
                    log.info("%s reference reset to the current weights at version %d (%s)",
                             self.reference.value, self.version, reset)
            else:
                self.nonfinite_grad_total += 1
                log.warning(
                    "non-finite gradient norm %s at version %d: update skipped; batch %s",
                    grad_norm,
                    self.version,
                    batch.summary(),
                )
        t3 = time.perf_counter()
        return TrainStepMetrics(
            version=self.version,
            reference=self.reference.value,
            stepped=stepped,
            loss=loss,
            grad_norm=grad_norm,
            valid_tokens=int(batch.loss_mask.sum()),
            nonfinite_loss_total=self.nonfinite_loss_total,
            nonfinite_grad_total=self.nonfinite_grad_total,
            ewma_reset=bool(reset),
            ewma_reset_reason=reset,
            ewma_resets_total=self.ewma_resets_total,
            reference_seconds=t1 - t0,
            forward_seconds=t2 - t1,
            backward_seconds=t3 - t2,
            correction=correction,
        )

    def sft_step(self, tokens: torch.Tensor, loss_mask: torch.Tensor) -> SftStepMetrics:
        """One supervised step (warm start): mean cross-entropy of the ``loss_mask`` tokens.

        Args:
            tokens: ``[B, T]`` long, right-padded demonstrations.
            loss_mask: ``[B, T]`` bool, True = a token to imitate (position 0 is never one).
        """
        if tokens.shape != loss_mask.shape or loss_mask.dtype != torch.bool:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and loss_mask {tuple(loss_mask.shape)} {loss_mask.dtype} "
                "must be the same [B, T] shape, loss_mask bool"
            )
        t0 = time.perf_counter()
        tokens, loss_mask = tokens.to(self.runtime.device), loss_mask.to(self.runtime.device)
        self._optimizer.zero_grad()
        logp = self._logprobs(tokens, 1.0)  # [B, T]; supervised targets, no sampling temperature
        n = int(loss_mask.sum())
        loss = -(logp * loss_mask).sum() / max(n, 1)
        value, grad_norm, stepped = float(loss.detach()), math.nan, False
        if not math.isfinite(value):
            self.nonfinite_loss_total += 1
            log.warning("non-finite SFT loss %s at version %d: step skipped", value, self.version)
        else:
            loss.backward()
            outcome = self._optimizer.step()
            grad_norm, stepped = outcome.grad_norm, outcome.stepped
            if stepped:
                self.version += 1
            else:
                self.nonfinite_grad_total += 1
        return SftStepMetrics(self.version, stepped, value, grad_norm, n, time.perf_counter() - t0)

    # ---------------------------------------------------------------- old-logit provider
    def _new_provider(self) -> OldLogitProvider:
        s = self.settings
        return make_provider(
            s.correction.reference,
            ProviderSettings(max_staleness=s.max_staleness, ewma=s.correction.ewma, old_logits=s.old_logits),
        )

    # ---------------------------------------------------------------- weights and checkpoints
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """HF Llama-named fp32 CPU copies of the weights (weight sync to the rollout engine).

        Tied architectures list ``lm_head.weight`` as the same tensor as ``model.embed_tokens.weight``,
        so ``LlamaForCausalLM.load_state_dict(..., strict=True)`` accepts it.
        """
        own = {
            k: v.detach().to("cpu", torch.float32).clone()
            for k, v in self._gpt.state_dict().items()
            if not k.endswith("_extra_state")
        }
        return megatron_to_hf(own, self.settings.arch)

    def load_hf_state_dict(self, hf: dict[str, torch.Tensor]) -> None:
        """Load HF Llama-named weights (shapes checked against the architecture)."""
        mcore = hf_to_megatron(hf, self.settings.arch)
        self._gpt.load_state_dict({k: v.to(self.runtime.device) for k, v in mcore.items()}, strict=True)

    def save_checkpoint(self, directory: str) -> None:
        """Model, optimizer, version, old-logit provider state (EWMA weights, snapshots) and counters;
        atomic (temporary folder, then rename)."""
        state = {
            "model": {k: v for k, v in self._gpt.state_dict().items() if not k.endswith("_extra_state")},
            "optimizer": self._optimizer.state_dict(),
            "old_logits": {
                "provider": provider_key(self.reference, self.settings.old_logits),
                "state": self.old_logits.state_dict(),
            },
            "version": self.version,
            "counters": {
                "nonfinite_loss_total": self.nonfinite_loss_total,
                "nonfinite_grad_total": self.nonfinite_grad_total,
                "ewma_resets_total": self.ewma_resets_total,
            },
        }
        meta = {
            "version": self.version,
            "reference": self.reference.value,
            "arch": dataclasses.asdict(self.settings.arch),
        }
        write_checkpoint(directory, state, meta)

    def load_checkpoint(self, directory: str, *, old_logits: bool = True) -> None:
        """Restore everything :meth:`save_checkpoint` wrote (the architecture must match).

        ``old_logits=False`` (a warm start) leaves the old-logit provider fresh: it starts from the
        weights RL starts with, whatever reference wrote the checkpoint.
        """
        state, meta = read_checkpoint(directory)
        arch = dataclasses.asdict(self.settings.arch)
        if meta["arch"] != arch:
            raise ValueError(f"checkpoint {directory} has architecture {meta['arch']}, this actor has {arch}")
        self._gpt.load_state_dict(
            {k: v.to(self.runtime.device) for k, v in state["model"].items()}, strict=True
        )
        self._optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.old_logits = self._new_provider()
        if old_logits:
            self._load_provider_state(directory, state)
        for name, value in state["counters"].items():
            setattr(self, name, int(value))

    def _load_provider_state(self, directory: str, state: dict[str, Any]) -> None:
        key = provider_key(self.reference, self.settings.old_logits)
        saved = state.get("old_logits")
        if saved is None:  # written before the old-logit providers: only an EWMA state was kept
            if state.get("ewma") is not None and self.reference is ReferencePolicy.EWMA:
                self.old_logits.load_state_dict({"ewma": state["ewma"]})
            return
        if saved["provider"] != key:
            raise ValueError(
                f"checkpoint {directory} holds the state of old-logit provider {saved['provider']!r}, this "
                f"actor runs {key!r}; resume with the job's own correction.reference and oldLogits.strategy"
            )
        self.old_logits.load_state_dict(saved["state"])
