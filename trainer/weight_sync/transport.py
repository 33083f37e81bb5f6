"""The transports of ``spec.actor.weightSync.transport`` behind one interface, and their registry.

The source -- the actor's rank 0, :class:`~.actor_side.ActorSync` -- builds the configured transport with
:func:`make_transport` and turns one version's buckets into a *handle* (:meth:`Transport.publish`); the driver
hands the handle to every receiver, which takes the version off the transport the handle names
(:func:`receive`: a rollout worker's ``RolloutHost.update_weights``, a dedicated scorer). Handles are small
and picklable: bucket ObjectRefs (:class:`~.objectstore.BucketRefs`), a folder (:class:`~.disk.DiskVersion`),
the version number (:class:`~.broadcast.BroadcastVersion`: the bytes travel in the collective itself).

``broadcast`` is the one whose bytes do not move at publish: its receivers are not listening yet (the driver
reads the step's stats first), so they leave in :meth:`BroadcastTransport.send`, a separate call the driver
makes while every receiver calls its receive (:attr:`Transport.moves_at_publish` says which kind a transport
is: the actor's other TP ranks join the gathers exactly when the buckets are read).
"""

import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Protocol, TypeAlias

import numpy as np
import torch

from asyncrl.api.weight_sync import WeightTransport
from asyncrl.trainer.weight_sync import broadcast, disk, objectstore
from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion, SyncGroup
from asyncrl.trainer.weight_sync.buckets import Bucket
from asyncrl.trainer.weight_sync.disk import DiskVersion
from asyncrl.trainer.weight_sync.objectstore import BucketRefs
from asyncrl.trainer.weight_sync.outcome import Received, Sent

WeightHandle: TypeAlias = BucketRefs | DiskVersion | BroadcastVersion  # what the driver hands a receiver
HfArrays: TypeAlias = Mapping[str, np.ndarray | torch.Tensor]  # one version as one HF dict (no handle)


class Transport(Protocol):
    """One transport: publish a version (the source), receive it from its handle (a receiver)."""

    @property
    def name(self) -> WeightTransport: ...

    @property
    def moves_at_publish(self) -> bool:
        """Whether :meth:`publish` reads the buckets (False: they move in a later call, ``broadcast``)."""
        ...

    def publish(self, buckets: Iterable[Bucket], version: int) -> WeightHandle:
        """Make ``version`` (its ``buckets``, read lazily) available; the handle receivers need."""
        ...

    def receive(self, handle: WeightHandle) -> Received:
        """One version's HF state dict from ``handle`` and what taking it cost (receiver side)."""
        ...


def _wrong_handle(transport: WeightTransport, handle: WeightHandle) -> TypeError:
    return TypeError(f"weight sync ({transport}): cannot receive a {type(handle).__name__} (the handle of "
                     f"another transport: the driver and the actor disagree on actor.weightSync.transport)")


@dataclass(frozen=True)
class ObjectStoreTransport:
    """One Ray object per bucket (:mod:`.objectstore`)."""

    name: ClassVar[WeightTransport] = WeightTransport.OBJECT_STORE
    moves_at_publish: ClassVar[bool] = True

    def publish(self, buckets: Iterable[Bucket], version: int) -> BucketRefs:
        handle = objectstore.publish(buckets)
        if handle.version != version:
            raise ValueError(f"weight sync: buckets of version {handle.version} published as {version}")
        return handle

    def receive(self, handle: WeightHandle) -> Received:
        if not isinstance(handle, BucketRefs):
            raise _wrong_handle(self.name, handle)
        return objectstore.receive(handle)


@dataclass(frozen=True)
class DiskTransport:
    """Safetensors per version under ``root`` (:mod:`.disk`); the newest ``keep`` versions stay. A receiver
    needs no ``root``: the handle names the version's folder."""

    root: str | None = None
    keep: int = 2
    name: ClassVar[WeightTransport] = WeightTransport.DISK
    moves_at_publish: ClassVar[bool] = True

    def publish(self, buckets: Iterable[Bucket], version: int) -> DiskVersion:
        if self.root is None:
            raise RuntimeError("weight sync (disk): the driver did not configure the folder (configure_sync)")
        return disk.write_version(buckets, self.root, version, keep=self.keep)

    def receive(self, handle: WeightHandle) -> Received:
        if not isinstance(handle, DiskVersion):
            raise _wrong_handle(self.name, handle)
        t0 = time.perf_counter()
        state = disk.read_version(handle)
        return Received(state, handle.version, time.perf_counter() - t0, _nbytes(state))


@dataclass(frozen=True)
class BroadcastTransport:
    """A collective from the source to every member of ``group`` (:mod:`.broadcast`). :meth:`publish` only
    names the version; :meth:`send` moves its bytes while every receiver is in :meth:`receive`."""

    group: SyncGroup | None = None
    name: ClassVar[WeightTransport] = WeightTransport.BROADCAST
    moves_at_publish: ClassVar[bool] = False

    def publish(self, buckets: Iterable[Bucket], version: int) -> BroadcastVersion:
        return BroadcastVersion(version)  # the buckets are not read here: send() reads them

    def _formed(self) -> SyncGroup:
        if self.group is None:
            raise RuntimeError("weight sync (broadcast): no group formed (the driver forms it before a send)")
        return self.group

    def send(self, buckets: Iterable[Bucket]) -> Sent:
        """Broadcast one version's buckets from the source (raises when a member is gone)."""
        nbytes, seconds = broadcast.send(self._formed(), buckets)
        return Sent(nbytes, seconds)

    def receive(self, handle: WeightHandle) -> Received:
        if not isinstance(handle, BroadcastVersion):
            raise _wrong_handle(self.name, handle)
        return broadcast.receive_version(self._formed(), handle.version)


TRANSPORTS: dict[WeightTransport, Callable[[str | None, int, SyncGroup | None], Transport]] = {
    WeightTransport.OBJECT_STORE: lambda root, keep, group: ObjectStoreTransport(),
    WeightTransport.BROADCAST: lambda root, keep, group: BroadcastTransport(group),
    WeightTransport.DISK: lambda root, keep, group: DiskTransport(root, keep),
}
_BY_HANDLE: dict[type, WeightTransport] = {BucketRefs: WeightTransport.OBJECT_STORE,
                                           BroadcastVersion: WeightTransport.BROADCAST,
                                           DiskVersion: WeightTransport.DISK}


def make_transport(name: str, *, root: str | None = None, keep: int = 2,
                   group: SyncGroup | None = None) -> Transport:
    """The transport ``name`` (``spec.actor.weightSync.transport``): ``root``/``keep`` are the disk transport's
    folder and how many versions stay there, ``group`` the broadcast transport's group (as formed so far)."""
    try:
        factory = TRANSPORTS[WeightTransport(name)]
    except ValueError:
        raise ValueError(
            f"actor.weightSync.transport: {name!r} is not a transport; valid: {sorted(map(str, TRANSPORTS))}"
        ) from None
    return factory(root, keep, group)


def transport_of(handle: WeightHandle, group: SyncGroup | None = None) -> Transport:
    """The transport that carries ``handle`` (a receiver's: it takes what the driver hands it; ``group`` is
    its broadcast group, if it is in one)."""
    return make_transport(_BY_HANDLE[type(handle)], group=group)


def receive(weights: WeightHandle | HfArrays, group: SyncGroup | None = None) -> Received:
    """One version on a receiver: from a handle of any transport, or a plain HF dict of numpy arrays or tensors
    (one object, no handle: its version is the caller's to say)."""
    if isinstance(weights, (BucketRefs, DiskVersion, BroadcastVersion)):
        return transport_of(weights, group).receive(weights)
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # object-store arrays are read-only; engines copy them
        state = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(v) for k, v in weights.items()}
    return Received(state, None, time.perf_counter() - t0, _nbytes(state))


def _nbytes(state: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())
