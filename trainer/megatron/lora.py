"""LoRA adapters on megatron-core's parallel linear layers (``spec.model.lora``, ``docs/lora.md``).

An adapted layer computes ``y = W x + s B A x`` with the base ``W`` ``[out, in]`` frozen, ``A`` ``[r, in]``,
``B`` ``[out, r]`` trainable and ``s = alpha / r``. ``B`` starts at 0, so the adapted model's logits equal
the base's at initialisation; ``A`` is drawn as peft draws it (Kaiming-uniform, ``a = sqrt(5)``), from a
generator seeded per layer, so every TP rank draws the same full ``A`` and keeps its slice.

The adapter is not a module of its own: ``lora_A``/``lora_B`` are parameters of the base layer and a forward
hook adds ``s B A x`` to its output. So the base keeps every name the converter and the checkpoints know
(``decoder.layers.0.self_attention.linear_qkv.weight``), the adapters are ``<layer>.lora_A`` / ``.lora_B``,
and ``torch.func.functional_call`` over a dict of adapters alone scores another version (the hook reads the
substituted tensors).

Tensor parallelism splits the adapter as the base layer is split:

- column-parallel (``linear_qkv``, ``linear_fc1``: output rows split): ``A`` whole on every rank, ``B`` split by
  rows with the base weight's ``partition_dim``/``partition_stride`` (fc1's [gate; up] stride); ``A x`` passes
  megatron's copy-to-TP region (identity forward, all-reduce backward) so that ``A``'s gradient and the input's
  sum every rank's ``B`` rows;
- row-parallel (``linear_proj``, ``linear_fc2``: input columns split): ``A`` split by columns, ``B`` whole; the
  partial ``A_r x_r`` is all-reduced (reduce-from-TP region) before ``B``, as the base output is.

Replicated tensors carry no ``tensor_model_parallel`` mark, so ``parallel.full_of`` returns them as they are
and the gradient norm counts them once.

Several versions in one forward (:func:`adapter_bank`): each adapted layer gets the stacked adapters of ``K``
versions and a slot per row, and row ``b`` is computed with version ``slot[b]``'s ``A`` and ``B`` (a batched
matmul over the rows); the base runs once for all rows. Dense families only: a MoE expert sees its tokens
permuted out of their rows, so the bank is refused there (the caller falls back to one forward per version).

Megatron's activations are sequence-first: ``x`` is ``[S, N, in]`` (``N`` rows) in every dense layer here
(no sequence parallelism).
"""

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from asyncrl.api.lora import LoraSpec
from asyncrl.api.model_arch import ModelArch

Parallel = Literal["column", "row"]
A_SUFFIX, B_SUFFIX = ".lora_A", ".lora_B"

# HF target names -> the megatron layer that computes them (q/k/v fused, gate/up fused).
_LAYER_OF_TARGET = {
    "q_proj": "linear_qkv", "k_proj": "linear_qkv", "v_proj": "linear_qkv", "o_proj": "linear_proj",
    "gate_proj": "linear_fc1", "up_proj": "linear_fc1", "down_proj": "linear_fc2",
}
_PARALLEL: dict[str, Parallel] = {"linear_qkv": "column", "linear_fc1": "column", "linear_proj": "row",
                                  "linear_fc2": "row"}


@dataclass(frozen=True)
class LoraLayers:
    """The adapted layers of one model: their megatron names (``decoder.layers.0.self_attention.linear_qkv``)
    and the spec they were built from."""

    names: tuple[str, ...]
    spec: LoraSpec
    moe: bool

    def param_names(self) -> list[str]:
        """Every adapter parameter's name (``<layer>.lora_A``, ``<layer>.lora_B``), in layer order."""
        return [n + s for n in self.names for s in (A_SUFFIX, B_SUFFIX)]


def target_layers(arch: ModelArch, targets: Sequence[str]) -> list[str]:
    """The megatron names of the layers ``targets`` (HF names) adapt, layer by layer (MoE: every expert's)."""
    kinds = {_LAYER_OF_TARGET[t] for t in targets}
    out = []
    for i in range(arch.num_layers):
        m = f"decoder.layers.{i}."
        out += [m + f"self_attention.{k}" for k in ("linear_qkv", "linear_proj") if k in kinds]
        for k in ("linear_fc1", "linear_fc2"):
            if k not in kinds:
                continue
            if arch.is_moe:
                out += [m + f"mlp.experts.local_experts.{e}.{k}" for e in range(arch.num_experts)]
            else:
                out.append(m + f"mlp.{k}")
    return out


def is_adapter_name(name: str) -> bool:
    return name.endswith(A_SUFFIX) or name.endswith(B_SUFFIX)


def apply_lora(gpt: torch.nn.Module, arch: ModelArch, spec: LoraSpec, *, seed: int) -> LoraLayers:
    """Freeze every parameter of ``gpt`` and add an adapter to each targeted layer (in place).

    Call after the base weights are loaded and before the optimizer and DDP wrapper are built: they then see
    the adapters alone."""
    from asyncrl.trainer.megatron.parallel import shard_of

    for p in gpt.parameters():
        p.requires_grad_(False)
    modules = dict(gpt.named_modules())
    names = target_layers(arch, spec.target_modules)
    for index, name in enumerate(names):
        layer = modules[name]
        weight = layer.weight  # [out_local, in_local]
        kind = _PARALLEL[name.rsplit(".", 1)[1]]
        out_full, in_full = _full_shape(weight, kind)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
        a_full = torch.empty(spec.rank, in_full)
        bound = 1.0 / math.sqrt(in_full)  # kaiming_uniform_(a=sqrt(5)) on [r, in]: bound = 1/sqrt(fan_in)
        a_full.uniform_(-bound, bound, generator=gen)
        a = torch.nn.Parameter(a_full.to(weight.device, weight.dtype))
        b = torch.nn.Parameter(torch.zeros(out_full, spec.rank, device=weight.device, dtype=weight.dtype))
        if kind == "row" and getattr(weight, "tensor_model_parallel", False):
            _mark(a, weight, dim=1)
            a = torch.nn.Parameter(shard_of(a, a.data).clone(), requires_grad=True)
            _mark(a, weight, dim=1)
        if kind == "column" and getattr(weight, "tensor_model_parallel", False):
            _mark(b, weight, dim=0)
            b = torch.nn.Parameter(shard_of(b, b.data).clone(), requires_grad=True)
            _mark(b, weight, dim=0)
        layer.register_parameter("lora_A", a)
        layer.register_parameter("lora_B", b)
        layer.lora_parallel = kind
        layer.lora_scale = spec.scale
        layer.lora_dropout = spec.dropout
        layer.lora_bank = None
        layer.register_forward_hook(_add_adapter)
    return LoraLayers(tuple(names), spec, arch.is_moe)


def _full_shape(weight: Tensor, kind: Parallel) -> tuple[int, int]:
    """The full ``[out, in]`` of a (maybe TP-sharded) base weight."""
    out, inp = weight.shape
    if getattr(weight, "tensor_model_parallel", False):
        from megatron.core import parallel_state

        tp = parallel_state.get_tensor_model_parallel_world_size()
        if weight.partition_dim == 0:  # type: ignore[attr-defined]
            out *= tp
        else:
            inp *= tp
    return out, inp


def _mark(param: Tensor, like: Tensor, *, dim: int) -> None:
    param.tensor_model_parallel = True  # type: ignore[attr-defined]
    param.partition_dim = dim  # type: ignore[attr-defined]
    param.partition_stride = like.partition_stride if dim == like.partition_dim else 1  # type: ignore[attr-defined]


def _add_adapter(layer: Any, args: tuple[Tensor, ...], output: tuple[Tensor, Tensor | None]) -> tuple[Tensor, Any]:
    """The forward hook: the base output plus ``s B A x`` (one adapter, or each row's from the bank)."""
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        reduce_from_tensor_model_parallel_region,
    )

    x = args[0]
    out, bias = output
    if layer.lora_dropout > 0.0 and torch.is_grad_enabled() and layer.training:  # gradient forwards only
        x = torch.nn.functional.dropout(x, layer.lora_dropout)
    bank = layer.lora_bank
    if bank is None:
        h = x @ layer.lora_A.t()  # [..., r]
    else:
        a_stack, b_stack, slot = bank  # [K, r, in], [K, out, r], [N]
        h = torch.einsum("snd,nrd->snr", x, a_stack[slot])  # x [S, N, in]: row n uses version slot[n]
    group = layer.tp_group
    # contiguous: megatron's all-reduce reduces ``h.contiguous()`` in place and returns ``h``, so a strided ``h``
    # (the bank's einsum returns a permuted view) would come back unreduced at TP > 1 (found by the TP = 2 test)
    h = h.contiguous()
    h = copy_to_tensor_model_parallel_region(h, group) if layer.lora_parallel == "column" \
        else reduce_from_tensor_model_parallel_region(h, group)
    if bank is None:
        return _plus_scaled(out, h, layer.lora_B, layer.lora_scale), bias
    return _plus_scaled_per_row(out, h, bank[1][bank[2]], layer.lora_scale), bias


def _plus_scaled(out: Tensor, h: Tensor, b: Tensor, scale: float) -> Tensor:
    """``out + scale * h B^T`` (``out`` ``[..., o]``, ``h`` ``[..., r]``, ``b`` ``[o, r]``) as ONE GEMM that
    accumulates into the output: in place in a forward that records no gradient (scoring: the output is fresh
    and nobody else holds it), into a copy otherwise (the same kernel, so the two give the same bits). A product,
    a scaling and a sum would pass over the layer's whole output three times: profiled on small-llama
    (8 x 128 tokens, 1 thread) they cost about as much as the base GEMM of ``linear_fc1`` itself."""
    o = out.shape[-1]
    if not torch.is_grad_enabled() and out.is_contiguous():
        out.view(-1, o).addmm_(h.reshape(-1, h.shape[-1]), b.t(), alpha=scale)
        return out
    return torch.addmm(out.reshape(-1, o), h.reshape(-1, h.shape[-1]), b.t(), alpha=scale).view(out.shape)


def _plus_scaled_per_row(out: Tensor, h: Tensor, b: Tensor, scale: float) -> Tensor:
    """The adapter bank's ``out[:, n] + scale * h[:, n] B_n^T`` (``out`` ``[S, N, o]``, ``h`` ``[S, N, r]``, ``b``
    ``[N, o, r]``: row ``n``'s version) as one batched GEMM over the rows that accumulates into the output (in
    place when no gradient is recorded), not an einsum's permuted product added afterwards."""
    o_rows, h_rows, b_t = out.transpose(0, 1), h.transpose(0, 1), b.transpose(1, 2)  # [N, S, o], [N, S, r], [N, r, o]
    if not torch.is_grad_enabled():
        o_rows.baddbmm_(h_rows, b_t, alpha=scale)
        return out
    return torch.baddbmm(o_rows, h_rows, b_t, alpha=scale).transpose(0, 1).contiguous()


@contextlib.contextmanager
def adapter_bank(gpt: torch.nn.Module, layers: LoraLayers, versions: Sequence[Mapping[str, Tensor]],
                 slot: Tensor) -> Iterator[None]:
    """Within the block, row ``n`` of every forward of ``gpt`` uses the adapters ``versions[slot[n]]``.

    Args:
        versions: ``K`` adapter dicts named like :meth:`LoraLayers.param_names` (this rank's shards).
        slot: ``[N]`` long, each in ``0..K-1``: the version of each row of the batch the block runs.
    """
    if layers.moe:
        raise ValueError("adapter_bank: a MoE expert sees tokens out of their rows; score one version at a time")
    if slot.dim() != 1 or (len(slot) and (int(slot.min()) < 0 or int(slot.max()) >= len(versions))):
        raise ValueError(f"adapter_bank: slot must be [N] in 0..{len(versions) - 1}; got {tuple(slot.shape)}")
    modules = dict(gpt.named_modules())
    try:
        for name in layers.names:
            layer = modules[name]
            dev, dt = layer.lora_A.device, layer.lora_A.dtype
            a = torch.stack([v[name + A_SUFFIX] for v in versions]).to(dev, dt)
            b = torch.stack([v[name + B_SUFFIX] for v in versions]).to(dev, dt)
            layer.lora_bank = (a, b, slot.to(dev))
        yield
    finally:
        for name in layers.names:
            modules[name].lora_bank = None


# ------------------------------------------------------------------------------ merged weights and HF names
def merged(base: Tensor, a: Tensor, b: Tensor, scale: float) -> Tensor:
    """``W + s B A`` in fp32 (full tensors ``[out, in]``, ``[r, in]``, ``[out, r]``)."""
    return base.float() + scale * (b.float() @ a.float())


def hf_adapter_tensors(adapters: Mapping[str, Tensor], arch: ModelArch, *,
                       scale: float = 1.0) -> Iterator[tuple[str, Tensor]]:
    """Full megatron adapters -> ``(HF name, tensor)`` in peft's per-projection naming
    (``model.layers.0.self_attn.q_proj.lora_A.weight``), ``B`` multiplied by ``scale``.

    A fused layer's adapter is exactly one adapter per projection: q, k and v share ``A`` and each takes its
    rows of ``B`` (the grouped interleave of ``docs/architecture.md`` undone), gate and up likewise
    (``[gate; up]``). ``scale=1`` gives the trained ``B`` (an exported peft folder carries ``alpha``);
    the weight sync sends ``s B`` so that a receiver needs no configuration."""
    nh, ng, hn = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    hpg = nh // ng
    layers = sorted({k[: -len(A_SUFFIX)] for k in adapters if k.endswith(A_SUFFIX)}, key=_layer_order)
    for name in layers:
        a, b = adapters[name + A_SUFFIX], adapters[name + B_SUFFIX] * scale
        hf = name.replace("decoder.layers.", "model.layers.")
        kind = name.rsplit(".", 1)[1]
        if kind == "linear_qkv":
            p = hf.replace("self_attention.linear_qkv", "self_attn.")
            r = b.shape[1]
            q, k, v = b.reshape(ng, (hpg + 2) * hn, r).split([hpg * hn, hn, hn], dim=1)
            for proj, part in (("q_proj", q.reshape(nh * hn, r)), ("k_proj", k.reshape(ng * hn, r)),
                               ("v_proj", v.reshape(ng * hn, r))):
                yield p + f"{proj}.lora_A.weight", a
                yield p + f"{proj}.lora_B.weight", part
        elif kind == "linear_proj":
            p = hf.replace("self_attention.linear_proj", "self_attn.o_proj")
            yield p + ".lora_A.weight", a
            yield p + ".lora_B.weight", b
        elif kind == "linear_fc1":
            p = hf.replace("local_experts.", "").replace("linear_fc1", "")
            gate, up = b.chunk(2, dim=0)
            for proj, part in (("gate_proj", gate), ("up_proj", up)):
                yield p + f"{proj}.lora_A.weight", a
                yield p + f"{proj}.lora_B.weight", part
        else:  # linear_fc2
            p = hf.replace("local_experts.", "").replace("linear_fc2", "down_proj")
            yield p + ".lora_A.weight", a
            yield p + ".lora_B.weight", b


def _layer_order(name: str) -> tuple[int, str]:
    parts = name.split(".")
    return int(parts[2]), name


def hf_with_adapters(own: Mapping[str, Tensor], arch: ModelArch, scale: float) -> dict[str, Tensor]:
    """A full megatron state dict with adapters -> the base's HF tensors plus the adapters in peft's names,
    ``B`` multiplied by ``scale`` (what a rollout engine merges: :mod:`asyncrl.rollout.adapter_merge`)."""
    from asyncrl.trainer.megatron.convert import megatron_to_hf

    base = megatron_to_hf({k: v for k, v in own.items() if not is_adapter_name(k)}, arch)
    return base | dict(hf_adapter_tensors({k: v for k, v in own.items() if is_adapter_name(k)}, arch, scale=scale))
