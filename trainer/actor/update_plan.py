"""The update plan of one rollout batch, the actor's pure parts of its update step: which rows each optimizer
update trains, its micro-batches, and the sums of the correction counts over them
(:meth:`asyncrl.trainer.actor.megatron_actor.MegatronActor.train_step` runs the plan).

One rollout batch of ``B`` rows makes ``epochs x minibatches`` optimizer updates and **one** policy
version (``api/job.py`` ``TrainSpec``):

1. Each epoch is one pass over the batch. With ``minibatches > 1`` its rows are shuffled by a generator
   seeded from ``(train.seed, version, epoch)`` (the same on a rerun) and split into ``minibatches``
   near-equal parts (sizes differ by at most one unit). More minibatches than rows train one row each.
2. GRPO groups stay together when that is free: ``assemble_batch`` lays a batch out as consecutive
   groups, so when ``B`` is a multiple of ``task.groupSize`` and there are at least as many groups as
   minibatches, whole groups are shuffled and split. The advantages are already computed, so this only
   keeps a group's rows under one update; a batch that does not fit falls back to rows.
3. With one minibatch the rows stay in batch order and are not shuffled (every epoch sees the whole batch).
4. A minibatch runs as micro-batches of at most ``train.microBatchTokens`` padded tokens
   (``rows x T``; one row is never split; 0 = one forward) whose gradients accumulate into the update.
"""

import math
from collections.abc import Sequence
from dataclasses import fields, replace

import torch
from torch import Tensor

from asyncrl.api.correction import LossAggregation
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.correction.stats import CorrectionStats

_MIN_FIELDS = ("rd_min", "rs_min")  # extremes of CorrectionStats: combined by min/max, not summed
_MAX_FIELDS = ("rd_max", "rs_max")


def update_rows(
    batch_size: int, *, minibatches: int, epochs: int, seed: int, version: int, group_size: int = 1
) -> list[Tensor]:
    """The rows ``[b]`` (long, ascending) of every optimizer update of one batch, in training order:
    ``epochs x min(minibatches, batch_size)`` updates (see the module docstring)."""
    if batch_size < 1 or minibatches < 1 or epochs < 1 or group_size < 1:
        raise ValueError(
            f"update_rows needs batch_size, minibatches, epochs, group_size >= 1; got {batch_size}, "
            f"{minibatches}, {epochs}, {group_size}"
        )
    m = min(minibatches, batch_size)
    if m == 1:
        return [torch.arange(batch_size) for _ in range(epochs)]
    groups = batch_size // group_size
    unit = group_size if group_size > 1 and batch_size % group_size == 0 and groups >= m else 1
    units = batch_size // unit
    out: list[Tensor] = []
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(((seed * 1_000_003 + version) * 1_009 + epoch) % 2**63)
        order = torch.randperm(units, generator=g)
        for part in torch.tensor_split(order, m):
            rows = (part[:, None] * unit + torch.arange(unit)).reshape(-1)  # [units_in_part * unit]
            out.append(rows.sort().values)
    return out


def micro_batches(rows: Tensor, seq_len: int, max_tokens: int) -> list[Tensor]:
    """``rows`` ``[b]`` in chunks of ``max(1, max_tokens // seq_len)`` rows (``max_tokens = 0``: one chunk)."""
    if max_tokens < 0:
        raise ValueError(f"train.microBatchTokens must be >= 0; got {max_tokens}")
    if max_tokens == 0:
        return [rows]
    per = max(1, max_tokens // max(seq_len, 1))
    return list(torch.split(rows, per))


def select_rows(batch: TrainBatch, rows: Tensor) -> TrainBatch:
    """The batch restricted to ``rows`` ``[b]`` (every ``[B, T]`` field indexed on dim 0)."""
    picked = {f.name: getattr(batch, f.name)[rows] for f in fields(batch) if getattr(batch, f.name) is not None}
    return replace(batch, **picked)


def sum_stats(records: Sequence[CorrectionStats[Tensor]]) -> CorrectionStats[Tensor]:
    """The counts of several ``correction_loss`` calls as one record (no host sync).

    Counts and sums add; the extremes (``rd_min``, ``rd_max``, ``rs_min``, ``rs_max``) are the min/max
    over the calls with a valid token (a call without one reports the neutral 1, which must not count),
    and 1 when no call had one -- the same convention as a single call.
    """
    if not records:
        raise ValueError("sum_stats needs at least one CorrectionStats record")
    valid = torch.stack([r.valid_tokens for r in records])  # [n]
    has = valid > 0
    out: dict[str, Tensor] = {}
    for f in fields(CorrectionStats):
        values = torch.stack([getattr(r, f.name) for r in records])  # [n]
        if f.name in _MIN_FIELDS:
            picked = torch.where(has, values, torch.full_like(values, math.inf)).amin()
        elif f.name in _MAX_FIELDS:
            picked = torch.where(has, values, torch.full_like(values, -math.inf)).amax()
        else:
            out[f.name] = values.sum()
            continue
        out[f.name] = torch.where(has.any(), picked, torch.ones_like(picked))
    return CorrectionStats(**out)


class LossShare:
    """Rescales a micro-batch's loss so that the micro-batches of one minibatch sum to the minibatch's loss.

    ``correction_loss`` divides by its own call's denominator (``tokenMean``: valid tokens;
    ``sequenceMean``: sequences with a valid token); multiplying by ``own / minibatch`` puts every
    micro-batch over the minibatch's denominator, so ``k`` micro-batches give the gradient of one forward.
    The minibatch's denominator is counted from ``loss_mask`` before the forwards run (a token whose
    ``logp_theta`` turns out non-finite stays in it; such tokens are counted in ``nonfinite_tokens``).

    Args:
        loss_mask: ``[b, T]`` bool, the minibatch's.
        aggregation: ``correction.lossAggregation``.
    """

    def __init__(self, loss_mask: torch.Tensor, aggregation: LossAggregation) -> None:
        self.tokens = aggregation is LossAggregation.TOKEN_MEAN
        count = loss_mask.sum() if self.tokens else loss_mask.any(dim=1).sum()
        self.total = count.clamp(min=1).to(torch.float32)

    def __call__(self, loss: torch.Tensor, metrics: CorrectionStats[torch.Tensor]) -> torch.Tensor:
        own = metrics.valid_tokens if self.tokens else metrics.valid_seqs
        return loss * (own.clamp(min=1.0) / self.total)


def in_bounds_ratio(stats: CorrectionStats[float]) -> float:
    """Share of valid tokens whose (level-aggregated) ``r_d`` lies inside ``mask.bounds``, whatever
    ``mask.mode``: ``1 - (rd_below_tokens + rd_above_tokens) / valid_tokens`` (1 when none is valid).
    The EWMA reset reads it (:mod:`asyncrl.trainer.correction.ewma_controller`): the keep ratio under ``mask``
    (vetoed sequences aside) that ``truncate`` and ``none`` would have, where nothing is rejected."""
    if stats.valid_tokens <= 0:
        return 1.0
    return 1.0 - (stats.rd_below_tokens + stats.rd_above_tokens) / stats.valid_tokens
