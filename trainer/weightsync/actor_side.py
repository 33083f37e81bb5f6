"""The driver's weight sync, actor side: publish the actor's current version per ``spec.actor.weightSync``
(the object store: the transport the driver runs, ``api.weight_sync.DRIVER_TRANSPORTS``).

Called on every actor rank (SPMD: the TP gathers are collectives); rank 0 packs and publishes, the other
ranks of a tensor-parallel actor only join the gathers, those of a TP = 1 actor do nothing.
"""

from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.weightsync import objectstore
from asyncrl.trainer.weightsync.source import actor_buckets, hf_tensors, wire_dtype


def needs_training_precision(spec: AsyncRLJobSpec) -> bool:
    """Receivers score ``pi_old`` with the training-side model (interrupt-sync on the rollout workers,
    dedicated scorers): they need the actor's fp32 weights, not the engine's dtype."""
    from asyncrl.api.correction import ReferencePolicy
    from asyncrl.api.old_logits import OldLogitStrategy

    return spec.correction.reference is ReferencePolicy.EXACT and spec.old_logits.strategy in (
        OldLogitStrategy.INTERRUPT_SYNC, OldLogitStrategy.DEDICATED)


def publish_actor(actor: Any, spec: AsyncRLJobSpec, *, rank: int, tp: int) -> objectstore.BucketRefs | None:
    """``actor``'s (a :class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor`) current version as bucket refs
    in the object store (rank 0), None on the other ranks."""
    if rank != 0 and tp == 1:
        return None  # no collective to join
    if rank != 0:
        for _ in hf_tensors(actor.named_weights(), actor.settings.arch):  # join every gather, keep nothing
            pass
        return None
    dtype = wire_dtype(spec.model.rollout_dtype, needs_training_precision(spec))
    return objectstore.publish(actor_buckets(actor.named_weights(), actor.settings.arch, version=int(actor.version),
                                             bucket_mib=spec.actor.weight_sync.bucket_mib, dtype=dtype))
