"""A weight version handed on inside a dedicated scorer gang: rank 0 -> every peer, over the gang's own group.

Under ``actor.weightSync.transport: broadcast`` only the gang's rank 0 is a member of the job's weight-sync
group (:mod:`.dedicated`); this passes what it received to the gang's other ranks over the gang's process
group (the default group of each rank's process: the gang is its whole world). The tensors travel as one flat
buffer per dtype, so a version is ``1 + number of dtypes`` collectives whatever its tensor count. Each peer
then holds the full HF tensors and keeps its slice when it advances to the version (as under the object store).
"""

from collections.abc import Mapping

import torch
import torch.distributed as dist

ShareMeta = list[tuple[str, tuple[int, ...], str]]  # (name, shape, dtype name) in buffer order


def share_from_rank0(state: Mapping[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    """Every rank of the gang calls this (SPMD); rank 0 passes ``state`` (None: it got nothing, every rank
    returns None), the others pass None and get rank 0's tensors (CPU, rank 0's dtypes and shapes)."""
    meta: list[ShareMeta | None] = [None]
    if dist.get_rank() == 0 and state is not None:
        meta = [[(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in state.items()]]
    dist.broadcast_object_list(meta, src=0)
    if meta[0] is None:
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    by_dtype: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for name, shape, dtype in meta[0]:
        by_dtype.setdefault(dtype, []).append((name, shape))
    out: dict[str, torch.Tensor] = {}
    for dtype_name, entries in sorted(by_dtype.items()):
        dtype = getattr(torch, dtype_name)
        sizes = [int(torch.Size(shape).numel()) for _, shape in entries]
        if dist.get_rank() == 0:
            assert state is not None  # meta is None otherwise
            flat = torch.cat([state[n].reshape(-1).to(dtype) for n, _ in entries]).to(device)
        else:
            flat = torch.empty(sum(sizes), dtype=dtype, device=device)
        dist.broadcast(flat, src=0)
        for (name, shape), piece in zip(entries, torch.split(flat.cpu(), sizes), strict=True):
            out[name] = piece.view(shape)
    return out
