"""The ``broadcast`` transport: buckets by a ``torch.distributed`` collective from one source rank.

A *weight-sync group* is its own process group -- the actor's source rank plus every receiver (rollout
workers, dedicated scorers) -- built from a ``TCPStore`` rendezvous directly as a ``ProcessGroupGloo``
(CPU) or ``ProcessGroupNCCL`` (GPU), so it lives beside the actor's megatron world and the receivers
need no default group (as ``ray.util.collective`` and verl's checkpoint engine do). Per version the
source broadcasts, for each bucket, its pickled manifest (length then bytes) and then the bucket;
an empty manifest ends the version. The bytes cross once whatever the number of receivers (slime
``update_weight_from_distributed.py``: ``dist.broadcast`` per bucket; reference/distributed-actor.md §2).

Every member must call :func:`send` (source) or :func:`receive` (the others) for every version, in
order: a collective with a missing member blocks until the group's timeout.
"""

import datetime
import pickle
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from asyncrl.trainer.weightsync.buckets import Bucket, BucketManifest, unpack_bucket
from asyncrl.trainer.weightsync.objectstore import Received

Backend = Literal["gloo", "nccl"]


@dataclass
class SyncGroup:
    """One member of a weight-sync group: ``rank`` of ``world`` (``src`` sends), on ``device``."""

    pg: Any  # ProcessGroupGloo | ProcessGroupNCCL
    store: Any  # the TCPStore (kept alive with the group)
    rank: int
    world: int
    src: int
    device: torch.device

    def _bcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = self.src
        self.pg.broadcast([t], opts).wait()


def open_group(host: str, port: int, rank: int, world: int, *, src: int = 0, backend: Backend = "gloo",
               timeout_s: float = 300.0, device: torch.device | None = None) -> SyncGroup:
    """Join the weight-sync group at ``host:port`` (rank 0 serves the store); blocks until all ``world`` join."""
    if not 0 <= src < world or not 0 <= rank < world:
        raise ValueError(f"weight sync (broadcast): rank {rank} and src {src} must be in [0, {world})")
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout)
    pg: Any
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world, opts)
        dev = device or torch.device("cuda", torch.cuda.current_device())
    elif backend == "gloo":
        pg = dist.ProcessGroupGloo(store, rank, world, timeout)
        dev = device or torch.device("cpu")
    else:
        raise ValueError(f"weight sync (broadcast): backend {backend!r}; valid: 'gloo', 'nccl'")
    return SyncGroup(pg, store, rank, world, src, dev)


def _send_manifest(group: SyncGroup, manifest: BucketManifest | None) -> None:
    payload = torch.frombuffer(bytearray(pickle.dumps(manifest)), dtype=torch.uint8).to(group.device)
    group._bcast(torch.tensor([payload.numel()], dtype=torch.int64, device=group.device))
    group._bcast(payload)


def _receive_manifest(group: SyncGroup) -> BucketManifest | None:
    n = torch.zeros(1, dtype=torch.int64, device=group.device)
    group._bcast(n)
    payload = torch.empty(int(n.item()), dtype=torch.uint8, device=group.device)
    group._bcast(payload)
    out: BucketManifest | None = pickle.loads(payload.cpu().numpy().tobytes())  # noqa: S301 -- our own group
    return out


def send(group: SyncGroup, buckets: Iterable[Bucket]) -> tuple[int, float]:
    """Broadcast one version's buckets from the source; returns (payload bytes, seconds)."""
    if group.rank != group.src:
        raise RuntimeError(f"weight sync (broadcast): rank {group.rank} is not the source {group.src}")
    t0, nbytes = time.perf_counter(), 0
    for b in buckets:
        _send_manifest(group, b.manifest)
        group._bcast(b.data.to(group.device))
        nbytes += sum(e.nbytes for e in b.manifest.entries)
    _send_manifest(group, None)
    return nbytes, time.perf_counter() - t0


def receive_version(group: SyncGroup, version: int) -> Received:
    """Receive one version and say how long it took (the receiver's generation keeps running meanwhile);
    buckets of another version than ``version`` are an error (the driver and the source disagree)."""
    t0 = time.perf_counter()
    state: dict[str, torch.Tensor] = {}
    versions: set[int] = set()
    nbytes = 0
    while (manifest := _receive_manifest(group)) is not None:
        data = torch.empty(manifest.nbytes, dtype=torch.uint8, device=group.device)
        group._bcast(data)
        versions.add(manifest.version)
        nbytes += sum(e.nbytes for e in manifest.entries)
        state |= unpack_bucket(manifest, data)
    if versions != {version}:
        raise RuntimeError(f"weight sync (broadcast): expected version {version}, received buckets of {sorted(versions)}")
    return Received(state, version, time.perf_counter() - t0, nbytes)


def receive(group: SyncGroup) -> dict[str, torch.Tensor]:
    """Receive one version (on ``group.device``); the HF state dict as views of the received buckets."""
    out: dict[str, torch.Tensor] = {}
    while (manifest := _receive_manifest(group)) is not None:
        data = torch.empty(manifest.nbytes, dtype=torch.uint8, device=group.device)
        group._bcast(data)
        out |= unpack_bucket(manifest, data)
    return out
