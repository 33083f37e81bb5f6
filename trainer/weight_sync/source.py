"""The sending side: the actor's parameters as HF tensors, one at a time, then buckets.

Per parameter: gather the full tensor over its TP group (:func:`~asyncrl.trainer.megatron.parallel.full_of`,
a collective every TP rank joins), convert it to HF names
(:func:`~asyncrl.trainer.megatron.convert.iter_megatron_to_hf`: views where no reshuffle is needed),
cast it to the wire dtype and pack it (:func:`~asyncrl.trainer.weight_sync.buckets.pack_buckets`). At TP = 1
nothing is copied before the cast into a bucket (today's ``hf_state_dict`` cloned the whole model in fp32
first).
"""

from collections.abc import Iterator, Mapping

import torch

from asyncrl.api.model_arch import ModelArch
from asyncrl.trainer.weight_sync.buckets import DTYPES, Bucket, pack_buckets

MIB = 2**20


def hf_tensors(named: Mapping[str, torch.Tensor], arch: ModelArch, *,
               adapter_scale: float | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, full tensor)`` of the actor's megatron parameters ``named`` (live, maybe TP shards).

    ``adapter_scale`` (``spec.model.lora``'s ``alpha / rank``): ``named`` are the LoRA adapters, sent alone in
    peft's per-projection names with ``B`` scaled (:func:`~asyncrl.trainer.megatron.lora.hf_adapter_tensors`);
    the engine merges them onto the base it holds."""
    from asyncrl.trainer.megatron.convert import iter_megatron_to_hf
    from asyncrl.trainer.megatron.lora import hf_adapter_tensors
    from asyncrl.trainer.megatron.parallel import full_of

    with torch.no_grad():
        full = {k: full_of(p) for k, p in named.items()}  # TP = 1: the parameters themselves
        if adapter_scale is not None:
            yield from hf_adapter_tensors(full, arch, scale=adapter_scale)
        else:
            yield from iter_megatron_to_hf(full, arch)


def wire_dtype(rollout_dtype: str, needs_training_precision: bool) -> torch.dtype:
    """The dtype on the wire: the rollout engine's (bf16 halves the bytes; the engine rounds to it anyway,
    bit for bit the same), float32 when a receiver scores with the training-side model code (interrupt-sync,
    dedicated scorers: their ``pi_old`` must be the fp32 actor's)."""
    return torch.float32 if needs_training_precision else DTYPES[rollout_dtype]


def actor_buckets(named: Mapping[str, torch.Tensor], arch: ModelArch, *, version: int, bucket_mib: int,
                  dtype: torch.dtype, adapter_scale: float | None = None) -> Iterator[Bucket]:
    """The actor's weights of ``version`` as CPU buckets of at most ``bucket_mib`` MiB (LoRA: the adapters)."""
    cpu = ((k, t.to("cpu")) for k, t in hf_tensors(named, arch, adapter_scale=adapter_scale))
    yield from pack_buckets(cpu, version=version, bucket_bytes=bucket_mib * MIB, dtype=dtype)
