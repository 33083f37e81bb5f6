"""The driver's weight sync, actor side: publish the actor's current version per ``spec.actor.weightSync``.

Called on every actor rank (SPMD: the TP gathers are collectives); rank 0 packs and publishes through the
configured transport (:func:`~.transport.make_transport`), the other ranks of a tensor-parallel actor only join
the gathers, those of a TP = 1 actor do nothing.

Per transport, what one version costs the actor and what the driver gets back (the *handle*):

- ``objectStore``: the buckets are ``ray.put`` -> :class:`~.objectstore.BucketRefs`;
- ``disk``: the buckets are written as ``<root>/v<version>/model.safetensors`` -> :class:`~.disk.DiskVersion`;
- ``broadcast``: nothing moves in ``train_step`` (its receivers are not listening yet: the driver reads the
  step's stats first) -> :class:`~.broadcast.BroadcastVersion`; the bytes leave in :meth:`ActorSync.send`, a
  separate call the driver makes while every receiver calls its own receive. The version's CPU buckets stay
  here until the next one is sent: a late joiner (a replaced worker) gets exactly this version from them
  through the object store, whatever the actor does meanwhile (the same memory the object-store transport
  keeps alive in ``hosts.weights``).
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.lora import LoraSpec
from asyncrl.api.model_arch import ModelArch
from asyncrl.api.weight_sync import WeightTransport
from asyncrl.trainer.weight_sync.broadcast import SyncGroup
from asyncrl.trainer.weight_sync.buckets import Bucket, pack_buckets
from asyncrl.trainer.weight_sync.lora_base import BaseRefs, base_of, fingerprint, publish_base, wire_state
from asyncrl.trainer.weight_sync.objectstore import BucketRefs
from asyncrl.trainer.weight_sync.outcome import SendOutcome, SyncFailed
from asyncrl.trainer.weight_sync.source import MIB, actor_buckets, hf_tensors, wire_dtype
from asyncrl.trainer.weight_sync.transport import (
    BroadcastTransport,
    ObjectStoreTransport,
    Transport,
    WeightHandle,
    make_transport,
)


class _Arch(Protocol):
    @property
    def arch(self) -> ModelArch: ...

    @property
    def lora(self) -> LoraSpec | None: ...


class SyncedActor(Protocol):
    """What the weight sync reads of the actor (``MegatronActor``): its live parameters, their architecture and
    the version they are."""

    version: int

    @property
    def settings(self) -> _Arch: ...

    def named_weights(self) -> Mapping[str, torch.Tensor]: ...

    def hf_state_dict(self) -> dict[str, torch.Tensor]: ...


def needs_training_precision(spec: AsyncRLJobSpec) -> bool:
    """Receivers score ``pi_old`` with the training-side model (interrupt-sync on the rollout workers,
    dedicated scorers): they need the actor's weights as it holds them, not rounded to the engine's dtype, so
    they travel in fp32 (a bf16 actor's values exactly, at twice the bytes a bf16 wire would need; the scorer
    rounds them back to the actor's bf16 on load)."""
    return spec.old_logits_route.scores_outside_the_actor


def _buckets(actor: SyncedActor, spec: AsyncRLJobSpec) -> Iterator[Bucket]:
    """The actor's current version as buckets, lazily: nothing is gathered until they are read."""
    dtype = wire_dtype(spec.model.rollout_dtype, needs_training_precision(spec))
    return actor_buckets(actor.named_weights(), actor.settings.arch, version=int(actor.version),
                         bucket_mib=spec.actor.weight_sync.bucket_mib, dtype=dtype, adapter_scale=_adapter_scale(actor))


def _adapter_scale(actor: SyncedActor) -> float | None:
    """``spec.model.lora``: the trainable parameters are the adapters, sent alone (``B`` scaled); else None."""
    lora = actor.settings.lora
    return lora.scale if lora is not None else None


def _with_base(actor: SyncedActor, spec: AsyncRLJobSpec) -> tuple[Iterator[Bucket], str]:
    """LoRA's first delivery: the base's HF tensors and the adapters (``hf_state_dict``), so that a receiver can
    merge the later versions, which travel as adapters alone; and the base's wire fingerprint
    (:func:`~.lora_base.fingerprint`), which a late joiner's base must match. A tied head is not sent twice
    (:func:`~.lora_base.wire_state`)."""
    dtype = wire_dtype(spec.model.rollout_dtype, needs_training_precision(spec))
    # every TP rank calls hf_state_dict: its gathers are collectives
    full = wire_state(actor.hf_state_dict(), tied=actor.settings.arch.tie_embeddings)
    return (pack_buckets(iter(full.items()), version=int(actor.version),
                         bucket_bytes=spec.actor.weight_sync.bucket_mib * MIB, dtype=dtype),
            fingerprint(base_of(full), dtype))


def _join_gathers(actor: SyncedActor) -> None:
    for _ in hf_tensors(actor.named_weights(), actor.settings.arch, adapter_scale=_adapter_scale(actor)):
        pass  # join every gather, keep nothing


@dataclass
class ActorSync:
    """The actor rank's end of ``spec.actor.weightSync`` (one per :class:`ActorHost`).

    ``disk_root``/``disk_keep``: the disk transport's folder and how many versions stay there;
    ``group``: the broadcast group once the driver formed it (rank 0 only)."""

    spec: AsyncRLJobSpec
    rank: int
    tp: int
    transport: WeightTransport = WeightTransport.OBJECT_STORE
    disk_root: str | None = None
    disk_keep: int = 2
    group: SyncGroup | None = None
    kept: list[Bucket] = field(default_factory=list)  # broadcast: the last version's CPU buckets
    kept_version: int = -1
    base_sent: bool = False  # spec.model.lora: the base went out with the first version; adapters alone since
    base_fingerprint: str | None = None  # ... and its wire fingerprint (rank 0), which a joiner's base must match

    @property
    def _joins_only(self) -> bool:
        return self.rank != 0

    def _configured(self) -> Transport:
        return make_transport(self.transport, root=self.disk_root, keep=self.disk_keep, group=self.group)

    def publish(self, actor: SyncedActor) -> WeightHandle | None:
        """The actor's current version through the configured transport: the handle on rank 0, None on the
        others (which join the TP gathers when the transport reads the buckets now)."""
        transport = self._configured()
        if self._joins_only:
            if self.tp > 1 and transport.moves_at_publish:
                self._join(actor)
            return None
        if not transport.moves_at_publish:
            return transport.publish(iter(()), int(actor.version))  # broadcast: the bytes leave in send()
        return transport.publish(self._version_buckets(actor), int(actor.version))

    def _version_buckets(self, actor: SyncedActor) -> Iterator[Bucket]:
        """This version's buckets: under LoRA the first carries the base too (see :func:`_with_base`)."""
        if self.spec.model.lora is not None and not self.base_sent:
            self.base_sent = True
            buckets, self.base_fingerprint = _with_base(actor, self.spec)
            return buckets
        return _buckets(actor, self.spec)

    def _join(self, actor: SyncedActor) -> None:
        """A rank > 0's share of the gathers :meth:`_version_buckets` makes on rank 0."""
        if self.spec.model.lora is not None and not self.base_sent:
            self.base_sent = True
            actor.hf_state_dict()
            return
        _join_gathers(actor)

    def send(self, actor: SyncedActor, version: int) -> SendOutcome | None:
        """Broadcast ``version`` (the actor's current one) to the group: :class:`~.outcome.Sent`, or, when a
        member is gone (the collective failed), :class:`~.outcome.SyncFailed` -- the driver re-forms the group.
        None on the other ranks (they join the TP gathers)."""
        if int(actor.version) != version:
            raise RuntimeError(f"weight sync (broadcast): asked to send version {version}, the actor holds "
                               f"{int(actor.version)}")
        if self._joins_only:
            if self.tp > 1:
                self._join(actor)
            self.kept_version = version  # every rank knows which version was packed (for_joiner)
            return None
        if self.group is None:
            raise RuntimeError("weight sync (broadcast): no group formed (the driver forms it before a send)")
        self.kept, self.kept_version = [], -1
        buckets = list(self._version_buckets(actor))  # CPU; kept for late joiners
        self.kept, self.kept_version = buckets, version
        try:
            return BroadcastTransport(self.group).send(buckets)
        except Exception as exc:  # noqa: BLE001 -- a member died: the group is broken, the driver re-forms it
            self.group = None
            return SyncFailed(f"{type(exc).__name__}: {exc}")

    def for_joiner(self, actor: SyncedActor, version: int) -> BucketRefs | None:
        """``version`` in the object store for a receiver outside the broadcast group, from the buckets kept
        since it was sent (rank 0; None on the others: no gathers, whatever the actor trains meanwhile).

        A version the group never carried -- the driver found a member dead before forming it, so this version
        goes to every receiver through the object store -- is packed now (every TP rank joins the gathers) and
        kept as if sent: under LoRA the first version still carries the base."""
        if self.kept_version != version:
            if int(actor.version) != version:
                raise RuntimeError(
                    f"weight sync (broadcast): a late joiner needs version {version}; the actor kept version "
                    f"{self.kept_version} and holds {int(actor.version)}")
            if self._joins_only:
                if self.tp > 1:
                    self._join(actor)
            else:
                self.kept, self.kept_version = [], -1
                self.kept = list(self._version_buckets(actor))
            self.kept_version = version
        if self._joins_only:
            return None
        return ObjectStoreTransport().publish(self.kept, version)

    def base_for_joiner(self, actor: SyncedActor) -> BaseRefs | None:
        """Under ``spec.model.lora``, the frozen base in the object store for one receiver that holds none (a
        replaced rollout worker: :mod:`.lora_base`), whatever the transport; every TP rank joins the gathers,
        rank 0 answers (None on the others, and without LoRA)."""
        if self.spec.model.lora is None:
            return None
        if self._joins_only:
            if self.tp > 1:
                actor.hf_state_dict()
            return None
        dtype = wire_dtype(self.spec.model.rollout_dtype, needs_training_precision(self.spec))
        base = wire_state(base_of(actor.hf_state_dict()), tied=actor.settings.arch.tie_embeddings)
        return publish_base(base, version=int(actor.version),
                            bucket_bytes=self.spec.actor.weight_sync.bucket_mib * MIB, dtype=dtype,
                            expected=self.base_fingerprint)
