"""Every family end to end on a tiny random folder saved by transformers: the actor's megatron model
loaded from the folder gives transformers' logits, the MoE router picks the same experts, the rollout
engine's logp_mu equals the actor's log-probs, and weights round-trip exactly."""

import random
from pathlib import Path

import pytest
import torch

from asyncrl.api.model_arch import Family
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import hf_state_dict
from asyncrl.rollout.tokenizer import HFTokenizer
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import hf_to_megatron, megatron_to_hf
from asyncrl.trainer.megatron.hf_folder import HFFolder, folder_problems, load_hf
from asyncrl.trainer.megatron.logprobs import token_logprobs
from tests.support.hf_models import (
    ALL_FAMILIES,
    SHARDED,
    CountingEnv,
    folder_arch,
    megatron_model,
    tiny_folder,
    tokens,
    transformers_model,
)
from tests.support.megatron_parts import full_logits

torch.set_num_threads(1)


@pytest.fixture(scope="module", autouse=True)
def megatron() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_actor_logits_equal_transformers_after_conversion(root: Path, family: Family) -> None:
    folder = tiny_folder(root, family)
    assert (folder / "model.safetensors.index.json").is_file() == (family in SHARDED)
    hf, gpt = transformers_model(folder), megatron_model(folder)
    ids = tokens(folder_arch(folder).vocab_size)
    with torch.no_grad():
        expected, got = hf(ids).logits, full_logits(gpt, ids)
    diff = (got - expected).abs().max().item()
    print(f"{family}: max|logits diff| {diff:.2e} (|logits| <= {expected.abs().max().item():.1f})")
    assert got.shape == expected.shape == (3, 24, 266)
    torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-5)


def test_sliding_window_changes_the_logits(root: Path) -> None:
    # Negative control: the mistral window (8 < 24 tokens) must matter, or the test above proves nothing.
    folder = tiny_folder(root, "mistral")
    gpt, ids = megatron_model(folder), tokens(266)
    with torch.no_grad():
        windowed = full_logits(gpt, ids)
        gpt.sliding_window = None
        full = full_logits(gpt, ids)
    assert (windowed[:, :8] - full[:, :8]).abs().max() < 1e-6  # inside the window: the same
    assert (windowed[:, 8:] - full[:, 8:]).abs().max() > 1e-2


def test_moe_router_picks_the_same_experts_on_both_sides(root: Path) -> None:
    folder = tiny_folder(root, "qwen3_moe")
    hf, gpt = transformers_model(folder), megatron_model(folder)
    ids = tokens(266)
    B, T = ids.shape
    hf_picks: list[torch.Tensor] = []
    mc_picks: list[torch.Tensor] = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda _m, _i, out: hf_picks.append(out[2]))
        for layer in hf.model.layers
    ] + [
        layer.mlp.router.register_forward_hook(lambda _m, _i, out: mc_picks.append(out[1]))
        for layer in gpt.decoder.layers
    ]
    with torch.no_grad():
        hf(ids)
        full_logits(gpt, ids)
    for h in hooks:
        h.remove()
    assert len(hf_picks) == len(mc_picks) == 2
    for hf_idx, routing_map in zip(hf_picks, mc_picks, strict=True):
        # HF routes [B*T] tokens batch-first; megatron [T*B] sequence-first (routing_map [T*B, E] bool)
        hf_map = torch.zeros(B * T, 4, dtype=torch.bool).scatter_(1, hf_idx, True)
        mc_map = routing_map.view(T, B, 4).transpose(0, 1).reshape(B * T, 4)
        assert int(hf_map.sum()) == B * T * 2
        assert torch.equal(hf_map, mc_map)


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_engine_logp_mu_equals_actor_logprobs(root: Path, family: Family) -> None:
    folder = tiny_folder(root, family)
    arch = folder_arch(folder)
    gpt = megatron_model(folder)
    weights = megatron_to_hf(gpt.state_dict(), arch)  # what weight sync sends to rollout
    eng = HFEngine(arch, dtype="float32", seed=0)
    eng.load_weights(weights, version=0)
    tok = HFTokenizer.from_folder(folder)
    rng = random.Random(0)
    eps = [Episode.start(f"t{i}", "g", CountingEnv(tok), rng) for i in range(6)]
    eng.generate(eps, max_new_tokens=20, temperature=0.7)
    worst, n = 0.0, 0
    for t in (e.to_trajectory() for e in eps):
        ids = torch.tensor([t.tokens])
        with torch.no_grad():
            actor = token_logprobs(gpt, ids, temperature=0.7)[0]  # [T], position 0 = 0
        sampled = torch.tensor(t.loss_mask)
        sampled[0] = False
        mu = torch.tensor(t.logp_mu)
        worst = max(worst, (mu[sampled] - actor[sampled]).abs().max().item())
        n += int(sampled.sum())
    print(f"{family}: {n} sampled tokens, max|logp_mu - actor logp| {worst:.2e}")
    assert n > 30 and worst < 2e-5  # fp32 KV-cache path vs a full megatron forward: kernel noise only


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_weights_round_trip_exactly_between_folder_actor_and_engine(root: Path, family: Family) -> None:
    folder = tiny_folder(root, family)
    arch = folder_arch(folder)
    assert folder_problems(str(folder)) == []  # hf_param_shapes (vLLM's and the checks' table) == save_pretrained's
    on_disk = load_hf(str(folder))
    back = megatron_to_hf(hf_to_megatron(HFFolder(folder), arch), arch)
    if arch.tie_embeddings:
        back.pop("lm_head.weight")
    assert set(back) == set(on_disk)
    assert all(torch.equal(back[k], on_disk[k]) for k in on_disk)
    eng = HFEngine(arch, dtype="float32")
    eng.load_weights(on_disk, version=0)
    live = hf_state_dict(eng.model)
    assert set(live) == set(on_disk) and all(torch.equal(live[k], on_disk[k]) for k in on_disk)


def test_bf16_folder_stays_bf16_on_disk_and_loads_into_the_fp32_actor(root: Path) -> None:
    folder = tiny_folder(root / "bf16", "qwen2", dtype="bfloat16")
    assert set(HFFolder(folder).dtypes().values()) == {"BF16"}
    gpt = megatron_model(folder)
    hf = transformers_model(folder)  # bf16 weights, fp32 compute: the same values on both sides
    ids = tokens(266)
    with torch.no_grad():
        torch.testing.assert_close(full_logits(gpt, ids), hf(ids).logits, rtol=0.0, atol=1e-5)
