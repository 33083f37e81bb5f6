"""Build a transformers ``LlamaForCausalLM`` from a :class:`LlamaArch` and load HF-named weights.

The actor's converter produces exactly the HF names (``model.embed_tokens.weight``,
``model.layers.N.self_attn.q_proj.weight``, ..., ``model.norm.weight``, ``lm_head.weight``), so a
state dict moves from actor to rollout without renaming.
"""

from collections.abc import Mapping

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from asyncrl.api.model_arch import LlamaArch

DTYPES: Mapping[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
LM_HEAD = "lm_head.weight"


def torch_dtype(name: str) -> torch.dtype:
    """``'bfloat16'``/``'float32'`` (``spec.model.rolloutDtype``) as a torch dtype."""
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"rollout dtype {name!r} is not supported; valid: {', '.join(DTYPES)}") from None


def llama_config(arch: LlamaArch) -> LlamaConfig:
    """The transformers config of ``arch`` (no dropout, no biases; transformers picks SDPA attention)."""
    return LlamaConfig(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.ffn_hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_sequence_length,
        rms_norm_eps=arch.norm_epsilon,
        tie_word_embeddings=arch.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": float(arch.rope_theta)},
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def build_model(
    arch: LlamaArch, dtype: torch.dtype = torch.float32, *, seed: int | None = None
) -> LlamaForCausalLM:
    """A freshly initialised model of ``arch`` in ``dtype``, in eval mode (``seed`` fixes the init)."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForCausalLM(llama_config(arch))
    else:
        model = LlamaForCausalLM(llama_config(arch))
    return model.to(dtype).eval()  # type: ignore[arg-type]  # transformers types .to() narrowly


def expected_keys(model: LlamaForCausalLM) -> set[str]:
    """HF names a full state dict for ``model`` must hold (``lm_head.weight`` is optional when tied)."""
    keys = set(model.state_dict())
    if model.config.tie_word_embeddings:
        keys.discard(LM_HEAD)
    return keys


def load_hf_state_dict(model: LlamaForCausalLM, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state_dict`` (HF names, any float dtype) into ``model``, casting to the model's dtype.

    With tied embeddings ``lm_head.weight`` is ignored when given (it is ``embed_tokens``). Raises a
    ``ValueError`` listing every missing/unexpected name and every shape mismatch at once.
    """
    want = expected_keys(model)
    got = set(state_dict) - ({LM_HEAD} if model.config.tie_word_embeddings else set())
    params = model.state_dict()
    problems = []
    if missing := sorted(want - got):
        problems.append(f"missing {missing}")
    if unexpected := sorted(got - want):
        problems.append(f"unexpected {unexpected}")
    for k in sorted(want & got):
        if tuple(state_dict[k].shape) != tuple(params[k].shape):
            problems.append(
                f"{k}: got shape {tuple(state_dict[k].shape)}, model has {tuple(params[k].shape)}"
            )
    if problems:
        raise ValueError(
            "load_hf_state_dict: the weights do not fit the rollout model (check that actor and rollout "
            "resolve the same spec.model): " + "; ".join(problems)
        )
    with torch.no_grad():
        for k in want:
            params[k].copy_(state_dict[k])
