"""``spec.actor.weightSync``: how a new version's weights leave the actor for rollout (and scorers).

The weights travel as HF-named tensors cast to the wire dtype, packed in flat buckets
(``bucketMiB``), through one of three transports (``docs/weight-sync.md``), all run by the
job driver (``asyncrl.trainer.driver.loop.weight_sync``):

- ``objectStore``: one Ray object per bucket; every receiver pulls the version's bucket refs. CPU,
  local runs and the default.
- ``broadcast``: a ``torch.distributed`` collective group (NCCL when every member has a GPU, gloo
  otherwise) of the actor's source rank, every rollout worker and every dedicated old-logit scorer,
  formed once; the bytes leave the actor once per version whatever the number of receivers. A late
  joiner (a replaced worker or scorer) takes the current version from the object store and the group
  is formed again before the next version.
- ``disk``: HF safetensors per version on shared storage (the checkpoint volume in a cluster, which
  must then be ReadWriteMany: the rollout pods mount it too), written atomically; the versions a
  receiver may still load are kept, older ones pruned.
"""

from enum import StrEnum

from pydantic import Field

from asyncrl.api.base import SpecModel


class WeightTransport(StrEnum):
    """The transports of :mod:`asyncrl.trainer.weight_sync`."""

    OBJECT_STORE = "objectStore"
    BROADCAST = "broadcast"
    DISK = "disk"


DISK_NEEDS_VOLUME_MESSAGE = (
    "actor.weightSync.transport: disk in a cluster needs checkpoint.volumeClaimName (a ReadWriteMany claim the "
    "actor, rollout and old-logit pods all mount: each pod's own disk is not shared); set the claim, or use "
    "transport: broadcast or objectStore"
)


class WeightSyncSpec(SpecModel):
    """``spec.actor.weightSync``."""

    transport: WeightTransport = Field(
        default=WeightTransport.OBJECT_STORE,
        description="objectStore (Ray objects, one per bucket), broadcast (a torch.distributed collective "
        "group: NCCL on GPU, gloo on CPU; late joiners via the object store) or disk (HF safetensors per "
        "version on shared storage: the checkpoint volume in a cluster, ReadWriteMany).",
    )
    bucket_mib: int = Field(
        default=512, ge=1, alias="bucketMiB", le=16384, description="Bucket size in MiB (slime, AReaL and ROLL use 512-1024); a "
        "larger tensor travels in a bucket of its own.",
    )
