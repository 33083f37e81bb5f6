"""Tiny random Hugging Face model folders of every supported family, made offline.

``asyncrl models make-tiny FAMILY --out DIR`` (and the tests, through ``tests/support/hf_models.py``)
build one with transformers' own config class and ``save_pretrained``: ``config.json``,
``generation_config.json``, safetensors (one file, or shards + ``model.safetensors.index.json`` with
a small ``max_shard_size``) and a real byte-level BPE tokenizer with a ChatML chat template
(``tokenizers``, no download). The weights are random but not near-uniform (init std 0.1, norm
weights ``1 + 0.3 N(0, 1)``), so a mapping mistake shows in the logits.
"""

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncrl.api.model_arch import FAMILIES, Family

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MERGES = (("<", "/"), ("c", "a"), ("ca", "l"), ("cal", "c"), (">", "."), ("a", "n"), ("an", "s"))
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
END_OF_TURN, END_OF_TEXT = 2, 0  # ids of <|im_end|> and <|endoftext|>

_COMMON: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "initializer_range": 0.1, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
# Each family's tiny shape exercises what makes it differ from Llama.
TINY: Mapping[Family, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}},
    "mistral": {"sliding_window": 8, "head_dim": 16},  # a window shorter than the tests' sequences
    "qwen2": {},  # q/k/v biases (always on in Qwen2)
    "qwen3": {"head_dim": 32},  # explicit head dim != hidden / heads (16), QK-norm
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "norm_topk_prob": True},
}


def tiny_config(family: Family, vocab_size: int, **overrides: Any) -> Any:
    """The transformers config of ``family``'s tiny shape (``overrides`` replace fields)."""
    from transformers import AutoConfig

    if family not in FAMILIES:
        raise KeyError(f"family {family!r} is unknown; valid families: {', '.join(FAMILIES)}")
    fields = _COMMON | TINY[family] | {"vocab_size": vocab_size, "eos_token_id": END_OF_TURN,
                                       "bos_token_id": None, "pad_token_id": END_OF_TURN} | overrides
    return AutoConfig.for_model(FAMILIES[family].model_type, **fields)


def bpe_tokenizer(n_filler: int = 0) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` (3 specials + 256 bytes + 7 merges [+ fillers])
    with a ChatML chat template; eos = pad = ``<|im_end|>``."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pieces = list(SPECIALS) + sorted(pre_tokenizers.ByteLevel.alphabet()) + [a + b for a, b in MERGES]
    pieces += [f"filler{i}" for i in range(n_filler)]
    raw = RawTokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, list(MERGES)))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(list(SPECIALS))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|im_end|>"
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def random_model(config: Any, seed: int = 0) -> Any:
    """``AutoModelForCausalLM.from_config(config)`` in fp32 with seeded weights, norms randomised."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.copy_(1 + 0.3 * torch.randn_like(p))
                elif name.endswith(".bias") or name.endswith("gate.weight"):
                    p.copy_(0.3 * torch.randn_like(p))  # biases and router start at 0: make them matter
    return model.eval()


def make_tiny(family: Family, out: str | Path, *, seed: int = 0, max_shard_size: str | int | None = None,
              dtype: str = "float32", tokenizer: bool = True, **overrides: Any) -> Path:
    """Write a tiny random ``family`` model folder into ``out`` and return it.

    Args:
        max_shard_size: e.g. ``"40KB"`` for several shards and an index (None: one file).
        dtype: weights on disk, ``float32`` or ``bfloat16`` (as save_pretrained writes them).
        tokenizer: False leaves the tokenizer files out (a bad folder for the tests).
        overrides: config fields replacing the tiny shape's.
    """
    import torch
    from transformers import GenerationConfig

    out = Path(out)
    tok = bpe_tokenizer()
    config = tiny_config(family, len(tok), **overrides)
    model = random_model(config, seed)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    kwargs: dict[str, Any] = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(str(out), **kwargs)
    GenerationConfig(eos_token_id=[END_OF_TURN, END_OF_TEXT], pad_token_id=END_OF_TURN,
                     bos_token_id=None).save_pretrained(str(out))
    if tokenizer:
        tok.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    cfg.pop("_name_or_path", None)  # would be a path of this machine
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out
