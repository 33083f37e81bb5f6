"""``spec.actor.weightSync``: how a new version's weights leave the actor for rollout (and scorers).

The weights travel as HF-named tensors cast to the wire dtype, packed in flat buckets
(``bucketMiB``), through one of three transports (reference/distributed-actor.md §3):

- ``objectStore``: one Ray object per bucket; a late joiner (a replaced rollout worker) reads the
  latest version's bucket refs. CPU, local runs and the default.
- ``broadcast``: a ``torch.distributed`` collective group (NCCL on GPU, gloo on CPU), source rank
  plus every receiver; the bytes cross once per version whatever the number of workers.
- ``disk``: HF safetensors per version on shared storage, written atomically, the newest N kept.
"""

from enum import StrEnum
from typing import ClassVar

from pydantic import Field, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, raise_all


class WeightTransport(StrEnum):
    """The transports of :mod:`asyncrl.trainer.weightsync`."""

    OBJECT_STORE = "objectStore"
    BROADCAST = "broadcast"
    DISK = "disk"


DRIVER_TRANSPORTS = (WeightTransport.OBJECT_STORE,)  # what the job driver runs today
NOT_WIRED_MESSAGE = (
    "weightSync.transport: the job driver runs objectStore in this build (broadcast and disk exist in "
    "asyncrl.trainer.weightsync and are measured by bench/scale.py, not yet wired into the driver); "
    "set transport: objectStore"
)


class WeightSyncSpec(SpecModel):
    """``spec.actor.weightSync``."""

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule("!has(self.transport) || self.transport == 'objectStore'", NOT_WIRED_MESSAGE, ".transport"),
    )

    transport: WeightTransport = Field(
        default=WeightTransport.OBJECT_STORE,
        description="objectStore (Ray objects, one per bucket), broadcast (a torch.distributed collective "
        "group: NCCL on GPU, gloo on CPU) or disk (HF safetensors per version on shared storage).",
    )
    bucket_mib: int = Field(
        default=512, ge=1, alias="bucketMiB", le=16384, description="Bucket size in MiB (slime, AReaL and ROLL use 512-1024); a "
        "larger tensor travels in a bucket of its own.",
    )

    @model_validator(mode="after")
    def _driver_runs_it(self) -> "WeightSyncSpec":
        if self.transport not in DRIVER_TRANSPORTS:
            raise_all([("transport", f"{NOT_WIRED_MESSAGE} (got {self.transport.value})")])
        return self
