"""The actor as a group of ranks: rendezvous, the model-parallel gradient norm and the DP reductions.

An actor of ``world`` ranks runs megatron's ``tensor x data`` parallel layout (pipeline and CPU expert
parallelism are refused by ``api/pods.py``). Every rank runs the same code on the same global batch
(SPMD): the row plan of a step is seeded and identical everywhere, each data-parallel rank trains a
token-balanced share of every minibatch (:func:`dp_share`), and whatever decides the control flow
(a loss being finite, the correction counts that drive the EWMA reset, the audit) is all-reduced so
that every rank decides alike and no rank waits in a collective the others skipped.

With one rank every function here is the identity (no collective runs), so the single-process actor is
unchanged.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch import Tensor

from asyncrl.trainer.collective.endpoint import Endpoint, new_endpoint
from asyncrl.trainer.correction.stats import CorrectionStats

# The process group's timeout (Layout.collective_timeout_s): long enough for the slowest wait one rank has on
# another inside a step or a checkpoint (a rank's share of a minibatch, rank 0 writing its shard), far below
# torch's own 30 min (NCCL) / megatron's 10 min that a rank blocked by a dead peer would otherwise sit out.
COLLECTIVE_TIMEOUT_S = 300.0

_MIN_FIELDS = ("rd_min", "rs_min")
_MAX_FIELDS = ("rd_max", "rs_max")


@dataclass(frozen=True)
class Layout:
    """Where one rank sits: ``world`` ranks, ``tp x pp x ep`` model parallel, DP = the rest.

    ``init_method`` is the process-group rendezvous (the :class:`~asyncrl.trainer.collective.endpoint.Endpoint`
    that :func:`rendezvous` drew on rank 0's node: its address and the group's token, which every rank proves to
    rank 0's store); None with ``world == 1`` = a private one-process group. ``collective_timeout_s``: how long a rank
    waits in the rendezvous or in one collective for the others (torch's ``init_process_group(timeout=)``).
    It is only the backstop: the driver notices a dead or failed rank within about a second and kills the
    group (``driver/actor_group.py``); this bounds the wait when nobody does (the driver itself gone).
    """

    tp: int = 1
    pp: int = 1
    ep: int = 1
    rank: int = 0
    world: int = 1
    init_method: Endpoint | None = None
    collective_timeout_s: float = COLLECTIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"rank {self.rank} of world {self.world}: need 0 <= rank < world, world >= 1")
        if self.world % (self.tp * self.pp * self.ep):
            raise ValueError(
                f"tensor x pipeline x expert parallel {self.tp} x {self.pp} x {self.ep} does not divide the "
                f"actor's {self.world} ranks"
            )
        if self.collective_timeout_s <= 0:
            raise ValueError(f"collective_timeout_s must be > 0 seconds, got {self.collective_timeout_s}")
        if self.world > 1 and self.init_method is None:
            raise ValueError(f"a group of {self.world} ranks needs init_method (rank 0's parallel.rendezvous())")
        if self.init_method is not None and not isinstance(self.init_method, Endpoint):
            raise ValueError(f"init_method {self.init_method!r} is not an Endpoint: a tcp:// (TCPStore) rendezvous "
                             "is open to anyone who reaches the port; use parallel.rendezvous()")

    @property
    def data_parallel(self) -> int:
        return self.world // (self.tp * self.pp)


def rendezvous(host: str | None = None) -> Endpoint:
    """A new rendezvous for the group's ``init_process_group`` (called on rank 0's host): a free port and a
    fresh token (:func:`~asyncrl.trainer.collective.endpoint.new_endpoint`).

    ``host`` defaults to this node's address as Ray sees it (the address the other ranks reach); a
    single-node run passes loopback (:func:`~asyncrl.trainer.collective.endpoint.bind_host`)."""
    return new_endpoint(host)


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def dp_group():  # -> ProcessGroup | None
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def dp_rank_size() -> tuple[int, int]:
    """This rank's data-parallel rank and the data-parallel size ((0, 1) in one process)."""
    if _world() == 1:
        return 0, 1
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_rank(), parallel_state.get_data_parallel_world_size()


def model_parallel_size() -> int:
    if _world() == 1:
        return 1
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size() * parallel_state.get_pipeline_model_parallel_world_size()


# ---------------------------------------------------------------- gradient norm
def grad_norm_squared(params: Sequence[Tensor]) -> Tensor:
    """The squared global L2 norm of ``params``' ``.grad`` (a 0-d fp32 tensor), megatron's rule
    (``get_grad_norm_fp32``): squares of tensor-parallel shards summed over the model-parallel group,
    replicated gradients (identical on every TP rank) counted once. DP ranks hold the same (reduced)
    gradients, so the result is the same on every rank."""
    device = params[0].device if params else torch.device("cpu")
    sharded = torch.zeros((), dtype=torch.float32, device=device)
    replicated = torch.zeros((), dtype=torch.float32, device=device)
    for p in params:
        if p.grad is None:
            continue
        sq = p.grad.detach().float().pow(2).sum()
        if getattr(p, "tensor_model_parallel", False):
            sharded = sharded + sq
        else:
            replicated = replicated + sq
    if model_parallel_size() > 1:
        from megatron.core import parallel_state

        buf = sharded.reshape(1).clone()
        dist.all_reduce(buf, group=parallel_state.get_model_parallel_group())
        sharded = buf[0]
    return sharded + replicated


def clip_grads(params: Sequence[Tensor], max_norm: float) -> float:
    """Scale ``params``' gradients so their global norm is at most ``max_norm``; the norm before.

    One process: ``torch.nn.utils.clip_grad_norm_`` (bit-identical to what the actor always did). Under
    tensor parallelism each shard would clip by its own norm (the study: log-probs off by 0.21 after
    three steps), so the norm is :func:`grad_norm_squared`'s, the same on every rank.
    """
    if model_parallel_size() == 1:
        return float(torch.nn.utils.clip_grad_norm_(list(params), max_norm))
    total = grad_norm_squared(params).sqrt()
    norm = float(total)
    if math.isfinite(norm):
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for p in params:
            if p.grad is not None:
                p.grad.detach().mul_(coef)
    return norm


# ---------------------------------------------------------------- data-parallel shares and reductions
def dp_share(rows: Tensor, loss_mask: Tensor, dp_rank: int, dp_size: int) -> Tensor:
    """This DP rank's rows ``[b_r]`` of a minibatch's ``rows`` ``[b]``: a token-balanced split.

    Greedy longest-first over the valid-token counts (``loss_mask`` ``[B, T]``, indexed by ``rows``),
    ties by row order, so every rank computes the same partition; each share is returned ascending.
    A share may be empty when there are fewer rows than ranks (that rank contributes zero gradient).
    """
    if dp_size == 1:
        return rows
    tokens = loss_mask[rows].sum(dim=1).tolist()
    order = sorted(range(len(tokens)), key=lambda i: (-tokens[i], i))
    loads = [0] * dp_size
    counts = [0] * dp_size
    owner = [0] * len(tokens)
    for i in order:
        r = min(range(dp_size), key=lambda k: (loads[k], counts[k], k))
        owner[i] = r
        loads[r] += int(tokens[i])
        counts[r] += 1
    mine = [i for i in range(len(tokens)) if owner[i] == dp_rank]
    return rows[torch.tensor(mine, dtype=torch.long)]


def all_finite(value: float) -> bool:
    """Whether ``value`` is finite on every rank (a MIN all-reduce of the flag: all ranks agree, and
    all take the same branch before the next collective)."""
    flag = 1.0 if math.isfinite(value) else 0.0
    if _world() == 1:
        return flag == 1.0
    buf = torch.tensor([flag], dtype=torch.float32)
    dist.all_reduce(buf, op=dist.ReduceOp.MIN)
    return bool(buf[0] == 1.0)


def dp_sum(values: Sequence[float]) -> list[float]:
    """``values`` summed over the data-parallel group (the same list on every rank)."""
    if dp_rank_size()[1] == 1:
        return list(values)
    buf = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(buf, group=dp_group())
    return buf.tolist()


def reduce_stats(stats: CorrectionStats[float]) -> CorrectionStats[float]:
    """One batch's correction counts over every DP rank: counts and sums add, the extremes are the
    min/max over the ranks that had a valid token (1 when none had one, as a single call reports)."""
    if dp_rank_size()[1] == 1:
        return stats
    names = [f.name for f in fields(CorrectionStats)]
    valid = float(stats.valid_tokens) > 0
    sums = torch.tensor([0.0 if n in _MIN_FIELDS + _MAX_FIELDS else float(getattr(stats, n)) for n in names],
                        dtype=torch.float64)
    lows = torch.tensor([float(getattr(stats, n)) if valid else math.inf for n in _MIN_FIELDS], dtype=torch.float64)
    highs = torch.tensor([-float(getattr(stats, n)) if valid else math.inf for n in _MAX_FIELDS], dtype=torch.float64)
    group = dp_group()
    dist.all_reduce(sums, group=group)
    extremes = torch.cat([lows, highs])
    dist.all_reduce(extremes, op=dist.ReduceOp.MIN, group=group)
    out: dict[str, float] = dict(zip(names, sums.tolist(), strict=True))
    for i, n in enumerate(_MIN_FIELDS):
        out[n] = float(extremes[i]) if math.isfinite(float(extremes[i])) else 1.0
    for i, n in enumerate(_MAX_FIELDS):
        v = -float(extremes[len(_MIN_FIELDS) + i])
        out[n] = v if math.isfinite(v) else 1.0
    return CorrectionStats(**out)


# ---------------------------------------------------------------- full tensors <-> tensor-parallel shards
def shard_of(param: Tensor, full: Tensor) -> Tensor:
    """This TP rank's slice of the full megatron tensor ``full`` for ``param`` (megatron's CPU-init rule:
    ``tp x stride`` pieces along ``partition_dim``, rank ``r`` keeps pieces ``r, r + tp, ...``)."""
    from megatron.core import parallel_state

    tp = parallel_state.get_tensor_model_parallel_world_size() if _world() > 1 else 1
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return full
    d, stride = param.partition_dim, param.partition_stride  # type: ignore[attr-defined]
    pieces = torch.split(full, full.shape[d] // (tp * stride), dim=d)
    return torch.cat(pieces[parallel_state.get_tensor_model_parallel_rank()::tp], dim=d)


def full_of(param: Tensor) -> Tensor:
    """The full megatron tensor of ``param`` gathered over its TP group (the inverse of :func:`shard_of`;
    a collective: every TP rank calls it for the same parameters in the same order)."""
    from megatron.core import parallel_state

    t = param.detach()
    tp = parallel_state.get_tensor_model_parallel_world_size() if _world() > 1 else 1
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return t
    d, stride = param.partition_dim, param.partition_stride  # type: ignore[attr-defined]
    shards = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(shards, t.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
    sub = [s.chunk(stride, dim=d) for s in shards]  # sub[r][s] = piece r + s * tp
    return torch.cat([sub[k % tp][k // tp] for k in range(tp * stride)], dim=d)
