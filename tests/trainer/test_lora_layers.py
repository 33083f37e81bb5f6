"""LoRA on megatron-core's linear layers (trainer/megatron/lora.py): the base's logits at initialisation, the
gradient reaches the adapters only, an adapter equals its merged weight, and a batch of rows scored in one
forward under several versions (the adapter bank) equals one forward per version."""

from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from asyncrl.api.lora import LoraSpec
from asyncrl.api.model_arch import Family
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.lora import A_SUFFIX, B_SUFFIX, adapter_bank, apply_lora, merged
from tests.support.hf_models import ALL_FAMILIES, folder_arch, megatron_model, tiny_folder, tokens
from tests.support.megatron_parts import full_logits

torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def megatron() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("lora")


def _random_adapters(gpt: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """A non-zero adapter for every adapted layer (B drawn too: B = 0 would make every version the base)."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(p.shape, generator=g) * 0.05 for n, p in gpt.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_logits_equal_the_base_at_init_and_only_adapters_train(root: Path, family: Family) -> None:
    folder = tiny_folder(root, family)
    arch = folder_arch(folder)
    gpt = megatron_model(folder)
    ids = tokens(arch.vocab_size)
    with torch.no_grad():
        base = full_logits(gpt, ids)
    layers = apply_lora(gpt, arch, LoraSpec(rank=4), seed=0)
    trainable = {n for n, p in gpt.named_parameters() if p.requires_grad}
    assert trainable == set(layers.param_names())
    # every projection of every layer (MoE: 4 experts' fc1 and fc2): 2 attention + 2 MLP (or 2 x E) per layer
    per_layer = 2 + (2 * arch.num_experts if arch.is_moe else 2)
    assert len(layers.names) == arch.num_layers * per_layer
    with torch.no_grad():
        got = full_logits(gpt, ids)
    assert torch.equal(got, base)  # B = 0: s B A x adds exact zeros
    full_logits(gpt, ids).logsumexp(-1).sum().backward()
    grads = {n for n, p in gpt.named_parameters() if p.grad is not None}
    assert grads == {n for n in trainable if n.endswith(A_SUFFIX)} | {n for n in trainable if n.endswith(B_SUFFIX)}
    # at B = 0 only B gets a gradient signal (dL/dA = s B^T ... = 0), and it is not zero
    b_norm = sum(float(p.grad.norm()) for n, p in gpt.named_parameters() if n.endswith(B_SUFFIX))
    a_norm = sum(float(p.grad.norm()) for n, p in gpt.named_parameters() if n.endswith(A_SUFFIX))
    assert b_norm > 0 and a_norm == 0.0


def test_an_adapter_equals_its_merged_weight(root: Path) -> None:
    folder = tiny_folder(root, "qwen2")
    arch = folder_arch(folder)
    plain, gpt = megatron_model(folder), megatron_model(folder)
    spec = LoraSpec(rank=4, alpha=8.0)
    layers = apply_lora(gpt, arch, spec, seed=0)
    adapters = _random_adapters(gpt, seed=1)
    ids = tokens(arch.vocab_size)
    with torch.no_grad():
        for n, p in gpt.named_parameters():
            if p.requires_grad:
                p.copy_(adapters[n])
        owners = dict(plain.named_modules())
        for name in layers.names:  # W + (8/4) B A, by hand
            w = owners[name].weight
            w.copy_(merged(w, adapters[name + A_SUFFIX], adapters[name + B_SUFFIX], 2.0))
        torch.testing.assert_close(full_logits(gpt, ids), full_logits(plain, ids), rtol=0.0, atol=2e-5)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_one_forward_over_a_bank_equals_one_forward_per_version(root: Path, family: Family) -> None:
    folder = tiny_folder(root, family)
    arch = folder_arch(folder)
    gpt = megatron_model(folder)
    layers = apply_lora(gpt, arch, LoraSpec(rank=4), seed=0)
    versions = [_random_adapters(gpt, seed=s) for s in (1, 2, 3)]
    ids = tokens(arch.vocab_size, batch=5)
    slot = torch.tensor([2, 0, 1, 2, 0])
    with torch.no_grad():
        each = torch.stack([functional_call(gpt, versions[int(k)], (ids[n:n + 1], *_rest(gpt, 1, ids.shape[1])))[0]
                            for n, k in enumerate(slot)])
        with adapter_bank(gpt, layers, versions, slot):
            one = full_logits(gpt, ids)
        after = full_logits(gpt, ids)  # the bank is gone: the live adapters (B = 0) again
    torch.testing.assert_close(one, each, rtol=0.0, atol=1e-5)
    assert (one - after).abs().max() > 1e-3  # the versions differ from the live adapters: the bank mattered


def _rest(gpt: torch.nn.Module, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    from asyncrl.trainer.megatron.model import attention_mask, position_ids

    return position_ids(b, t, torch.device("cpu")), attention_mask(gpt, t, torch.device("cpu"))


def test_the_bank_refuses_moe_and_bad_slots(root: Path) -> None:
    folder = tiny_folder(root, "qwen3_moe")
    gpt = megatron_model(folder)
    layers = apply_lora(gpt, folder_arch(folder), LoraSpec(rank=2), seed=0)
    with pytest.raises(ValueError, match="MoE expert"), adapter_bank(gpt, layers, [{}], torch.tensor([0])):
        pass
    dense = tiny_folder(root, "llama")
    gpt = megatron_model(dense)
    layers = apply_lora(gpt, folder_arch(dense), LoraSpec(rank=2), seed=0)
    with pytest.raises(ValueError, match="slot must be"), adapter_bank(gpt, layers, [{}], torch.tensor([1])):
        pass
