"""Megatron ``GPTModel`` <-> HF ``LlamaForCausalLM`` weights, and HF safetensors folders.

The mapping is the measured one of ``shared/reference/megatron-llama.md`` §2 (TP = PP = 1, local
layer spec, unwrapped model). Notation: ``nh`` query heads, ``ng`` key/value heads (query groups),
``hn`` head dim, ``H`` hidden, ``hpg = nh // ng``, ``I`` SwiGLU inner size; weights ``[out, in]``.

- ``linear_qkv`` ``[ng * (hpg + 2) * hn, H]`` is **grouped**: for each query group g, the rows of
  its ``hpg`` query heads, then its key head, then its value head. A plain ``[Q; K; V]`` concat is
  wrong (logits off by O(1)). Query head h belongs to group ``h // hpg``, the same sharing as HF's
  ``repeat_kv``.
- ``linear_fc1`` ``[2I, H]`` = ``[gate; up]`` (gate first: megatron's GLU applies the activation
  to the first half).
- Tied embeddings: megatron has no ``output_layer.weight``; HF's ``lm_head.weight`` is the
  embedding. ``megatron_to_hf`` emits it (so ``load_state_dict(strict=True)`` works), safetensors
  files leave it out (as ``save_pretrained`` does), ``hf_to_megatron`` drops it.

Every tensor is checked against the shape the architecture implies; a mismatch names the key and
both shapes.
"""

import json
import os
from typing import Any

import torch

from asyncrl.api.model_arch import LlamaArch

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def llama_config(arch: LlamaArch) -> Any:
    """The transformers ``LlamaConfig`` of ``arch``: the very one the rollout engine builds (one
    definition, in ``asyncrl.rollout.hf_model``; imported lazily to keep transformers out of the
    actor's import path)."""
    from asyncrl.rollout.hf_model import llama_config as rollout_llama_config

    return rollout_llama_config(arch)


def megatron_to_hf(mcore: dict[str, torch.Tensor], arch: LlamaArch) -> dict[str, torch.Tensor]:
    """HF-named tensors from a megatron ``GPTModel`` state dict (``module.`` prefixes and
    ``_extra_state`` entries are ignored). Tensors are views of the inputs where no reshuffle is needed."""
    src = _strip(mcore)
    _check_shapes(src, megatron_shapes(arch), "megatron")
    nh, ng, hn, H = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, arch.hidden_size
    hpg, inner = nh // ng, arch.ffn_hidden_size
    out = {"model.embed_tokens.weight": src["embedding.word_embeddings.weight"]}
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        # [ng*(hpg+2)*hn, H] -> per group [hpg*hn | hn | hn] -> q, k, v
        q, k, v = (
            src[m + "self_attention.linear_qkv.weight"]
            .view(ng, (hpg + 2) * hn, H)
            .split([hpg * hn, hn, hn], dim=1)
        )
        gate, up = src[m + "mlp.linear_fc1.weight"].split([inner, inner], dim=0)
        out |= {
            h + "input_layernorm.weight": src[m + "input_layernorm.weight"],
            h + "self_attn.q_proj.weight": q.reshape(nh * hn, H),
            h + "self_attn.k_proj.weight": k.reshape(ng * hn, H),
            h + "self_attn.v_proj.weight": v.reshape(ng * hn, H),
            h + "self_attn.o_proj.weight": src[m + "self_attention.linear_proj.weight"],
            h + "post_attention_layernorm.weight": src[m + "pre_mlp_layernorm.weight"],
            h + "mlp.gate_proj.weight": gate,
            h + "mlp.up_proj.weight": up,
            h + "mlp.down_proj.weight": src[m + "mlp.linear_fc2.weight"],
        }
    out["model.norm.weight"] = src["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = (
        out["model.embed_tokens.weight"] if arch.tie_embeddings else src["output_layer.weight"]
    )
    return out


def hf_to_megatron(hf: dict[str, torch.Tensor], arch: LlamaArch) -> dict[str, torch.Tensor]:
    """Megatron ``GPTModel`` tensors (loadable with ``strict=True``) from HF Llama names.

    For a tied architecture ``lm_head.weight`` may be absent; if present it must equal the embedding.
    """
    src = dict(hf)
    if arch.tie_embeddings and "lm_head.weight" in src:
        lm_head = src.pop("lm_head.weight")
        if not torch.equal(lm_head, src.get("model.embed_tokens.weight", lm_head)):
            raise ValueError("tied architecture but lm_head.weight differs from model.embed_tokens.weight")
    _check_shapes(src, hf_shapes(arch, with_tied_head=False), "HF")
    nh, ng, hn, H = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim, arch.hidden_size
    hpg = nh // ng
    out = {"embedding.word_embeddings.weight": src["model.embed_tokens.weight"]}
    for i in range(arch.num_layers):
        m, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = torch.cat(
            [
                src[h + "self_attn.q_proj.weight"].view(ng, hpg * hn, H),
                src[h + "self_attn.k_proj.weight"].view(ng, hn, H),
                src[h + "self_attn.v_proj.weight"].view(ng, hn, H),
            ],
            dim=1,
        ).reshape(ng * (hpg + 2) * hn, H)
        out |= {
            m + "input_layernorm.weight": src[h + "input_layernorm.weight"],
            m + "self_attention.linear_qkv.weight": qkv,
            m + "self_attention.linear_proj.weight": src[h + "self_attn.o_proj.weight"],
            m + "pre_mlp_layernorm.weight": src[h + "post_attention_layernorm.weight"],
            m + "mlp.linear_fc1.weight": torch.cat(
                [src[h + "mlp.gate_proj.weight"], src[h + "mlp.up_proj.weight"]], 0
            ),
            m + "mlp.linear_fc2.weight": src[h + "mlp.down_proj.weight"],
        }
    out["decoder.final_layernorm.weight"] = src["model.norm.weight"]
    if not arch.tie_embeddings:
        out["output_layer.weight"] = src["lm_head.weight"]
    return out


def megatron_shapes(arch: LlamaArch) -> dict[str, tuple[int, ...]]:
    """Every megatron parameter name of ``arch`` and its shape."""
    H, V, inner = arch.hidden_size, arch.vocab_size, arch.ffn_hidden_size
    qkv_rows = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {"embedding.word_embeddings.weight": (V, H)}
    for i in range(arch.num_layers):
        m = f"decoder.layers.{i}."
        shapes |= {
            m + "input_layernorm.weight": (H,),
            m + "self_attention.linear_qkv.weight": (qkv_rows, H),
            m + "self_attention.linear_proj.weight": (H, arch.num_attention_heads * arch.head_dim),
            m + "pre_mlp_layernorm.weight": (H,),
            m + "mlp.linear_fc1.weight": (2 * inner, H),
            m + "mlp.linear_fc2.weight": (H, inner),
        }
    shapes["decoder.final_layernorm.weight"] = (H,)
    if not arch.tie_embeddings:
        shapes["output_layer.weight"] = (V, H)
    return shapes


def hf_shapes(arch: LlamaArch, *, with_tied_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Every HF Llama parameter name of ``arch`` and its shape."""
    H, V, inner = arch.hidden_size, arch.vocab_size, arch.ffn_hidden_size
    q_rows, kv_rows = arch.num_attention_heads * arch.head_dim, arch.num_key_value_heads * arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(arch.num_layers):
        h = f"model.layers.{i}."
        shapes |= {
            h + "input_layernorm.weight": (H,),
            h + "self_attn.q_proj.weight": (q_rows, H),
            h + "self_attn.k_proj.weight": (kv_rows, H),
            h + "self_attn.v_proj.weight": (kv_rows, H),
            h + "self_attn.o_proj.weight": (H, q_rows),
            h + "post_attention_layernorm.weight": (H,),
            h + "mlp.gate_proj.weight": (inner, H),
            h + "mlp.up_proj.weight": (inner, H),
            h + "mlp.down_proj.weight": (H, inner),
        }
    shapes["model.norm.weight"] = (H,)
    if with_tied_head or not arch.tie_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def save_hf(hf: dict[str, torch.Tensor], arch: LlamaArch, directory: str) -> None:
    """Write ``model.safetensors`` (fp32, contiguous, tied head left out) and ``config.json``.

    The folder loads with ``LlamaForCausalLM.from_pretrained(directory)``.
    """
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {
        k: v.detach().to("cpu", torch.float32).contiguous()
        for k, v in hf.items()
        if not (arch.tie_embeddings and k == "lm_head.weight")
    }
    save_file(tensors, os.path.join(directory, WEIGHTS_FILE), metadata={"format": "pt"})
    config = llama_config(arch).to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True, default=str)


def load_hf(directory: str) -> dict[str, torch.Tensor]:
    """HF-named tensors from every ``*.safetensors`` file of ``directory`` (sharded or not; ``~`` is
    expanded, as ``spec.model.weights`` may name the user's model cache)."""
    from safetensors.torch import load_file

    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"no weights folder {directory!r} (spec.model.weights); a pulled model's folder is what "
            "'asyncrl models pull smollm2' prints"
        )
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {directory}")
    out: dict[str, torch.Tensor] = {}
    for name in files:
        out |= load_file(os.path.join(directory, name))
    return out


def _strip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop DDP's ``module.`` prefix and megatron's ``_extra_state`` entries."""
    out = {}
    for key, value in state.items():
        while key.startswith("module."):
            key = key[len("module.") :]
        if not key.endswith("_extra_state"):
            out[key] = value
    return out


def _check_shapes(state: dict[str, torch.Tensor], expected: dict[str, tuple[int, ...]], side: str) -> None:
    """Raise one error listing every missing, unexpected and mis-shaped tensor."""
    problems = [f"missing {k} {list(s)}" for k, s in expected.items() if k not in state]
    problems += [f"unexpected {k}" for k in state if k not in expected]
    problems += [
        f"{k}: got {list(state[k].shape)}, expected {list(s)}"
        for k, s in expected.items()
        if k in state and tuple(state[k].shape) != s
    ]
    if problems:
        raise ValueError(f"{side} state dict does not fit the architecture: " + "; ".join(problems))
