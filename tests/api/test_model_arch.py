"""The family table: presets and every family go to config.json and back unchanged, and transformers'
own config classes read what ``to_hf_config`` writes as the same architecture."""

import subprocess
import sys
from dataclasses import replace
from typing import get_args

import pytest

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import (
    FAMILIES,
    PRESETS,
    ArchitectureError,
    Family,
    ModelArch,
    arch_from_hf_config,
    hf_param_shapes,
    resolve_arch,
)

QWEN3_MOE_30B = ModelArch(2048, 48, 32, 4, 6144, 151936, 40960, False, rope_theta=1e6, norm_epsilon=1e-6,
                          family="qwen3_moe", kv_channels=128, num_experts=128, moe_top_k=8,
                          moe_ffn_hidden_size=768, norm_topk_prob=True)  # the paper's 30B-A3B shape
EXAMPLES = [
    *(replace(p, vocab_size=p.vocab_size or 28) for p in PRESETS.values()),
    ModelArch(64, 2, 4, 2, 128, 300, 256, False, family="mistral", sliding_window=4096),
    ModelArch(64, 2, 4, 2, 128, 300, 256, True, family="qwen2", rope_theta=1e6),
    ModelArch(64, 2, 4, 2, 128, 300, 256, False, family="qwen3", kv_channels=32),
    QWEN3_MOE_30B,
]


def test_the_literal_and_the_table_list_the_same_families() -> None:
    assert set(get_args(Family)) == set(FAMILIES)


@pytest.mark.parametrize("arch", EXAMPLES, ids=lambda a: a.family + "-" + str(a.hidden_size))
def test_to_hf_config_round_trips_and_transformers_reads_the_same_shapes(arch: ModelArch) -> None:
    cfg = arch.to_hf_config()
    assert arch_from_hf_config(cfg) == arch
    from transformers import AutoConfig

    hf = AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    assert arch_from_hf_config(hf.to_dict() | {"architectures": cfg["architectures"]}) == arch


def test_the_paper_moe_shape_has_its_expert_tensors() -> None:
    shapes = hf_param_shapes(QWEN3_MOE_30B)
    assert shapes["model.layers.47.mlp.experts.127.gate_proj.weight"] == (768, 2048)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (32 * 128, 2048)  # head_dim 128 != 2048 / 32
    assert shapes["model.layers.0.mlp.gate.weight"] == (128, 2048)
    n = sum(a * (b if len(s) > 1 else 1) for s in shapes.values() for a, b in [(s[0], s[-1])])
    assert 30.0e9 < n < 31.0e9  # 30.5B parameters in all


def test_presets_resolve_as_before() -> None:
    arch = resolve_arch(ModelSpec(), 28)
    assert arch == replace(PRESETS["tiny-llama"], vocab_size=28) and arch.family == "llama"
    assert resolve_arch(ModelSpec(preset="small-llama", hidden_size=128), 28).hidden_size == 128


def test_an_unsupported_architecture_names_itself_and_the_supported_list() -> None:
    with pytest.raises(ArchitectureError) as err:
        arch_from_hf_config({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 8})
    assert str(err.value) == (
        "config.json: architectures ['Gemma2ForCausalLM']: Gemma2ForCausalLM is not supported; supported "
        "architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "Qwen3MoeForCausalLM (one entry)"
    )


def test_model_arch_imports_nothing_heavy() -> None:
    code = ("import sys, asyncrl.api.model_arch; "
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'safetensors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
