"""The ``broadcast`` transport: buckets by a ``torch.distributed`` collective from one source rank.

A *weight-sync group* is its own process group -- the actor's source rank plus every receiver (rollout
workers, dedicated scorers) -- built directly as a ``ProcessGroupGloo`` (CPU) or ``ProcessGroupNCCL`` (GPU)
over the group's authenticated store (:mod:`asyncrl.trainer.collective`: rank 0 serves it on the
endpoint's address, every member proves the group's token on connect), so it lives beside the actor's
megatron world and the receivers need no default group (as ``ray.util.collective`` and verl's checkpoint
engine do). Per version the source broadcasts, for each bucket, its manifest as JSON (length then bytes,
:mod:`.manifest_wire`) and then the bucket; the end marker ``null`` ends the version. The bytes cross once
whatever the number of receivers (slime ``update_weight_from_distributed.py``: ``dist.broadcast`` per
bucket). A receiver checks every length it reads against a cap before it allocates.

Every member must call :func:`send` (source) or :func:`receive_version` (the others) for every version, in
order: a collective with a missing member blocks until the group's timeout.
"""

import datetime
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from asyncrl.trainer.collective.endpoint import Endpoint, is_loopback
from asyncrl.trainer.collective.groups import join
from asyncrl.trainer.weight_sync import manifest_wire
from asyncrl.trainer.weight_sync.buckets import Bucket, BucketManifest, unpack_bucket
from asyncrl.trainer.weight_sync.outcome import Received

Backend = Literal["gloo", "nccl"]


@dataclass(frozen=True)
class BroadcastVersion:
    """The handle of a ``broadcast`` version: its bytes travel in the group's collective, not here."""

    version: int


@dataclass
class SyncGroup:
    """One member of a weight-sync group: ``rank`` of ``world`` (``src`` sends), on ``device``."""

    pg: Any  # ProcessGroupGloo | ProcessGroupNCCL
    store: Any  # the group's AuthStore (kept alive with the group: NCCL meets through it at the first collective)
    rank: int
    world: int
    src: int
    device: torch.device
    server: Any = None  # rank 0: the store's StoreServer, closed when the group is dropped
    max_bucket_bytes: int = manifest_wire.MAX_BUCKET_BYTES  # the largest bucket a receiver allocates

    def _bcast(self, t: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = self.src
        self.pg.broadcast([t], opts).wait()


def open_group(endpoint: Endpoint, rank: int, world: int, *, src: int = 0, backend: Backend = "gloo",
               timeout_s: float = 300.0, device: torch.device | None = None,
               max_bucket_bytes: int = manifest_wire.MAX_BUCKET_BYTES) -> SyncGroup:
    """Join the weight-sync group at ``endpoint`` (rank 0 serves its store); blocks until all ``world`` join.
    A member with another token is refused by the store (this one raises ``StoreAuthError``)."""
    if not 0 <= src < world or not 0 <= rank < world:
        raise ValueError(f"weight sync (broadcast): rank {rank} and src {src} must be in [0, {world})")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"weight sync (broadcast): backend {backend!r}; valid: 'gloo', 'nccl'")
    timeout = datetime.timedelta(seconds=timeout_s)
    store, server = join(endpoint, rank, timeout)
    pg: Any
    try:
        if backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg = dist.ProcessGroupNCCL(store, rank, world, opts)
            dev = device or torch.device("cuda", torch.cuda.current_device())
        else:
            gloo = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # in torch, not in its stubs
            gloo._timeout = timeout
            if is_loopback(endpoint.host):  # a local run: gloo's own sockets on loopback too
                gloo._devices = [dist.ProcessGroupGloo.create_device(hostname=endpoint.host)]
            else:  # each member on its own address (the pod's hostname resolves to its IP)
                gloo._devices = [dist.ProcessGroupGloo.create_device()]
            pg = dist.ProcessGroupGloo(store, rank, world, gloo)
            dev = device or torch.device("cpu")
    except BaseException:
        if server is not None:
            server.close()
        raise
    group = SyncGroup(pg, store, rank, world, src, dev, server, max_bucket_bytes)
    if server is not None:
        weakref.finalize(group, server.close)  # the group dropped (re-formed, or the source gone): stop serving
    return group


def _send_manifest(group: SyncGroup, manifest: BucketManifest | None) -> None:
    raw = manifest_wire.encode(manifest)
    manifest_wire.check_length(len(raw))  # the receivers would refuse it
    payload = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(group.device)
    group._bcast(torch.tensor([payload.numel()], dtype=torch.int64, device=group.device))
    group._bcast(payload)


def _receive_manifest(group: SyncGroup) -> BucketManifest | None:
    n = torch.zeros(1, dtype=torch.int64, device=group.device)
    group._bcast(n)
    payload = torch.empty(manifest_wire.check_length(int(n.item())), dtype=torch.uint8, device=group.device)
    group._bcast(payload)
    return manifest_wire.decode(payload.cpu().numpy().tobytes(), max_bucket_bytes=group.max_bucket_bytes)


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
        part = unpack_bucket(manifest, data)
        if twice := sorted(set(part) & set(state)):
            raise RuntimeError(f"weight sync (broadcast): tensors {twice[:5]} arrive in two buckets of version {version}")
        state |= part
    if versions != {version}:
        raise RuntimeError(f"weight sync (broadcast): expected version {version}, received buckets of {sorted(versions)}")
    return Received(state, version, time.perf_counter() - t0, nbytes)
