"""Stage 1 of :meth:`MegatronActor.train_step`: the reference a batch's updates train against, held
from the batch's arrival (before its first update) to its last update.

The old-logit provider's own forwards (``ewma``: ``theta_prox``; ``exact``: each version's snapshot) run
under the weights the provider names, no grad; then ``logp_ref = provider.logp_ref(batch,
logp_theta_at_arrival, version, scored)``. The arrival ``logp_theta`` is a no-grad forward, run only when
the provider (or the audit) reads it. With a single update on a single rank (``fused``) the gradient
forward runs under the arrival weights, so ``logp_ref`` is computed per micro-batch there instead.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from asyncrl.trainer.megatron.batch import TrainBatch
from asyncrl.trainer.megatron.update import micro_batches, select_rows
from asyncrl.trainer.oldlogits.registry import reads_logp_theta

if TYPE_CHECKING:
    from asyncrl.trainer.actor.megatron_actor import MegatronActor


@dataclass
class HeldReference:
    """The reference a batch's updates train against."""

    scored: torch.Tensor | None  # [B, T] the provider's own forwards (None: it has none)
    theta0: torch.Tensor | None  # [B, T] logp_theta at arrival (None: nothing reads it)
    held: torch.Tensor | None  # [B, T] logp_ref of every update (None: fused, computed per micro-batch)
    seen: torch.Tensor  # [B, T] logp_ref as the updates saw it (the audit compares it)


def hold_reference(actor: "MegatronActor", batch: TrainBatch, version: int, *, fused: bool,
                   audited: bool) -> HeldReference:
    """The provider's own forwards and, unless ``fused``, ``logp_ref`` of the whole batch now (every rank
    scores the whole batch, so all hold the same reference)."""
    s = actor.settings
    B, T = batch.shape
    arrival_chunks = micro_batches(torch.arange(B), T, s.micro_batch_tokens)
    scored = provider_scores(actor, batch, arrival_chunks)
    theta0: torch.Tensor | None = None
    held: torch.Tensor | None = None
    if not fused:
        if audited or reads_logp_theta(actor.reference, s.old_logits):
            theta0 = torch.cat([actor.logprobs(batch.tokens[c]) for c in arrival_chunks])
        # NaN stand-in: a provider that read logp_theta without being listed in READS_THETA would show
        # every token as non-finite (counted), never train on a wrong reference silently.
        stand_in = theta0 if theta0 is not None else torch.full_like(batch.logp_mu, math.nan)
        held = actor.old_logits.logp_ref(batch, stand_in, version, scored).detach()
    elif audited:
        theta0 = torch.full_like(batch.logp_mu, math.nan)  # filled from the gradient forward(s)
    seen = held if held is not None else torch.full_like(batch.logp_mu, math.nan)
    return HeldReference(scored=scored, theta0=theta0, held=held, seen=seen)


def provider_scores(actor: "MegatronActor", batch: TrainBatch, chunks: list[torch.Tensor]) -> torch.Tensor | None:
    """The provider's own forwards (``[B, T]`` or None) over the micro-batches ``chunks`` (consecutive rows
    in order), so that ``train.microBatchTokens`` bounds these forwards too."""
    if len(chunks) == 1:
        return actor.old_logits.score(batch, actor)
    parts = [actor.old_logits.score(select_rows(batch, c), actor) for c in chunks]
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if len(present) != len(parts):
        raise RuntimeError(f"old-logit provider {actor.reference.value} scored some micro-batches and not others")
    return torch.cat(present)
