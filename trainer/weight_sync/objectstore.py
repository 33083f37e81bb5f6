"""The ``objectStore`` transport: one Ray object per bucket, a small handle naming them.

The sender ``ray.put``s each bucket's bytes (numpy ``uint8``: stored once per node, read zero-copy) and
returns a :class:`BucketRefs` handle; the driver passes that handle around (rollout workers, dedicated
scorers, late joiners: a replaced worker reads the latest version's handle). Receivers ``ray.get``
every bucket at once (Ray pulls them in parallel) and reassemble the HF state dict as views of the
buckets (:func:`~asyncrl.trainer.weight_sync.buckets.unpack_all`). Measured 3-5x faster than one
object of the whole dict on this machine (``docs/architecture.md``, memory of snapshots and scorers).
"""

import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from asyncrl.trainer.weight_sync.buckets import Bucket, BucketManifest, total_bytes, unpack_all
from asyncrl.trainer.weight_sync.outcome import Received


@dataclass(frozen=True)
class BucketRefs:
    """One version's weights in the object store: its bucket manifests and their ObjectRefs (same order)."""

    version: int
    manifests: tuple[BucketManifest, ...]
    refs: tuple[Any, ...]

    @property
    def payload_bytes(self) -> int:
        return total_bytes(self.manifests)


def publish(buckets: Iterable[Bucket]) -> BucketRefs:
    """``ray.put`` every bucket (CPU) as it is built; the handle of the version."""
    import ray

    manifests, refs = [], []
    for b in buckets:
        manifests.append(b.manifest)
        refs.append(ray.put(b.data.cpu().numpy()))
    if not manifests:
        raise ValueError("weight sync: a version without tensors cannot be published")
    versions = {m.version for m in manifests}
    if len(versions) != 1:
        raise ValueError(f"weight sync: buckets of versions {sorted(versions)} in one publish")
    return BucketRefs(manifests[0].version, tuple(manifests), tuple(refs))


def fetch(handle: BucketRefs) -> dict[str, torch.Tensor]:
    """The HF state dict of ``handle`` (views of the read-only buckets: copy before writing into them)."""
    import ray

    arrays: list[np.ndarray] = ray.get(list(handle.refs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # object-store arrays are read-only; engines copy them
        datas = [torch.from_numpy(a) for a in arrays]
    return unpack_all(zip(handle.manifests, datas, strict=True))


def receive(handle: BucketRefs) -> Received:
    """The version of ``handle`` and how long fetching and reassembling it took."""
    t0 = time.perf_counter()
    state = fetch(handle)
    return Received(state, handle.version, time.perf_counter() - t0, handle.payload_bytes)
