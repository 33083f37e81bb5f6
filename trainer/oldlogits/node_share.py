"""One copy of a weight version per (node, model-parallel shard): the data-parallel replicas of a node share it.

Why: the replicas of one tensor/pipeline shard hold bit-identical weights (the same reduced gradients, the
same optimizer step), so a snapshot per replica is pure waste: at 4B, DP=8 on one node and W=2 it is 386 GB
of host memory (``docs/architecture.md`` (memory of snapshots and scorers)). Instead, among the ranks of one
data-parallel group that run on the same node and were given the same base folder, the lowest DP rank
writes each version once, as ``v{version}-tp{t}-pp{p}-n{node}.safetensors``, and every one of them (the
writer too) maps that file: the pages are the node's page cache (``device: cpu``: a folder in ``/dev/shm``,
so the versions stay in host memory, once), and a replica's own memory holds none of it.

Rules:

1. **Placement is agreed once**, by a collective over the DP group (every rank calls it at the same point
   of the step: the first version it records), from each rank's node name and base folder; the lowest DP
   rank of each sharing set draws the folder token (``device: cpu`` and a disk store without ``work_dir``).
2. **A write is fenced**: the writer saves to a temporary name, renames it (a reader never sees half a
   file) and the DP group meets at a barrier before anyone maps it; every rank records the same versions
   in the same order (SPMD), so the barriers pair up.
3. **Release**: every rank drops its mapping; the writer also unlinks the file (a reader's mapping stays
   valid until it drops it: POSIX keeps the pages of an unlinked, still-mapped file).
4. **Alone** (one process, DP=1, or no other replica on this node with this base folder) nothing is shared
   and the store keeps its private copy, exactly as before (no collective).
5. The node's name is the host name: a Kubernetes pod (its own ``/dev/shm``), locally the machine.
"""

import os
import socket
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHM_ROOT = Path("/dev/shm")  # host memory as files (tmpfs), shared by the processes of a node


def node_name() -> str:
    """The name of this rank's node (rule 5)."""
    return socket.gethostname()


def memory_root() -> Path:
    """Where ``device: cpu`` shared versions live: ``/dev/shm`` (tmpfs), else the temporary folder."""
    return SHM_ROOT if SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK) else Path(tempfile.gettempdir())


def private_suffix() -> str:
    """The end of a private (unshared) file's name: ``-rank<r>`` in a group (its ranks may have been given
    one folder), nothing in one process."""
    import torch.distributed as dist

    return f"-rank{dist.get_rank()}" if dist.is_initialized() and dist.get_world_size() > 1 else ""


@dataclass(frozen=True)
class SharedPlace:
    """How this rank shares the versions of its shard with the other DP replicas on its node."""

    folder: Path  # where the node's copies live (agreed by the sharing set)
    writer: bool  # this rank writes the node's copy (the lowest DP rank of the set)
    sharers: int  # DP ranks of the set (>= 2)
    owns_folder: bool  # the writer drew the folder (token) and removes it on close
    tag: str  # ``tp{t}-pp{p}-n{node}``: the shard and node in every file name
    group: Any  # the DP process group (the write barrier)

    def file(self, version: int) -> Path:
        return self.folder / f"v{version}-{self.tag}.safetensors"

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)


def place(base: Path | None, fresh_root: Path, prefix: str = "asyncrl-snapshots-") -> SharedPlace | None:
    """Agree where this rank's versions live (a collective over the DP group; None = alone, rule 4).

    Args:
        base: the folder the store was given (a disk store's ``work_dir``); None = a fresh folder
            ``<fresh_root>/<prefix><token>``, removed by its writer on close.
        fresh_root: :func:`memory_root` (``device: cpu``) or the temporary folder (disk without ``work_dir``).
    """
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group()
    if dist.get_world_size(group) == 1:
        return None
    # the sharing key: same node, same base folder (a fresh folder: same root)
    where = str((base if base is not None else fresh_root).resolve())
    me = {"node": node_name(), "base": where, "fresh": base is None, "token": uuid.uuid4().hex}
    everyone: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, me, group=group)  # indexed by DP rank
    dp_rank = dist.get_rank(group)
    mates = [r for r, other in enumerate(everyone)
             if (other["node"], other["base"], other["fresh"]) == (me["node"], me["base"], me["fresh"])]
    if len(mates) == 1:
        return None
    nodes = sorted({other["node"] for other in everyone})
    lead = everyone[mates[0]]
    folder = base if base is not None else fresh_root / f"{prefix}{lead['token']}"
    tag = (f"tp{parallel_state.get_tensor_model_parallel_rank()}-pp{parallel_state.get_pipeline_model_parallel_rank()}"
           f"-n{nodes.index(me['node'])}")
    writer = dp_rank == mates[0]
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
    return SharedPlace(folder=folder, writer=writer, sharers=len(mates), owns_folder=base is None, tag=tag,
                       group=group)
