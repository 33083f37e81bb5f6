"""Megatron ``GPTModel`` <-> Hugging Face checkpoint names, per family, one tensor at a time.

The mapping is the measured one of ``docs/architecture.md`` (megatron-core on the CPU) (TP = PP = 1, local
layer spec, unwrapped model), extended per family (:mod:`asyncrl.api.model_arch`). Notation: ``nh``
query heads, ``ng`` key/value heads (query groups), ``hn`` head dim, ``H`` hidden, ``hpg = nh // ng``,
``I`` SwiGLU inner size (per expert for MoE), ``E`` experts; weights ``[out, in]``.

- ``linear_qkv`` ``[ng * (hpg + 2) * hn, H]`` is **grouped**: for each query group g, the rows of
  its ``hpg`` query heads, then its key head, then its value head. A plain ``[Q; K; V]`` concat is
  wrong (logits off by O(1)). Query head h belongs to group ``h // hpg``, the same sharing as HF's
  ``repeat_kv``. Qwen2's q/k/v biases are fused the same way (``linear_qkv.bias``).
- ``linear_fc1`` ``[2I, H]`` = ``[gate; up]`` (gate first: megatron's GLU applies the activation
  to the first half); the same per expert (``mlp.experts.local_experts.E.linear_fc1``).
- Qwen3 QK-norm: HF ``self_attn.{q,k}_norm.weight`` ``[hn]`` = megatron ``{q,k}_layernorm.weight``.
- Qwen3-MoE: HF ``mlp.gate.weight`` ``[E, H]`` = megatron ``mlp.router.weight``; the experts keep
  their index.
- Tied embeddings: megatron has no ``output_layer.weight``; HF's ``lm_head.weight`` is the
  embedding. ``megatron_to_hf`` emits it (so ``load_state_dict(strict=True)`` works), safetensors
  files leave it out (as ``save_pretrained`` does), ``hf_to_megatron`` drops it.

Both directions are generators underneath (:func:`iter_hf_to_megatron`, :func:`iter_megatron_to_hf`):
each megatron tensor is built from the HF tensors it needs when it is asked for, so a lazy source
(:class:`asyncrl.trainer.megatron.hf_folder.HFFolder`, memory-mapped safetensors) is read one
tensor at a time and never held twice (:func:`load_folder_into`). Every tensor is checked against
the shape the architecture implies first; a mismatch names the key and both shapes.
"""

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from asyncrl.api.model_arch import ModelArch, hf_param_shapes
from asyncrl.trainer.megatron.hf_folder import HFFolder, load_hf
from asyncrl.trainer.megatron.parallel import shard_of

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
Shapes = dict[str, tuple[int, ...]]

__all__ = [
    "LoadReport", "hf_shapes", "hf_to_megatron", "iter_hf_to_megatron", "iter_megatron_to_hf", "llama_config",
    "load_folder", "load_folder_into", "load_hf", "megatron_shapes", "megatron_to_hf",
]


def llama_config(arch: ModelArch) -> Any:
    """The transformers config of ``arch``'s family: the very one the rollout engine builds (one
    definition, in ``asyncrl.rollout.hf_model``; imported lazily to keep transformers out of the
    actor's import path)."""
    from asyncrl.rollout.hf_model import hf_config

    return hf_config(arch)


# ---------------------------------------------------------------------------------------------- names
def _layer_pairs(arch: ModelArch, i: int) -> dict[str, str]:
    """One-to-one renames of layer ``i``: megatron name -> HF name."""
    m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
    out = {
        m + "input_layernorm.weight": h + "input_layernorm.weight",
        m + "self_attention.linear_proj.weight": h + "self_attn.o_proj.weight",
        m + "pre_mlp_layernorm.weight": h + "post_attention_layernorm.weight",
    }
    if arch.qk_norm:
        out |= {
            m + "self_attention.q_layernorm.weight": h + "self_attn.q_norm.weight",
            m + "self_attention.k_layernorm.weight": h + "self_attn.k_norm.weight",
        }
    if arch.is_moe:
        out[m + "mlp.router.weight"] = h + "mlp.gate.weight"
        for e in range(arch.num_experts):
            out[m + f"mlp.experts.local_experts.{e}.linear_fc2.weight"] = h + f"mlp.experts.{e}.down_proj.weight"
    else:
        out[m + "mlp.linear_fc2.weight"] = h + "mlp.down_proj.weight"
    return out


def _fc1_pairs(arch: ModelArch, i: int) -> dict[str, str]:
    """megatron ``linear_fc1`` name -> HF prefix holding ``gate_proj``/``up_proj`` (dense or per expert)."""
    m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
    if arch.is_moe:
        return {
            m + f"mlp.experts.local_experts.{e}.linear_fc1.weight": h + f"mlp.experts.{e}."
            for e in range(arch.num_experts)
        }
    return {m + "mlp.linear_fc1.weight": h + "mlp."}


def megatron_shapes(arch: ModelArch) -> Shapes:
    """Every megatron parameter name of ``arch`` and its shape."""
    H, V, hn = arch.hidden_size, arch.vocab_size, arch.head_dim
    nh, ng = arch.num_attention_heads, arch.num_key_value_heads
    inner = arch.moe_ffn_hidden_size if arch.is_moe else arch.ffn_hidden_size
    shapes: Shapes = {"embedding.word_embeddings.weight": (V, H)}
    for i in range(arch.num_layers):
        m = f"decoder.layers.{i}."
        shapes |= {
            m + "input_layernorm.weight": (H,),
            m + "self_attention.linear_qkv.weight": ((nh + 2 * ng) * hn, H),
            m + "self_attention.linear_proj.weight": (H, nh * hn),
            m + "pre_mlp_layernorm.weight": (H,),
        }
        if arch.qkv_bias:
            shapes[m + "self_attention.linear_qkv.bias"] = ((nh + 2 * ng) * hn,)
        if arch.qk_norm:
            shapes |= {m + "self_attention.q_layernorm.weight": (hn,), m + "self_attention.k_layernorm.weight": (hn,)}
        if arch.is_moe:
            shapes[m + "mlp.router.weight"] = (arch.num_experts, H)
        shapes |= {k: (2 * inner, H) for k in _fc1_pairs(arch, i)}
        shapes |= {k: (H, inner) for k in _layer_pairs(arch, i) if k.endswith("linear_fc2.weight")}
    shapes["decoder.final_layernorm.weight"] = (H,)
    if not arch.tie_embeddings:
        shapes["output_layer.weight"] = (V, H)
    return shapes


def hf_shapes(arch: ModelArch, *, with_tied_head: bool = True) -> Shapes:
    """Every HF checkpoint name of ``arch`` and its shape (one definition: ``api.model_arch.hf_param_shapes``)."""
    return hf_param_shapes(arch, with_tied_head=with_tied_head)


# ------------------------------------------------------------------------------------------ HF -> mcore
def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, arch: ModelArch) -> torch.Tensor:
    """``[nh*hn, *r]``, ``[ng*hn, *r]``, ``[ng*hn, *r]`` -> grouped ``[ng*(hpg+2)*hn, *r]`` (weights or biases)."""
    ng, hn = arch.num_key_value_heads, arch.head_dim
    hpg = arch.num_attention_heads // ng
    rest = q.shape[1:]
    return torch.cat(
        [q.reshape(ng, hpg * hn, *rest), k.reshape(ng, hn, *rest), v.reshape(ng, hn, *rest)], dim=1
    ).reshape(ng * (hpg + 2) * hn, *rest)


def _read(src: Mapping[str, torch.Tensor], key: str) -> torch.Tensor:
    return src[key]


def _qkv(src: Mapping[str, torch.Tensor], arch: ModelArch, h: str, suffix: str) -> torch.Tensor:
    a = h + "self_attn."
    return _fuse_qkv(src[a + f"q_proj.{suffix}"], src[a + f"k_proj.{suffix}"], src[a + f"v_proj.{suffix}"], arch)


def _fc1(src: Mapping[str, torch.Tensor], prefix: str) -> torch.Tensor:
    return torch.cat([src[prefix + "gate_proj.weight"], src[prefix + "up_proj.weight"]], 0)  # [gate; up]


def _hf_builders(arch: ModelArch, src: Mapping[str, torch.Tensor]) -> dict[str, Callable[[], torch.Tensor]]:
    """megatron name -> a thunk reading the HF tensors it is made of (nothing is read until called)."""
    out: dict[str, Callable[[], torch.Tensor]] = {
        "embedding.word_embeddings.weight": partial(_read, src, "model.embed_tokens.weight"),
    }
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        out |= {mc: partial(_read, src, hf) for mc, hf in _layer_pairs(arch, i).items()}
        out[m + "self_attention.linear_qkv.weight"] = partial(_qkv, src, arch, h, "weight")
        if arch.qkv_bias:
            out[m + "self_attention.linear_qkv.bias"] = partial(_qkv, src, arch, h, "bias")
        out |= {mc: partial(_fc1, src, p) for mc, p in _fc1_pairs(arch, i).items()}
    out["decoder.final_layernorm.weight"] = partial(_read, src, "model.norm.weight")
    if not arch.tie_embeddings:
        out["output_layer.weight"] = partial(_read, src, "lm_head.weight")
    return out


def _hf_source_shapes(hf: Mapping[str, torch.Tensor]) -> Shapes:
    if isinstance(hf, HFFolder):
        return hf.shapes()
    return {k: tuple(v.shape) for k, v in hf.items()}


def iter_hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: ModelArch) -> Iterator[tuple[str, torch.Tensor]]:
    """``(megatron name, tensor)`` pairs, built one at a time from ``hf`` (a dict or a lazy :class:`HFFolder`).

    The key set and every shape are checked (all problems at once) before the first tensor is read.
    For a tied architecture ``lm_head.weight`` may be present only if it equals the embedding.
    """
    shapes = _hf_source_shapes(hf)
    source = getattr(hf, "source", "HF")
    if arch.tie_embeddings and "lm_head.weight" in shapes:
        shapes.pop("lm_head.weight")
        if not torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"]):
            raise ValueError(
                f"{source}: tied architecture (tie_word_embeddings true) but lm_head.weight differs from "
                "model.embed_tokens.weight; set tie_word_embeddings false in config.json or drop lm_head.weight"
            )
    _check_shapes(shapes, hf_shapes(arch, with_tied_head=False), source)
    for name, build in _hf_builders(arch, hf).items():
        yield name, build()


def hf_to_megatron(hf: Mapping[str, torch.Tensor], arch: ModelArch) -> dict[str, torch.Tensor]:
    """Megatron ``GPTModel`` tensors (loadable with ``strict=True``) from HF checkpoint names."""
    return dict(iter_hf_to_megatron(hf, arch))


def load_folder_into(gpt: torch.nn.Module, arch: ModelArch, folder: HFFolder) -> int:
    """Copy a folder's weights into the parameters of ``gpt`` (an unwrapped ``GPTModel``), one tensor
    at a time (read memory-mapped, converted, cast to the parameter's dtype and device, released).

    Returns the number of bytes copied. Every parameter must be written: a left-over one is an error.
    """
    params = {k: v for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
    owners = dict(gpt.named_parameters())  # their tensor-parallel attributes (a TP rank keeps its slice)
    done, nbytes = set(), 0
    with torch.no_grad():
        for name, tensor in iter_hf_to_megatron(folder, arch):
            params[name].copy_(shard_of(owners.get(name, params[name]), tensor))
            done.add(name)
            nbytes += params[name].numel() * params[name].element_size()
            del tensor
    if left := sorted(set(params) - done):
        raise ValueError(f"{folder.source}: no weights for megatron parameters {left[:5]} (of {len(left)})")
    return nbytes


@dataclass(frozen=True)
class LoadReport:
    """What loading a weights folder into the actor cost (logged, and in the run's summary)."""

    folder: str
    architecture: str
    tensors: int  # megatron parameters written
    file_bytes: int  # size of the folder's safetensors files
    param_bytes: int  # bytes written into the model's parameters
    dtypes: tuple[str, ...]  # on-disk dtypes (safetensors names)
    seconds: float  # open + read + convert + copy
    peak_rss_bytes: int  # the process's peak resident set after loading (includes the model itself)

    def record(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"dtypes": list(self.dtypes)}

    def line(self) -> str:
        return (f"loaded {self.architecture} from {self.folder}: {self.tensors} tensors, "
                f"{self.file_bytes / 2**20:.1f} MiB on disk ({'/'.join(self.dtypes)}) in {self.seconds:.2f} s, "
                f"peak RSS {self.peak_rss_bytes / 2**20:.0f} MiB")


def peak_rss_bytes() -> int:
    """Peak resident set size of this process: Linux's ``VmHWM`` (reset by ``exec``, unlike ``ru_maxrss``,
    which a child inherits from its parent), else ``ru_maxrss`` (KiB)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def load_folder(gpt: torch.nn.Module, arch: ModelArch, directory: str) -> LoadReport:
    """:func:`load_folder_into` from a folder path, timed, with the peak RSS after it."""
    start = time.perf_counter()
    folder = HFFolder(directory)
    try:
        dtypes = tuple(sorted(set(folder.dtypes().values())))
        nbytes = load_folder_into(gpt, arch, folder)
        tensors = len(megatron_shapes(arch))
        file_bytes = folder.nbytes()
    finally:
        folder.close()
    return LoadReport(folder.source, arch.architecture, tensors, file_bytes, nbytes, dtypes,
                      round(time.perf_counter() - start, 3), peak_rss_bytes())


# ------------------------------------------------------------------------------------------ mcore -> HF
def iter_megatron_to_hf(mcore: Mapping[str, torch.Tensor], arch: ModelArch) -> Iterator[tuple[str, torch.Tensor]]:
    """``(HF name, tensor)`` pairs from a megatron state dict (``module.`` prefixes and ``_extra_state``
    entries ignored); views of the inputs where no reshuffle is needed. Tied: ``lm_head.weight`` last,
    the embedding itself."""
    src = _strip(mcore)
    _check_shapes({k: tuple(v.shape) for k, v in src.items()}, megatron_shapes(arch), "megatron")
    nh, ng, hn = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    hpg = nh // ng
    yield "model.embed_tokens.weight", src["embedding.word_embeddings.weight"]
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        for suffix in ("weight", "bias") if arch.qkv_bias else ("weight",):
            fused = src[m + f"self_attention.linear_qkv.{suffix}"]
            rest = fused.shape[1:]
            # [ng*(hpg+2)*hn, *r] -> per group [hpg*hn | hn | hn] -> q, k, v
            q, k, v = fused.view(ng, (hpg + 2) * hn, *rest).split([hpg * hn, hn, hn], dim=1)
            yield h + f"self_attn.q_proj.{suffix}", q.reshape(nh * hn, *rest)
            yield h + f"self_attn.k_proj.{suffix}", k.reshape(ng * hn, *rest)
            yield h + f"self_attn.v_proj.{suffix}", v.reshape(ng * hn, *rest)
        for mc, hf in _layer_pairs(arch, i).items():
            yield hf, src[mc]
        for mc, p in _fc1_pairs(arch, i).items():
            gate, up = src[mc].chunk(2, dim=0)
            yield p + "gate_proj.weight", gate
            yield p + "up_proj.weight", up
    yield "model.norm.weight", src["decoder.final_layernorm.weight"]
    yield "lm_head.weight", src["embedding.word_embeddings.weight" if arch.tie_embeddings else "output_layer.weight"]


def megatron_to_hf(mcore: Mapping[str, torch.Tensor], arch: ModelArch) -> dict[str, torch.Tensor]:
    """HF-named tensors from a megatron ``GPTModel`` state dict (see :func:`iter_megatron_to_hf`)."""
    return dict(iter_megatron_to_hf(mcore, arch))


# ----------------------------------------------------------------------------------------------- checks
def _strip(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop DDP's ``module.`` prefix and megatron's ``_extra_state`` entries."""
    out = {}
    for key, value in state.items():
        while key.startswith("module."):
            key = key[len("module.") :]
        if not key.endswith("_extra_state"):
            out[key] = value
    return out


def _check_shapes(state: Shapes, expected: Shapes, side: str) -> None:
    """Raise one error listing every missing, unexpected and mis-shaped tensor."""
    problems = [f"missing {k} {list(s)}" for k, s in expected.items() if k not in state]
    problems += [f"unexpected {k}" for k in state if k not in expected]
    problems += [
        f"{k}: got {list(state[k])}, expected {list(s)}"
        for k, s in expected.items()
        if k in state and tuple(state[k]) != s
    ]
    if problems:
        shown = problems[:12] + ([f"... {len(problems) - 12} more"] if len(problems) > 12 else [])
        raise ValueError(
            f"{side} state dict does not fit the architecture: " + "; ".join(shown)
            + ("; the weights and config.json disagree: re-save the folder with save_pretrained "
               "or fix config.json" if side != "megatron" else "")
        )
