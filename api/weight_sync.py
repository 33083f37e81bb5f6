"""``spec.actor.weightSync``: how a new version's weights leave the actor for rollout (and scorers).

The weights travel as HF-named tensors cast to the wire dtype, packed in flat buckets
(``bucketMiB``), through one of three transports (reference/distributed-actor.md §3):

- ``objectStore``: one Ray object per bucket; a late joiner (a replaced rollout worker) reads the
  latest version's bucket refs. CPU, local runs and the default.
- ``broadcast``: a ``torch.distributed`` collective group (NCCL on GPU, gloo on CPU), source rank
  plus every receiver; the bytes cross once per version whatever the number of workers.
- ``disk``: HF safetensors per version on shared storage, written atomically, the newest ``diskKeep``.
"""

from enum import StrEnum

from pydantic import Field

from asyncrl.api.base import SpecModel


class WeightTransport(StrEnum):
    """The transports of :mod:`asyncrl.trainer.weightsync`."""

    OBJECT_STORE = "objectStore"
    BROADCAST = "broadcast"
    DISK = "disk"


class WeightSyncSpec(SpecModel):
    """``spec.actor.weightSync``."""

    transport: WeightTransport = Field(
        default=WeightTransport.OBJECT_STORE,
        description="objectStore (Ray objects, one per bucket), broadcast (a torch.distributed collective "
        "group: NCCL on GPU, gloo on CPU) or disk (HF safetensors per version on shared storage).",
    )
    bucket_mib: int = Field(
        default=512, ge=1, le=16384, description="Bucket size in MiB (slime, AReaL and ROLL use 512-1024); a "
        "larger tensor travels in a bucket of its own.",
    )
    disk_keep: int = Field(
        default=2, ge=1, le=100, description="Versions kept on disk by the disk transport (newest first).",
    )
