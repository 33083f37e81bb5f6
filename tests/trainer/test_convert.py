"""Megatron <-> HF Llama weight conversion: logits parity with transformers, exact round trips."""

import dataclasses

import pytest
import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import (
    hf_to_megatron,
    llama_config,
    load_hf,
    megatron_to_hf,
)
from asyncrl.trainer.megatron.model import build_gpt_model
from tests.support.megatron_parts import full_logits, save_hf

# GQA (4 query heads over 2 kv heads), a non-default epsilon and RoPE base so a dropped setting shows.
ARCH = LlamaArch(64, 2, 4, 2, 96, 40, 32, tie_embeddings=False, rope_theta=50000.0, norm_epsilon=1e-6)


@pytest.fixture(scope="module", autouse=True)
def megatron() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


def _hf_model(arch: LlamaArch, seed: int):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = llama_config(arch)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random norm weights, so a swapped or dropped norm shows in the logits
        for name, p in model.named_parameters():
            p.copy_(
                1.0 + 0.3 * torch.randn_like(p) if name.endswith("norm.weight") else 0.1 * torch.randn_like(p)
            )
    return model


def _tokens(arch: LlamaArch, batch: int = 3, seq: int = 24) -> torch.Tensor:
    return torch.randint(0, arch.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_hf_to_megatron_reproduces_hf_logits(tied: bool) -> None:
    arch = dataclasses.replace(ARCH, tie_embeddings=tied)
    hf = _hf_model(arch, seed=2)
    gpt = build_gpt_model(arch).eval()
    gpt.load_state_dict(hf_to_megatron(hf.state_dict(), arch), strict=True)
    tokens = _tokens(arch)
    with torch.no_grad():
        expected = hf(tokens).logits
        got = full_logits(gpt, tokens)
    assert got.shape == expected.shape == (3, 24, arch.vocab_size)
    # Measured 0.0 against eager attention (docs/architecture.md, megatron-core on the CPU); 1e-5 leaves room for kernels.
    torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_megatron_to_hf_reproduces_megatron_logits_and_round_trips_exactly(tied: bool) -> None:
    from transformers import LlamaForCausalLM

    arch = dataclasses.replace(ARCH, tie_embeddings=tied)
    torch.manual_seed(3)
    gpt = build_gpt_model(arch, init_std=0.1).eval()
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if "layernorm" in name:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
    config = llama_config(arch)
    config._attn_implementation = "eager"
    hf = LlamaForCausalLM(config).eval()
    hf.load_state_dict(megatron_to_hf(gpt.state_dict(), arch), strict=True)
    tokens = _tokens(arch)
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, full_logits(gpt, tokens), rtol=0.0, atol=1e-5)

    original = {k: v for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
    back = hf_to_megatron(megatron_to_hf(original, arch), arch)
    assert back.keys() == original.keys()
    for key, value in original.items():
        assert torch.equal(back[key], value), key


def test_qkv_layout_is_grouped_per_query_group() -> None:
    # 4 query heads, 2 groups, head dim 16: rows 0-31 = q heads 0,1; 32-47 = k0; 48-63 = v0;
    # 64-95 = q heads 2,3; 96-111 = k1; 112-127 = v1 (docs/architecture.md, megatron-core on the CPU).
    arch = ARCH
    hf = {k: torch.zeros(s) for k, s in _hf_shapes(arch).items()}
    hf["model.layers.0.self_attn.q_proj.weight"] = (
        torch.arange(4).repeat_interleave(16)[:, None].float().expand(-1, 64)
    )
    hf["model.layers.0.self_attn.k_proj.weight"] = (
        (10 + torch.arange(2)).repeat_interleave(16)[:, None].float().expand(-1, 64)
    )
    hf["model.layers.0.self_attn.v_proj.weight"] = (
        (20 + torch.arange(2)).repeat_interleave(16)[:, None].float().expand(-1, 64)
    )
    qkv = hf_to_megatron(hf, arch)["decoder.layers.0.self_attention.linear_qkv.weight"][:, 0]
    head_of_row_block = qkv[::16].tolist()
    assert head_of_row_block == [0, 1, 10, 20, 2, 3, 11, 21]


def test_safetensors_folder_loads_in_transformers(tmp_path) -> None:
    from transformers import LlamaForCausalLM

    arch = dataclasses.replace(ARCH, tie_embeddings=True)
    torch.manual_seed(4)
    gpt = build_gpt_model(arch, init_std=0.1).eval()
    save_hf(megatron_to_hf(gpt.state_dict(), arch), arch, str(tmp_path))
    loaded = load_hf(str(tmp_path))
    assert "lm_head.weight" not in loaded  # tied: left out like save_pretrained does
    back = hf_to_megatron(loaded, arch)
    for key, value in gpt.state_dict().items():
        if not key.endswith("_extra_state"):
            assert torch.equal(back[key], value), key
    hf = LlamaForCausalLM.from_pretrained(str(tmp_path), attn_implementation="eager").eval()
    tokens = _tokens(arch)
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, full_logits(gpt, tokens), rtol=0.0, atol=1e-5)


def test_shape_mismatch_names_every_bad_tensor() -> None:
    hf = {k: torch.zeros(s) for k, s in _hf_shapes(ARCH).items()}
    hf["model.norm.weight"] = torch.zeros(7)
    del hf["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError) as err:
        hf_to_megatron(hf, ARCH)
    assert "missing model.layers.1.mlp.up_proj.weight [96, 64]" in str(err.value)
    assert "model.norm.weight: got [7], expected [64]" in str(err.value)


def _hf_shapes(arch: LlamaArch) -> dict[str, tuple[int, ...]]:
    from asyncrl.trainer.megatron.convert import hf_shapes

    return hf_shapes(arch)
