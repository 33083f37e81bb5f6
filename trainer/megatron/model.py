"""Build the megatron-core ``GPTModel`` for a :class:`~asyncrl.api.model_arch.LlamaArch`.

The kwargs are the measured Llama mapping of ``shared/reference/megatron-llama.md`` §1: RMSNorm
with the architecture's epsilon (megatron's default 1e-5 silently differs from HF's 1e-6),
SwiGLU (``gated_linear_unit`` + SiLU, fc1 = [gate; up]), RoPE with ``rotary_interleaved=False``
(HF's rotate-half), grouped-query attention via ``num_query_groups``, no biases, tied or untied
embeddings. Call :func:`asyncrl.trainer.megatron.compat.init_megatron` first.
"""

from typing import Any

import torch

from asyncrl.api.model_arch import LlamaArch


def transformer_config(arch: LlamaArch, *, use_cpu_initialization: bool = True, init_std: float = 0.02):
    """The megatron ``TransformerConfig`` of ``arch`` in fp32 (no dropout)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=init_std,
        use_cpu_initialization=use_cpu_initialization,
        params_dtype=torch.float32,
        # Already the 0.16.1 defaults, pinned because the HF mapping depends on them.
        rotary_interleaved=False,
        apply_rope_fusion=False,
        attention_softmax_in_fp32=True,
    )


def build_gpt_model(arch: LlamaArch, *, use_cpu_initialization: bool = True, init_std: float = 0.02):
    """A fresh, randomly initialised megatron ``GPTModel`` (fp32) for ``arch``.

    With ``use_cpu_initialization`` the weights come from torch's default CPU generator, so
    ``torch.manual_seed`` before this call makes the init reproducible.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = transformer_config(arch, use_cpu_initialization=use_cpu_initialization, init_std=init_std)
    return GPTModel(
        config=config,
        # The spec argument only matters when Apex is installed (its fused norm is LayerNorm-only);
        # config.normalization is what selects RMSNorm here. Set both.
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_sequence_length,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
        rotary_percent=1.0,
        share_embeddings_and_output_weights=arch.tie_embeddings,
        parallel_output=True,
    )


def causal_mask(seq_len: int, device: torch.device) -> torch.Tensor:
    """Megatron's attention mask ``[1, 1, T, T]`` bool, **True = masked** (the future).

    Always passed explicitly: ``attention_mask=None`` makes megatron build its causal mask with
    ``device="cuda"``. Right padding needs no key-padding term: a padded key only ever sits after
    every real query, where the causal mask already hides it.
    """
    return torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=device), diagonal=1)[None, None]


def position_ids(batch: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """``[B, T]`` positions ``0..T-1``; megatron's RoPE uses ``arange(T)`` whatever is passed."""
    return torch.arange(seq_len, device=device).expand(batch, seq_len)


def unwrap(model: Any) -> Any:
    """The ``GPTModel`` inside megatron's DDP wrapper (or the model itself); typed ``Any`` because
    megatron's modules carry attributes (``post_process``, ``output_layer``) torch's stubs lack."""
    while hasattr(model, "module"):
        model = model.module
    return model
