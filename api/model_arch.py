"""Resolve ``spec.model`` into the concrete Llama-family architecture both sides build.

The actor (megatron-core ``GPTModel``) and the rollout engine (transformers
``LlamaForCausalLM``) must build the *same* network, so both take a :class:`LlamaArch` from
:func:`resolve_arch`. Pure data: no torch.
"""

from dataclasses import dataclass, replace
from typing import Any

from asyncrl.api.job import ModelSpec


@dataclass(frozen=True)
class LlamaArch:
    """A Llama-family decoder: RMSNorm, SwiGLU, RoPE, grouped-query attention."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_sequence_length: int
    tie_embeddings: bool
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# vocab_size 0 = taken from the task's tokenizer at resolve time.
PRESETS: dict[str, LlamaArch] = {
    "tiny-llama": LlamaArch(128, 2, 4, 2, 256, 0, 128, True),
    "small-llama": LlamaArch(256, 4, 8, 4, 1024, 0, 256, True),
    "smollm2-135m": LlamaArch(576, 30, 9, 3, 1536, 49152, 2048, True, rope_theta=100000.0),
}


def resolve_arch(spec: ModelSpec, vocab_size: int, max_sequence_length: int | None = None) -> LlamaArch:
    """The preset of ``spec`` with its overrides applied.

    Args:
        spec: the job's ``model`` section.
        vocab_size: the task tokenizer's vocabulary (used when the preset does not fix one).
        max_sequence_length: raise the preset's context length to at least this many tokens.
    """
    if spec.preset not in PRESETS:
        raise ValueError(f"model.preset {spec.preset!r} is unknown; valid presets: {', '.join(PRESETS)}")
    arch = PRESETS[spec.preset]
    overrides: dict[str, Any] = {
        "hidden_size": spec.hidden_size,
        "num_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "ffn_hidden_size": spec.ffn_hidden_size,
        "tie_embeddings": spec.tie_embeddings,
    }
    arch = replace(arch, **{k: v for k, v in overrides.items() if v is not None})
    if arch.vocab_size == 0:
        arch = replace(arch, vocab_size=vocab_size)
    if max_sequence_length is not None and max_sequence_length > arch.max_sequence_length:
        arch = replace(arch, max_sequence_length=max_sequence_length)
    problems = []
    if arch.hidden_size % arch.num_attention_heads:
        problems.append(f"hiddenSize {arch.hidden_size} is not a multiple of numAttentionHeads {arch.num_attention_heads}")
    if arch.num_attention_heads % arch.num_key_value_heads:
        problems.append(
            f"numAttentionHeads {arch.num_attention_heads} is not a multiple of numKeyValueHeads {arch.num_key_value_heads}"
        )
    if problems:
        raise ValueError("spec.model: " + "; ".join(problems))
    return arch
