"""LoRA's base for a rollout worker that joins late: sent to it alone, through the object store, fingerprinted.

Under ``spec.model.lora`` a version travels as its adapters alone; the first delivery carries the base too
(:class:`~.actor_side.ActorSync`), and the engine keeps it and merges every later version onto it
(:mod:`asyncrl.rollout.adapter_merge`). A worker that holds no base -- a replacement of a killed worker, a worker
whose pod restarted, a late member of the broadcast group -- cannot merge adapters alone. The delivery decision:

- **the driver** asks the actor for the base whenever it hands the current version to a replacement
  (``trainer/driver/loop/weight_sync.to_replacement``), whatever the transport. The actor packs its frozen base
  (every HF tensor that is not an adapter, a tied head once: :func:`wire_state`, in the wire dtype) and ``ray.put``s it for that joiner alone
  (:func:`publish_base`): nothing is resident for joiners that never come, the refs die once the joiner has it;
- **the version itself** comes through the job's transport as for any receiver: ``objectStore`` bucket refs,
  the ``disk`` folder, under ``broadcast`` the object-store copy of the buckets the actor kept;
- **the worker** (``RolloutHost.update_weights``) takes the base only when it needs it (:func:`complete`): it holds
  none and the version is adapters alone. It never samples from a wrong model: the base it fetched must hash to
  the fingerprint the actor declared, and a base (given, or inside a version) whose fingerprint differs from the
  one its engine holds is refused, naming both.

The fingerprint is the wire's: a sha256 over every base tensor's name, dtype and shape and :data:`SAMPLES` values
spread over it, cast to the wire dtype, so the actor can compute it on its fp32 copies and a receiver on the
tensors it got, and they agree bit for bit. The actor records it at the first delivery; a later
:func:`publish_base` must find the same one (the base is frozen: anything else is a bug, refused loudly).
Cost of a joiner: the base's bytes in the wire dtype once, over the object store (``base_nbytes``).
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from asyncrl.rollout.adapter_merge import is_hf_adapter_name
from asyncrl.trainer.weight_sync.buckets import pack_buckets
from asyncrl.trainer.weight_sync.objectstore import BucketRefs

SAMPLES = 4096  # values hashed per tensor (all of a smaller one): cheap whatever the model's size
TIED_HEAD = "lm_head.weight"  # under tied embeddings the HF state dict's second name for model.embed_tokens.weight


@dataclass(frozen=True)
class BaseRefs:
    """The LoRA base in the object store for one late joiner: its buckets and the fingerprint they must hash to."""

    refs: BucketRefs
    fingerprint: str

    @property
    def nbytes(self) -> int:
        return self.refs.payload_bytes


def base_of(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base's tensors of an HF state dict (every one that is not a peft adapter tensor)."""
    return {k: v for k, v in state.items() if not is_hf_adapter_name(k)}


def wire_state(state: Mapping[str, torch.Tensor], *, tied: bool) -> dict[str, torch.Tensor]:
    """``state`` as a LoRA delivery carries it: with tied embeddings (``tied``) without ``lm_head.weight``, which
    the HF state dict lists beside ``model.embed_tokens.weight`` (the same tensor). Every receiver ties it itself:
    the transformers engine's model (``rollout/hf_model.load_hf_state_dict``) and the scorers' megatron model
    (which has no output layer then), so the copy would be bytes for nothing (17 % of SmolLM2-135M's base).
    The actor fingerprints the base after this, so sender and receiver hash the same tensors."""
    return {k: v for k, v in state.items() if not (tied and k == TIED_HEAD)}


def _samples(t: torch.Tensor, dtype: torch.dtype | None) -> bytes:
    flat = t.detach().reshape(-1)
    if flat.numel() > SAMPLES:
        flat = flat[torch.linspace(0, flat.numel() - 1, SAMPLES, dtype=torch.float64).round().long()]
    if dtype is not None and flat.is_floating_point():
        flat = flat.to(dtype)
    # bf16 has no numpy type: hash its bytes through a same-width integer view
    return flat.contiguous().cpu().view(torch.uint8).numpy().tobytes()


def fingerprint(base: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> str:
    """``wire-sha256:<hex>`` of ``base`` as it travels: each tensor's name, dtype and shape after the cast to
    ``dtype`` (None: as given) and :data:`SAMPLES` of its values. Casting is per value, so hashing cast samples
    equals hashing samples of the cast tensor: the sender's fp32 copies and the receiver's wire tensors agree."""
    h = hashlib.sha256()
    for name in sorted(base):
        t = base[name]
        wire = dtype if dtype is not None and t.is_floating_point() else t.dtype
        h.update(f"{name}|{wire}|{tuple(t.shape)}|".encode())
        h.update(_samples(t, dtype))
    return "wire-sha256:" + h.hexdigest()[:32]


def publish_base(base: Mapping[str, torch.Tensor], *, version: int, bucket_bytes: int, dtype: torch.dtype,
                 expected: str | None) -> BaseRefs:
    """``base`` in the wire ``dtype`` as object-store buckets (the actor's rank 0, for one joiner). ``expected``:
    the fingerprint of the base the first delivery carried; a different one is refused (the base is frozen)."""
    from asyncrl.trainer.weight_sync import objectstore

    fp = fingerprint(base, dtype)
    if expected is not None and fp != expected:
        raise RuntimeError(
            f"weight sync (LoRA): the actor's base is now {fp}, but the first delivery carried {expected}; the base "
            "is frozen under spec.model.lora, so a joiner would sample from another model than the other workers")
    refs = objectstore.publish(pack_buckets(iter(base.items()), version=version, bucket_bytes=bucket_bytes,
                                            dtype=dtype))
    return BaseRefs(refs, fp)


@dataclass(frozen=True)
class Completed:
    """What a receiver installs: ``state`` (the version, with the base when it needed one), the fingerprint
    of the base its engine holds after it, and the base bytes it fetched for this (0: none)."""

    state: dict[str, torch.Tensor]
    fingerprint: str | None
    base_nbytes: int


def _refuse(worker: str, held: str, other: str, where: str) -> ValueError:
    return ValueError(
        f"weight sync (LoRA): {worker} holds base {held} and was handed {where} base {other}; it refuses to "
        "merge adapters onto another base (the actor's base is frozen: a second base means two jobs or a bug)")


def complete(state: Mapping[str, torch.Tensor], base: BaseRefs | None, held: str | None, *,
             worker: str = "the receiver", tied: bool = False) -> Completed:
    """The delivery decision on a LoRA receiver whose engine holds the base ``held`` (None: none yet).

    ``state`` carries base tensors (a first delivery): its fingerprint becomes the held one (another one than
    ``held`` is refused). ``state`` is adapters alone and a base is held: as it is. Adapters alone and no base:
    ``base`` is fetched (refused when missing, or when its tensors do not hash to its declared fingerprint) and
    installed with them. A ``base`` handed to a receiver that has one must name the same fingerprint.
    ``tied``: the receiver's model ties its embeddings; a state that lists the tied head anyway (a plain HF dict
    handed in process) is taken without it (:func:`wire_state`), so it hashes as the wire's base does."""
    state = wire_state(state, tied=tied)
    if base is not None and held is not None and base.fingerprint != held:
        raise _refuse(worker, held, base.fingerprint, "the")
    own = base_of(state)
    if own:
        fp = fingerprint(own)
        if held is not None and fp != held:
            raise _refuse(worker, held, fp, "a version carrying")
        if base is not None and base.fingerprint != fp:
            raise ValueError(
                f"weight sync (LoRA): {worker} was handed base {base.fingerprint} beside a version carrying base "
                f"{fp}; refused (the actor's base is frozen: two bases mean two jobs or a bug)")
        return Completed(dict(state), fp, 0)
    if held is not None or not state:
        return Completed(dict(state), held, 0)
    if base is None:
        raise RuntimeError(
            f"weight sync (LoRA): {worker} holds no base and was handed version adapters alone; a late joiner "
            "needs the base with them (the driver's to_replacement sends it through the object store)")
    fetched = fetch_base(base, None, worker=worker)
    return Completed({**fetched, **state}, base.fingerprint, base.nbytes)


def fetch_base(base: BaseRefs, held: str | None, *, worker: str = "the receiver") -> dict[str, torch.Tensor]:
    """The base's tensors from the object store (views of its read-only buffers), refused when they do not
    hash to the fingerprint ``base`` declares, or when the receiver already holds another base (``held``)."""
    from asyncrl.trainer.weight_sync import objectstore

    if held is not None and base.fingerprint != held:
        raise _refuse(worker, held, base.fingerprint, "the")
    fetched = objectstore.fetch(base.refs)
    fp = fingerprint(fetched)
    if fp != base.fingerprint:
        raise ValueError(
            f"weight sync (LoRA): the base {worker} received hashes to {fp}, not to the {base.fingerprint} the "
            "actor declared; refused (it would sample from another model than the actor's)")
    return fetched

