"""Stage 1 of :meth:`MegatronActor.train_step`: the reference a batch's updates train against, held
from the batch's arrival (before its first update) to its last update.

The old-logit provider's own forwards (``ewma``: ``theta_prox``; ``exact``: each version's snapshot) run
under the weights the provider names, no grad; then ``logp_ref = provider.logp_ref(batch,
logp_theta_at_arrival, version, scored)``. The arrival ``logp_theta`` is a no-grad forward, run only when
the provider (or the audit) reads it. With a single update on a single rank (``fused``) the gradient
forward runs under the arrival weights, so ``logp_ref`` is computed per micro-batch there instead.

Under data parallelism each DP rank runs these forwards over its token-balanced share of the batch's rows
only (:func:`asyncrl.trainer.megatron.parallel.dp_share`, the split the updates use; the TP ranks of one DP
replica share a DP rank, so they score the same rows in lockstep), and the shares' results are all-gathered
over the DP group: every rank then holds the same ``[B, T]`` reference as one process would, at ``1/DP`` of
the forwards. Providers treat rows independently (``protocol.py``), so a share's values are the batch's.

What this stage needs of the actor is :class:`ReferenceActor` (the
:class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor` is one): the actor imports this module, never the
other way round.
"""

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.settings import ActorSettings
from asyncrl.trainer.actor.update_plan import micro_batches, select_rows
from asyncrl.trainer.megatron import parallel
from asyncrl.trainer.oldlogits.protocol import OldLogitProvider, Scorer
from asyncrl.trainer.oldlogits.registry import reads_logp_theta


class ReferenceActor(Scorer, Protocol):
    """What stage 1 needs of the actor: the provider's :class:`Scorer` (its version, weights and forwards),
    its settings (micro-batch budget, old-logit spec), its reference and provider, and its DP rank."""

    @property
    def settings(self) -> ActorSettings: ...

    @property
    def reference(self) -> ReferencePolicy: ...

    @property
    def old_logits(self) -> OldLogitProvider: ...

    @property
    def dp_rank(self) -> int: ...

    @property
    def dp_size(self) -> int: ...


@dataclass
class HeldReference:
    """The reference a batch's updates train against."""

    scored: torch.Tensor | None  # [B, T] the provider's own forwards (fused only; None otherwise or when it has none)
    theta0: torch.Tensor | None  # [B, T] logp_theta at arrival (None: nothing reads it)
    held: torch.Tensor | None  # [B, T] logp_ref of every update (None: fused, computed per micro-batch)
    seen: torch.Tensor  # [B, T] logp_ref as the updates saw it (the audit compares it)
    rows: torch.Tensor  # [b_r] the batch rows this rank's reference forwards ran over (all B alone)


def hold_reference(actor: ReferenceActor, batch: TrainBatch, version: int, *, fused: bool,
                   audited: bool) -> HeldReference:
    """The provider's own forwards and, unless ``fused``, ``logp_ref`` of the whole batch now (each DP rank
    scores its share, the shares are all-gathered: every rank holds the same reference)."""
    B, T = batch.shape
    every = torch.arange(B)
    if fused:  # one update on one rank: logp_ref comes with each micro-batch's gradient forward
        scored = provider_scores(actor, batch, micro_batches(every, T, actor.settings.micro_batch_tokens))
        theta0 = torch.full_like(batch.logp_mu, math.nan) if audited else None  # filled by the gradient forwards
        return HeldReference(scored=scored, theta0=theta0, held=None,
                             seen=torch.full_like(batch.logp_mu, math.nan), rows=every)
    shares = [parallel.dp_share(every, batch.loss_mask, r, actor.dp_size) for r in range(actor.dp_size)]
    mine = shares[actor.dp_rank]
    theta0, held = _share_reference(actor, batch, mine, version,
                                    audited or reads_logp_theta(actor.reference, actor.settings.old_logits))
    if actor.dp_size > 1:
        held = gather_rows(held, shares, B)
        theta0 = None if theta0 is None else gather_rows(theta0, shares, B)
    return HeldReference(scored=None, theta0=theta0, held=held, seen=held, rows=mine)


def _share_reference(actor: ReferenceActor, batch: TrainBatch, mine: torch.Tensor, version: int,
                     arrival: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``(theta0, logp_ref)``, each ``[b_r, T]``, of this rank's rows ``mine`` ``[b_r]`` (the whole batch alone).

    A rank whose share is empty (fewer rows than DP ranks) runs the provider over one stand-in row and drops
    the result, so that the provider's own collectives (the node-shared snapshot store's write barrier when
    it records a version) pair up on every rank."""
    B, T = batch.shape
    n = len(mine)
    alone = actor.dp_size == 1
    part = batch if alone else select_rows(batch, mine if n else torch.arange(min(B, 1)))
    chunks = micro_batches(torch.arange(part.shape[0]), T, actor.settings.micro_batch_tokens)
    scored = provider_scores(actor, part, chunks)
    theta0 = torch.cat([actor.logprobs(part.tokens[c], routes=None if part.routes is None else part.routes[c])
                        for c in chunks]) if arrival else None
    # NaN stand-in: a provider that read logp_theta without being listed in READS_THETA would show
    # every token as non-finite (counted), never train on a wrong reference silently.
    stand_in = theta0 if theta0 is not None else torch.full_like(part.logp_mu, math.nan)
    held = actor.old_logits.logp_ref(part, stand_in, version, scored).detach()
    return (None if theta0 is None else theta0[:n]), held[:n]


def gather_rows(part: torch.Tensor, shares: list[torch.Tensor], batch_size: int) -> torch.Tensor:
    """The ``[B, T]`` tensor whose rows ``shares[r]`` are DP rank ``r``'s ``part`` (``[b_r, T]``, this rank's):
    one all-gather over the DP group of the parts padded to the largest share (the same on every rank)."""
    widest = max(len(s) for s in shares)
    pad = torch.full((widest, *part.shape[1:]), math.nan, dtype=part.dtype, device=part.device)
    pad[: len(part)] = part
    pieces = [torch.empty_like(pad) for _ in shares]
    dist.all_gather(pieces, pad, group=parallel.dp_group())
    out = torch.full((batch_size, *part.shape[1:]), math.nan, dtype=part.dtype, device=part.device)
    for rows, piece in zip(shares, pieces, strict=True):
        out[rows.to(part.device)] = piece[: len(rows)]
    return out


def provider_scores(actor: ReferenceActor, batch: TrainBatch,
                    chunks: list[torch.Tensor]) -> torch.Tensor | None:
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
