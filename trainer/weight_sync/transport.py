"""One interface over the three transports (``spec.actor.weightSync.transport``).

The source side turns one version's buckets into a *handle* (:meth:`Transport.publish`); the driver
hands the handle to every receiver, which turns it back into the HF state dict
(:meth:`Transport.receive`). Handles are small and picklable: bucket ObjectRefs (objectStore), a
folder (disk), the version number (broadcast, where the bytes travel in the collective itself).
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from asyncrl.trainer.weight_sync import broadcast, disk, objectstore
from asyncrl.trainer.weight_sync.buckets import Bucket

StateDict = dict[str, torch.Tensor]


class Transport(Protocol):
    name: str

    def publish(self, buckets: Iterable[Bucket], version: int) -> Any:
        """Send one version (source side); the handle receivers need."""
        ...

    def receive(self, handle: Any) -> StateDict:
        """One version's HF state dict from ``handle`` (receiver side)."""
        ...


@dataclass
class ObjectStoreTransport:
    name: str = "objectStore"

    def publish(self, buckets: Iterable[Bucket], version: int) -> objectstore.BucketRefs:
        handle = objectstore.publish(buckets)
        if handle.version != version:
            raise ValueError(f"weight sync: buckets of version {handle.version} published as {version}")
        return handle

    def receive(self, handle: objectstore.BucketRefs) -> StateDict:
        return objectstore.fetch(handle)


@dataclass
class DiskTransport:
    root: str
    keep: int = 2
    drop: frozenset[str] = frozenset()  # names left out of the files (a tied head)
    name: str = "disk"

    def publish(self, buckets: Iterable[Bucket], version: int) -> disk.DiskVersion:
        return disk.write_version(buckets, self.root, version, keep=self.keep, drop=self.drop)

    def receive(self, handle: disk.DiskVersion) -> StateDict:
        return disk.read_version(handle)


@dataclass
class BroadcastTransport:
    group: broadcast.SyncGroup
    name: str = "broadcast"

    def publish(self, buckets: Iterable[Bucket], version: int) -> int:
        broadcast.send(self.group, buckets)
        return version

    def receive(self, handle: int) -> StateDict:
        return broadcast.receive(self.group)


TRANSPORTS: dict[str, Callable[..., Transport]] = {
    "objectStore": ObjectStoreTransport,
    "broadcast": BroadcastTransport,
    "disk": DiskTransport,
}


def make_transport(name: str, **kwargs: Any) -> Transport:
    """The transport ``name`` (``spec.actor.weightSync.transport``) built with ``kwargs``."""
    try:
        factory = TRANSPORTS[name]
    except KeyError:
        raise ValueError(
            f"actor.weightSync.transport: {name!r} is not a transport; valid: {sorted(TRANSPORTS)}"
        ) from None
    return factory(**kwargs)
