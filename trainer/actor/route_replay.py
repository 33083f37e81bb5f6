"""Routing replay in the actor's step (``spec.correction.routingReplay``; docs/architecture.md, routing replay).

- ``rollout`` (R3): the batch arrives with the rollout engine's routes (``TrainBatch.routes``); every forward
  that scores it replays them: the ``current``/``ewma`` reference forward, the training forward, and, per
  version, the exact snapshot forward (``route_slots``). Nothing to do here but count flips.
- ``oldLogits`` (R2): :func:`old_logit_routes` records the routes of a forward under the reference's weights
  (``current``: the live weights at arrival; ``ewma``: ``theta_prox``) and puts them on the batch, so that the
  reference forward (same weights, same routes: bit-identical) and the training forward replay them. One extra
  no-grad forward per batch (the reference forward is not fused with the recording).

:func:`count_route_flips` reads, after a replayed training forward, which trained tokens the model's own router
would have routed elsewhere (trainer/megatron/routing_replay.py notes it per layer): the route-flip share.
"""

from dataclasses import replace
from typing import Any, Protocol, TypedDict

import torch

from asyncrl.api.correction import ReferencePolicy, RoutingReplay
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.reports import UpdateTally
from asyncrl.trainer.actor.settings import ActorSettings
from asyncrl.trainer.actor.update_plan import micro_batches
from asyncrl.trainer.megatron import parallel
from asyncrl.trainer.megatron.routing_replay import flipped_positions, recording, replays_of
from asyncrl.trainer.oldlogits import OldLogitProvider


class RecordingActor(Protocol):
    """What R2 needs of the actor."""

    @property
    def settings(self) -> ActorSettings: ...

    @property
    def old_logits(self) -> OldLogitProvider: ...

    @property
    def gpt(self) -> Any: ...

    def logprobs(self, tokens: torch.Tensor, *, temperature: float | None = None,
                 routes: torch.Tensor | None = None) -> torch.Tensor: ...

    def logprobs_under(self, weights: Any, tokens: torch.Tensor, routes: torch.Tensor | None = None) -> torch.Tensor: ...


def old_logit_routes(actor: RecordingActor, batch: TrainBatch) -> TrainBatch:
    """R2: ``batch`` with ``routes`` ``[B, T, L, k]`` recorded under the reference's weights (micro-batches of
    ``train.microBatchTokens``); any other mode: ``batch`` as it is."""
    s = actor.settings
    if s.correction.routing_replay is not RoutingReplay.OLD_LOGITS:
        return batch
    reference = s.correction.reference
    if reference not in (ReferencePolicy.CURRENT, ReferencePolicy.EWMA):
        raise ValueError(f"routingReplay oldLogits records in the reference forward of current or ewma; "
                         f"reference {reference.value!r} is refused at validation")
    weights = actor.old_logits.weights(actor) if reference is ReferencePolicy.EWMA else None  # type: ignore[attr-defined]
    B, T = batch.shape
    parts = []
    for rows in micro_batches(torch.arange(B), T, s.micro_batch_tokens):
        tokens = batch.tokens[rows]
        with recording(actor.gpt) as rec:
            if weights is None:
                actor.logprobs(tokens)
            else:
                actor.logprobs_under(weights, tokens)
        parts.append(rec.routes(len(rows), T))
    return replace(batch, routes=torch.cat(parts).to(batch.tokens.device), route_slots=None,
                   route_slot_versions=None)


def count_route_flips(gpt: Any, sub: TrainBatch, tally: UpdateTally) -> None:
    """After the training forward of ``sub``: its trained tokens whose logit's position (``t - 1``) the model's
    own router would have routed elsewhere in >= 1 layer, and the trained tokens, into ``tally``."""
    if sub.routes is None:
        return
    flips = flipped_positions(replays_of(gpt), *sub.shape)  # [b, T] by position
    if flips is None:
        return
    # token t is scored by the output at position t - 1 (trainer/megatron/logprobs.py)
    by_token = torch.nn.functional.pad(flips[:, :-1], (1, 0)).to(sub.loss_mask.device)
    tally.route_flips.append((by_token & sub.loss_mask).sum())
    tally.route_tokens.append(sub.loss_mask.sum())


class RouteFlipCounts(TypedDict):
    """The ``route_*`` fields of a step's metrics (typed, so they unpack into ``TrainStepMetrics``)."""

    route_flips: float
    route_tokens: float


def route_flip_counts(tally: UpdateTally) -> RouteFlipCounts:
    """``{"route_flips", "route_tokens"}`` of the step's training forwards, summed over the DP ranks."""
    flips = float(sum(tally.route_flips)) if tally.route_flips else 0.0
    tokens = float(sum(tally.route_tokens)) if tally.route_tokens else 0.0
    flips, tokens = parallel.dp_sum([flips, tokens])
    return {"route_flips": flips, "route_tokens": tokens}
