"""The training actor: a megatron-core Llama ``GPTModel``, its optimizer and the policy version.

One :meth:`MegatronActor.train_step` consumes one rollout batch and makes **one** version (paper §3.2,
docs/architecture.md, the path of one token), after ``train.epochs x train.minibatches`` optimizer updates
(:mod:`asyncrl.trainer.actor.update_plan` plans them):

1. the held reference, once, when the batch arrives and before its first update: the old-logit
   provider's own forwards (``ewma``: ``theta_prox``; ``exact``: each version's snapshot), run by the
   actor under the weights the provider names, no grad, as a functional call over the stored tensors
   (the live weights are never written) (:mod:`asyncrl.trainer.oldlogits`; the actor is the provider's
   :class:`Scorer`); then ``logp_ref = provider.logp_ref(batch, logp_theta_at_arrival, version,
   scored)``, held fixed across minibatches and epochs. For ``current`` this is decoupled PPO: after
   the first update ``pi_theta`` moves away from it, ``r_s != 1`` and the clip acts within the batch.
   The arrival ``logp_theta`` is a no-grad forward, run only when the provider reads it; with a single
   update the gradient forward runs under the very same weights, so its detached output is used
   instead and the step costs what it always did;
2. per update (a minibatch of rows): per micro-batch (``train.microBatchTokens``), the gradient
   forward ``logp_theta`` ``[b, T]`` at the rollout temperature and ``correction_loss(logp_theta,
   logp_ref, logp_mu, ...)`` rescaled to the minibatch's denominator, then backward (gradients
   accumulate); a non-finite loss stops that update (no optimizer step, counted); then clip
   (``train.maxGradNorm``) and the optimizer step; a non-finite gradient norm skips it (counted);
3. ``version += 1`` once, if at least one update applied. A skipped update does not stop the others:
   the batch's remaining minibatches still train against the held reference (Megatron's optimizer
   skips an overflowing step the same way); when none applied, the version stays and rollout gets
   no new weights;
4. on an audited step (``correction.audit``, cheap references only): a fraction of the rows scored
   exactly from the audit's snapshots and compared with the arrival ``logp_theta`` and ``logp_ref``
   (:mod:`asyncrl.trainer.oldlogits.audit`);
5. retention: the snapshot stores keep ``live_versions`` (the driver's) plus the version now live,
   and release every other version at once (:mod:`asyncrl.trainer.oldlogits.retention`);
6. the provider observes the new version, once (``ewma``: the new weights, the batch's in-bounds
   ratio of ``r_d``, which may reset ``theta_prox`` to the current weights, paper §6.5, and the
   batch's mean staleness; ``snapshot`` and the audit: record the new version, which rollout
   receives now);
7. the report (:class:`~asyncrl.trainer.actor.reports.TrainStepMetrics`, typed, flattened only where the
   driver writes text): the correction counts summed over every micro-batch of every update (so fractions
   are over ``epochs x`` the batch's tokens), loss and gradient norm as the mean over the updates and the
   last one, and the counts of updates planned, applied and skipped.

The settings are :mod:`asyncrl.trainer.actor.settings`, stage 1 is :mod:`asyncrl.trainer.actor.held_reference`,
the reports and the updates' tally :mod:`asyncrl.trainer.actor.reports`, checkpoints
:mod:`asyncrl.trainer.actor.checkpoint_io`.
"""

import logging
import math
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from asyncrl.api.correction import ReferencePolicy
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.checkpoint_io import load_actor, save_actor
from asyncrl.trainer.actor.held_reference import HeldReference, hold_reference
from asyncrl.trainer.actor.reports import (
    NO_TOKENS,
    SftStepMetrics,
    TrainStepMetrics,
    UpdateTally,
    ewma_reset_fields,
)
from asyncrl.trainer.actor.route_replay import count_route_flips, old_logit_routes, route_flip_counts
from asyncrl.trainer.actor.settings import ActorSettings
from asyncrl.trainer.actor.update_plan import (
    LossShare,
    in_bounds_ratio,
    micro_batches,
    select_rows,
    sum_stats,
    update_rows,
)
from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.megatron import compat, parallel
from asyncrl.trainer.megatron.convert import LoadReport, hf_to_megatron, load_folder, megatron_to_hf
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.lora import adapter_bank, apply_lora, hf_with_adapters
from asyncrl.trainer.megatron.model import build_gpt_model
from asyncrl.trainer.megatron.optimizers import make_optimizer
from asyncrl.trainer.oldlogits import OldLogitProvider, ProviderSettings, make_provider
from asyncrl.trainer.oldlogits.audit import Auditor, AuditStats
from asyncrl.trainer.oldlogits.protocol import VersionRetention

__all__ = ["ActorSettings", "MegatronActor", "SftStepMetrics", "TrainStepMetrics"]

log = logging.getLogger(__name__)


class _LogprobCall(torch.nn.Module):
    """``token_logprobs`` of the wrapped ``GPTModel`` as one module call, so that
    ``torch.func.functional_call`` keeps its substituted weights for the whole computation (the
    decoder forward and the chunked output projection, which :func:`token_logprobs` calls apart)."""

    def __init__(self, gpt: torch.nn.Module) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens: torch.Tensor, temperature: float, max_chunk_bytes: int,
                routes: torch.Tensor | None = None) -> torch.Tensor:
        return token_logprobs(self.gpt, tokens, temperature=temperature, max_chunk_bytes=max_chunk_bytes,
                              routes=routes)


class MegatronActor:
    """The policy being trained. Build with :meth:`from_spec`; one instance per process."""

    def __init__(self, settings: ActorSettings) -> None:
        self.settings = settings
        self.old_logits: OldLogitProvider = self._new_provider()  # an unknown reference fails here
        self.reference: ReferencePolicy = self.old_logits.reference
        self.auditor: Auditor | None = self._new_auditor()
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        lay = settings.layout
        self.runtime = compat.init_megatron(settings.seed, device=settings.device, tp=lay.tp, pp=lay.pp, ep=lay.ep,
                                            init_method=lay.init_method, rank=lay.rank, world=lay.world)
        self.dp_rank, self.dp_size = parallel.dp_rank_size()
        gpt = build_gpt_model(settings.arch, use_cpu_initialization=self.runtime.use_cpu_initialization,
                              random_init=settings.init_weights is None)  # a folder overwrites every weight
        self._gpt = gpt.to(self.runtime.device)
        self.load_report: LoadReport | None = None  # reading spec.model.weights (None: random init)
        if settings.init_weights is not None:  # one tensor at a time, memory-mapped (convert.load_folder)
            self.load_report = load_folder(self._gpt, settings.arch, settings.init_weights)
            log.info("%s", self.load_report.line())
        # spec.model.lora: the base frozen, adapters added, before the optimizer and DDP see the parameters
        self.lora = apply_lora(self._gpt, settings.arch, settings.lora, seed=settings.seed) if settings.lora else None
        # The device's defaults filled in (CUDA: bf16 params, megatron's distributed optimizer; CPU: fp32 AdamW).
        self.optimizer_settings = settings.optimizer.resolved(self.runtime)
        self._gpt = compat.cast_model(self._gpt, self.optimizer_settings)  # bf16 after loading the fp32 weights
        self._ddp = compat.wrap_ddp(self._gpt, distributed_optimizer=bool(self.optimizer_settings.distributed_optimizer))
        self._named = {n: p for n, p in self._gpt.named_parameters() if p.requires_grad}
        self._params = list(self._named.values())
        self._optimizer = make_optimizer(self._ddp, self.optimizer_settings)
        self._scoring = _LogprobCall(self._gpt)  # functional calls over stored weights (logprobs_under)
        self.version = 0
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
        work_dir: str | None = None,
    ) -> "MegatronActor":
        """The actor of a job (``spec.model``, ``spec.train``, ``spec.correction``, ``spec.task.temperature``);
        ``work_dir``: the folder of ``oldLogits.snapshot.device: disk`` files (the run's ``snapshots/``)."""
        return cls(
            ActorSettings.from_spec(
                spec, vocab_size, num_threads=num_threads, max_sequence_length=max_sequence_length,
                work_dir=work_dir,
            )
        )

    # ---------------------------------------------------------------- forward passes
    def logprobs(self, tokens: torch.Tensor, *, temperature: float | None = None,
                 routes: torch.Tensor | None = None) -> torch.Tensor:
        """No-grad ``logp_theta`` ``[B, T]`` of ``tokens`` ``[B, T]`` under the current weights
        (position 0 = 0; default temperature: the rollout's); ``routes`` ``[B, T, L, k]``: replay them."""
        t = self.settings.temperature if temperature is None else temperature
        with torch.no_grad():
            return self._logprobs(tokens.to(self.runtime.device), t, routes)

    def named_weights(self) -> Mapping[str, torch.Tensor]:
        """The live trainable parameters by name (the old-logit providers read them)."""
        return self._named

    def logprobs_under(self, weights: Mapping[str, torch.Tensor], tokens: torch.Tensor,
                       routes: torch.Tensor | None = None) -> torch.Tensor:
        """No-grad log-probs ``[b, T]`` of ``tokens`` ``[b, T]`` under ``weights`` (named like
        :meth:`named_weights`; host or device tensors).

        A functional call (``torch.func.functional_call``) of the live module with ``weights`` in
        place of its parameters for this one forward: nothing is copied into the live weights (on a
        GPU only the host-to-device transfer of ``weights``), so it may run anywhere in a step, even
        while autograd holds the live parameters. Bit-identical to loading ``weights`` into the
        model (tested against the in-place swap it replaced and against a fresh model). ``routes``
        ``[b, T, L, k]``: route every position through them (routing replay).
        """
        missing = sorted(set(self._named) - set(weights))
        wrong = [f"{n} {tuple(weights[n].shape)} (live {tuple(p.shape)})"
                 for n, p in self._named.items() if n in weights and weights[n].shape != p.shape]
        if missing or wrong:
            raise ValueError(
                f"logprobs_under: weights lack parameters {missing[:5]} (of {len(missing)}); wrong shapes: "
                f"{wrong[:5]}; pass the tensors of named_weights() of this architecture"
            )
        from torch.func import functional_call

        device = self.runtime.device
        # In the live parameters' dtype, as loading them would (an fp32 EWMA theta_prox of a bf16 actor runs bf16).
        swapped = {"gpt." + n: weights[n].to(device, p.dtype, non_blocking=True) for n, p in self._named.items()}
        with torch.no_grad():
            return functional_call(
                self._scoring, swapped,
                (tokens.to(device), self.settings.temperature, self.settings.max_chunk_bytes, routes),
            )

    @property
    def scores_versions_at_once(self) -> bool:
        """A dense LoRA actor scores rows under different versions in one forward (:meth:`logprobs_under_each`)."""
        return self.lora is not None and not self.lora.moe

    def logprobs_under_each(self, versions: Sequence[Mapping[str, torch.Tensor]], tokens: torch.Tensor,
                            slot: torch.Tensor) -> torch.Tensor:
        """No-grad log-probs ``[n, T]`` of ``tokens`` ``[n, T]``, row ``i`` under the adapters ``versions[slot[i]]``
        (named like :meth:`named_weights`), in one forward (:func:`~asyncrl.trainer.megatron.lora.adapter_bank`)."""
        if self.lora is None:
            raise ValueError("logprobs_under_each: this actor trains no LoRA adapters (spec.model.lora unset)")
        with torch.no_grad(), adapter_bank(self._gpt, self.lora, versions, slot):
            return self._scoring(tokens.to(self.runtime.device), self.settings.temperature,
                                 self.settings.max_chunk_bytes)

    def _logprobs(self, tokens: torch.Tensor, temperature: float, routes: torch.Tensor | None = None) -> torch.Tensor:
        return token_logprobs(
            self._ddp, tokens, temperature=temperature, max_chunk_bytes=self.settings.max_chunk_bytes, routes=routes
        )

    # ---------------------------------------------------------------- training
    def set_learning_rate(self, lr: float) -> None:
        """Set the optimizer's learning rate (the driver's warm-start schedule, then train.learningRate)."""
        self._optimizer.set_learning_rate(lr)

    def train_step(self, batch: TrainBatch, *, live_versions: Collection[int] | None = None) -> TrainStepMetrics:
        """One rollout batch: ``epochs x minibatches`` optimizer updates against the reference held since
        the batch arrived, then one new version (see the module docstring).

        Every rank of the actor group calls this with the same global batch (SPMD); each DP rank trains a
        token-balanced share of every minibatch and every rank returns the same report (global figures).

        Args:
            batch: the step's batch (``[B, T]`` fields).
            live_versions: every version a not-yet-trained token may still reference after this step
                (:func:`asyncrl.trainer.oldlogits.retention.live_versions`); the weight snapshots keep
                these plus the version live after the step and release the rest at once. None: keep
                the newest ``oldLogits.snapshot.maxVersions`` (0 = ``W + 1``) versions.
        """
        s = self.settings
        batch = batch.to(self.runtime.device)
        version = self.version  # the version the batch meets
        plan = update_rows(batch.shape[0], minibatches=s.minibatches, epochs=s.epochs, seed=s.seed,
                           version=version, group_size=s.group_size)
        audited = self.auditor is not None and self.auditor.due(version)
        t0 = time.perf_counter()
        batch = old_logit_routes(self, batch)  # routingReplay oldLogits (R2): the routes the reference forward takes
        if self.auditor is not None:
            self.auditor.before_step(self)
        ref = hold_reference(self, batch, version, fused=len(plan) == 1 and self.dp_size == 1, audited=audited)
        tally = UpdateTally(reference_seconds=time.perf_counter() - t0)
        for rows in plan:
            self._update(batch, rows, version, ref, tally)
        applied = self._advance_version(tally)
        stats = self._batch_stats(tally)
        t_audit = time.perf_counter()
        audit = self._audit(batch, version, ref, audited)
        audit_seconds = time.perf_counter() - t_audit if audit is not None else 0.0
        self._retain(live_versions)
        reset = self._observe_update(batch, applied, in_bounds_ratio(stats))
        return self._report(batch, tally, stats, reset, audit, audit_seconds, len(plan))

    # -- the stages of train_step, in order (stage 1: held_reference.hold_reference)
    def _update(self, batch: TrainBatch, rows: torch.Tensor, version: int, ref: HeldReference, tally: UpdateTally) -> None:
        """Stage 2, one optimizer update of the minibatch ``rows`` ``[b]``: accumulate the gradients of its
        micro-batches, then clip and step; a non-finite loss (on any rank) or gradient norm skips it, counted."""
        self._optimizer.zero_grad()
        loss = self._accumulate(batch, rows, version, ref, tally)
        tally.loss_last, tally.grad_last = loss, math.nan
        if not math.isfinite(loss):
            self.nonfinite_loss_total += 1
            tally.skipped += 1
            log.warning("non-finite loss %s at version %d (reference %s): update skipped; minibatch %s",
                        loss, version, self.reference.value, select_rows(batch, rows).summary())
            return
        tally.losses.append(loss)
        tb = time.perf_counter()
        outcome = self._optimizer.step()  # the norm is global: every rank steps or skips alike
        tally.backward_s += time.perf_counter() - tb
        tally.grad_last = outcome.grad_norm
        if outcome.stepped:
            tally.norms.append(outcome.grad_norm)
        else:
            self.nonfinite_grad_total += 1
            tally.skipped += 1
            log.warning("non-finite gradient norm %s at version %d: update skipped; minibatch %s",
                        outcome.grad_norm, version, select_rows(batch, rows).summary())

    def _accumulate(self, batch: TrainBatch, rows: torch.Tensor, version: int, ref: HeldReference,
                    tally: UpdateTally) -> float:
        """This DP rank's share of the minibatch ``rows`` in micro-batches, forward and backward (gradients
        accumulate), the loss over the minibatch's global denominator; returns the minibatch's loss (summed
        over the ranks), or the first non-finite value (nan when another rank's was): then no backward ran
        after it, on any rank."""
        chunks = self._my_chunks(batch, rows)
        # The minibatch's (global) denominator when the loss is split over micro-batches or ranks; megatron's
        # DDP averages gradients over DP, so each rank's share is scaled by DP to sum to the minibatch's loss.
        split = len(chunks) > 1 or self.dp_size > 1
        share = LossShare(batch.loss_mask[rows], self.settings.correction.loss_aggregation) if split else None
        total = 0.0
        for chunk in chunks:
            ta = time.perf_counter()
            loss = self._micro_loss(batch, chunk, version, ref, share, tally) if len(chunk) else None
            value = float(loss.detach()) if loss is not None else 0.0  # one sync per micro-batch
            tally.micro += 1 if loss is not None else 0
            tb = time.perf_counter()
            tally.forward_s += tb - ta
            if not parallel.all_finite(value):  # every rank takes the same branch
                return value if not math.isfinite(value) else math.nan
            if loss is not None:
                (loss * self.dp_size if self.dp_size > 1 else loss).backward()
            total += value
            tally.backward_s += time.perf_counter() - tb
        return parallel.dp_sum([total])[0]  # the minibatch's loss (each rank holds a share)

    def _my_chunks(self, batch: TrainBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """This rank's micro-batches of ``rows``, padded with empty ones to the most any DP rank has, so
        that every rank runs the same number of collectives (the finite flag) in each update."""
        T, per_tokens = batch.shape[1], self.settings.micro_batch_tokens
        if self.dp_size == 1:
            return micro_batches(rows, T, per_tokens)
        shares = [parallel.dp_share(rows, batch.loss_mask, r, self.dp_size) for r in range(self.dp_size)]
        counts = [len(micro_batches(x, T, per_tokens)) if len(x) else 0 for x in shares]
        mine = micro_batches(shares[self.dp_rank], T, per_tokens) if len(shares[self.dp_rank]) else []
        empty = rows[:0]
        return mine + [empty] * (max(max(counts), 1) - len(mine))

    def _micro_loss(self, batch: TrainBatch, chunk: torch.Tensor, version: int, ref: HeldReference,
                    share: "LossShare | None", tally: UpdateTally) -> torch.Tensor:
        """The gradient forward of the rows ``chunk`` and their share of the minibatch's loss."""
        from asyncrl.trainer.correction import correction_loss

        s = self.settings
        sub = select_rows(batch, chunk)
        logp_theta = self._logprobs(sub.tokens, s.temperature, sub.routes)  # [b, T] with grad; replays sub.routes
        count_route_flips(self._gpt, sub, tally)
        if ref.held is not None:
            logp_ref = ref.held[chunk]
        else:  # fused: one update on one rank, so the arrival weights are the live ones
            logp_ref = self.old_logits.logp_ref(sub, logp_theta, version,
                                                None if ref.scored is None else ref.scored[chunk])
            ref.seen[chunk] = logp_ref
            if ref.theta0 is not None:
                ref.theta0[chunk] = logp_theta.detach()
        result = correction_loss(logp_theta, logp_ref, sub.logp_mu, sub.advantages, sub.loss_mask, s.correction,
                                 turn_ids=sub.turn_ids)
        tally.records.append(result.metrics)
        return result.loss if share is None else share(result.loss, result.metrics)

    def _advance_version(self, tally: UpdateTally) -> bool:
        """Stage 3: one version per batch, after all its updates, if any applied (the same on every rank)."""
        if tally.applied:
            self.version += 1
        return tally.applied

    def _batch_stats(self, tally: UpdateTally) -> CorrectionStats[float]:
        """The correction counts of every micro-batch of every update, summed over the DP ranks."""
        local = sum_stats(tally.records).to_floats() if tally.records else NO_TOKENS
        return parallel.reduce_stats(local)

    def _audit(self, batch: TrainBatch, version: int, ref: HeldReference, audited: bool) -> AuditStats | None:
        """Stage 4: on an audited step, the exact forwards over the stored snapshots, compared at arrival
        (the whole batch on every rank: the same figures everywhere)."""
        if not audited or self.auditor is None or ref.theta0 is None:
            return None
        return self.auditor.run(batch, self, version, ref.theta0, ref.seen, self.settings.correction)

    def _retain(self, live_versions: Collection[int] | None) -> None:
        """Stage 5: the snapshot stores keep ``live_versions`` plus the version now live."""
        if live_versions is not None:
            keep = {int(v) for v in live_versions} | {self.version}
            for holder in self._version_holders():
                holder.retain(keep)

    def _observe_update(self, batch: TrainBatch, applied: bool, bounds_ratio: float) -> str:
        """Stage 6: the provider (and the audit) observe the new version; the EWMA reset reason or ""."""
        if not applied:
            return ""
        reset = self.old_logits.observe_update(batch, self, bounds_ratio)
        if self.auditor is not None:
            self.auditor.after_update(self)
        if reset:
            self.ewma_resets_total += 1
            log.info("%s reference reset to the current weights at version %d (%s)",
                     self.reference.value, self.version, reset)
        return reset

    def _report(self, batch: TrainBatch, tally: UpdateTally, stats: CorrectionStats[float], reset: str,
                audit: AuditStats | None, audit_seconds: float, updates: int) -> TrainStepMetrics:
        """Stage 7: the step's report (every rank returns the same: the figures are global)."""
        resident = [h.resident() for h in self._version_holders()]
        return TrainStepMetrics(
            version=self.version,
            reference=self.reference.value,
            applied=tally.applied,
            loss=tally.loss_mean,
            grad_norm=tally.grad_norm_mean,
            valid_tokens=int(batch.loss_mask.sum()),
            nonfinite_loss_total=self.nonfinite_loss_total,
            nonfinite_grad_total=self.nonfinite_grad_total,
            ewma_reset=bool(reset),
            ewma_reset_reason=reset,
            ewma_resets_total=self.ewma_resets_total,
            **ewma_reset_fields(self.old_logits),
            learning_rate=self._optimizer.learning_rate(),
            reference_seconds=tally.reference_seconds,
            forward_seconds=tally.forward_s,
            backward_seconds=tally.backward_s,
            correction=stats,
            snapshot_resident_versions=sum(r.versions for r in resident),
            snapshot_resident_bytes=sum(r.nbytes for r in resident),
            audit_seconds=audit_seconds,
            audit=audit,
            updates=updates,
            updates_applied=len(tally.norms),
            updates_skipped=tally.skipped,
            micro_batches=tally.micro,
            loss_last=tally.loss_last,
            grad_norm_last=tally.grad_last,
            in_bounds_ratio=in_bounds_ratio(stats),
            **route_flip_counts(tally),
        )

    def sft_step(self, tokens: torch.Tensor, loss_mask: torch.Tensor,
                 weights: torch.Tensor | None = None) -> SftStepMetrics:
        """One supervised step (warm start): mean cross-entropy of the ``loss_mask`` tokens.

        Args:
            tokens: ``[B, T]`` long, right-padded demonstrations.
            loss_mask: ``[B, T]`` bool, True = a token to imitate (position 0 is never one).
            weights: optional ``[B, T]`` float per-token loss weights (``demos.loss_weights``): the loss is then
                their weighted mean over the ``loss_mask`` tokens.
        """
        if tokens.shape != loss_mask.shape or loss_mask.dtype != torch.bool:
            raise ValueError(
                f"tokens {tuple(tokens.shape)} and loss_mask {tuple(loss_mask.shape)} {loss_mask.dtype} "
                "must be the same [B, T] shape, loss_mask bool"
            )
        if weights is not None and tuple(weights.shape) != tuple(tokens.shape):
            raise ValueError(f"weights {tuple(weights.shape)} must be the tokens' [B, T] shape {tuple(tokens.shape)}")
        t0 = time.perf_counter()
        tokens, loss_mask = tokens.to(self.runtime.device), loss_mask.to(self.runtime.device)
        self._optimizer.zero_grad()
        n = int(loss_mask.sum())  # the global denominator (every rank holds the whole batch)
        rows = parallel.dp_share(torch.arange(tokens.shape[0]), loss_mask, self.dp_rank, self.dp_size)
        loss: torch.Tensor | None = None
        if len(rows):
            logp = self._logprobs(tokens[rows], 1.0)  # [b, T]; supervised targets, no sampling temperature
            if weights is None:
                loss = -(logp * loss_mask[rows]).sum() / max(n, 1)
            else:
                w = weights.to(self.runtime.device) * loss_mask
                loss = -(logp * w[rows]).sum() / w.sum().clamp(min=1e-6)
        local = float(loss.detach()) if loss is not None else 0.0
        grad_norm, applied = math.nan, False
        if not parallel.all_finite(local):  # every rank skips together
            value = local if not math.isfinite(local) else math.nan
            self.nonfinite_loss_total += 1
            log.warning("non-finite SFT loss %s at version %d: step skipped", value, self.version)
        else:
            value = parallel.dp_sum([local])[0]
            if loss is not None:
                (loss * self.dp_size if self.dp_size > 1 else loss).backward()
            outcome = self._optimizer.step()
            grad_norm, applied = outcome.grad_norm, outcome.stepped
            if applied:
                self.version += 1
            else:
                self.nonfinite_grad_total += 1
        return SftStepMetrics(self.version, applied, value, grad_norm, n, time.perf_counter() - t0)

    # ---------------------------------------------------------------- old-logit provider
    def _new_provider(self) -> OldLogitProvider:
        s = self.settings
        return make_provider(
            s.correction.reference,
            ProviderSettings(
                max_staleness=s.max_staleness, ewma=s.correction.ewma, old_logits=s.old_logits, work_dir=s.work_dir
            ),
        )

    def _new_auditor(self) -> Auditor | None:
        """The audit of a cheap reference (``correction.audit.everyNSteps > 0``); None otherwise."""
        s = self.settings
        spec = getattr(s.correction, "audit", None)  # api: CorrectionSpec.audit (AuditSpec)
        every = int(getattr(spec, "every_n_steps", 0) or 0)
        if spec is None or every == 0:
            return None
        if self.reference is ReferencePolicy.EXACT:
            raise ValueError(
                f"correction.audit.everyNSteps is {every} with correction.reference: exact; exact old logits "
                "have nothing to audit: set everyNSteps: 0 or choose a cheap reference"
            )
        return Auditor(every, float(spec.fraction), seed=s.seed, capacity=s.max_staleness + 1)

    def renew_old_logits(self) -> None:
        """A fresh old-logit provider and audit in place of the current ones, whose weight versions (and
        files) are released first (a resume, :mod:`asyncrl.trainer.actor.checkpoint_io`, then loads their
        state)."""
        self.close()
        self.old_logits = self._new_provider()
        self.auditor = self._new_auditor()

    def _version_holders(self) -> list[VersionRetention]:
        """What keeps weight versions: the provider (snapshot strategy) and the audit."""
        holders: list[VersionRetention] = []
        if isinstance(self.old_logits, VersionRetention):
            holders.append(self.old_logits)
        if self.auditor is not None:
            holders.append(self.auditor)
        return holders

    def close(self) -> None:
        """Release the weight snapshots (``snapshot.device: disk``: delete their files)."""
        for holder in self._version_holders():
            holder.close()

    # ---------------------------------------------------------------- weights and checkpoints
    @property
    def gpt(self) -> Any:
        """megatron-core's ``GPTModel`` (untyped), not its DDP wrapper: what a checkpoint saves and loads."""
        return self._gpt

    @property
    def optimizer(self) -> compat.ActorOptimizer:
        """The optimizer (:func:`asyncrl.trainer.megatron.optimizers.make_optimizer`), whose state a
        checkpoint holds."""
        return self._optimizer

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """HF Llama-named fp32 CPU copies of the weights (weight sync to the rollout engine).

        Tied architectures list ``lm_head.weight`` as the same tensor as ``model.embed_tokens.weight``,
        so ``LlamaForCausalLM.load_state_dict(..., strict=True)`` accepts it. Under ``spec.model.lora``: the
        base's weights plus the adapters in peft's names with ``B`` scaled by ``alpha / rank``
        (:func:`~asyncrl.trainer.megatron.lora.hf_with_adapters`; the rollout engine merges them).
        """
        owners = dict(self._gpt.named_parameters())  # TP shards are gathered whole (a collective per shard)
        own = {
            k: (parallel.full_of(owners[k]) if k in owners else v.detach()).to("cpu", torch.float32).clone()
            for k, v in self._gpt.state_dict().items()
            if not k.endswith("_extra_state")
        }
        if self.lora is not None:  # the base's weights plus the adapters as s B and A (the engine merges them)
            return hf_with_adapters(own, self.settings.arch, self.lora.spec.scale)
        return megatron_to_hf(own, self.settings.arch)

    def load_hf_state_dict(self, hf: dict[str, torch.Tensor]) -> None:
        """Load HF Llama-named weights (shapes checked against the architecture)."""
        mcore = hf_to_megatron(hf, self.settings.arch)
        self._gpt.load_state_dict({k: v.to(self.runtime.device) for k, v in mcore.items()}, strict=True)

    def save_checkpoint(self, directory: str) -> None:
        """Model, optimizer, version, old-logit provider state (EWMA weights, snapshots) and counters;
        atomic (:func:`asyncrl.trainer.actor.checkpoint_io.save_actor`)."""
        save_actor(self, directory)

    def load_checkpoint(self, directory: str, *, old_logits: bool = True) -> None:
        """Restore everything :meth:`save_checkpoint` wrote (:func:`asyncrl.trainer.actor.checkpoint_io.load_actor`).

        ``old_logits=False`` (a warm start) leaves the old-logit provider fresh."""
        load_actor(self, directory, old_logits=old_logits)
