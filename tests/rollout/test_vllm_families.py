"""The vLLM engine per family (``make test-vllm``): vLLM builds the folder's own family from the
config.json the engine writes, takes the actor's HF-named weights, and its logp_mu equals the megatron
actor's log-probs on the tokens it sampled (fp32 on both sides).

The tiny shapes here have head_dim 64 (vLLM's CPU attention kernel has no 16 or 32). Qwen3-MoE was 3.7
nats off on vLLM's CPU build until the engine process packed its experts again after each in-place reload
(rollout/vllm_server.py, repack_cpu_experts); its test reloads twice, the second time other weights, so a
reload that keeps the first weights fails it too.
"""

import random
from pathlib import Path

import pytest
import torch

from asyncrl.api.model_arch import Family
from asyncrl.rollout.engine_registry import make_engine
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.tokenizer import HFTokenizer
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import megatron_to_hf
from asyncrl.trainer.megatron.logprobs import token_logprobs
from tests.support.hf_models import ALL_FAMILIES, CountingEnv, folder_arch, megatron_model, tiny_folder

pytestmark = pytest.mark.vllm

LOGP_ATOL = 2e-5  # as test_vllm_engine.py: vLLM's CPU kernels sum in another order than torch's
VLLM_SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
              "head_dim": 64}
EXPLICIT = {"qwen3": {"num_attention_heads": 4, "num_key_value_heads": 2}}  # head_dim 64 != 128 / 4


@pytest.fixture(scope="module", autouse=True)
def megatron() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_vllm_logp_mu_equals_actor_logprobs(family: Family, tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path, family, **(VLLM_SHAPE | EXPLICIT.get(family, {})))
    arch = folder_arch(folder)
    assert arch.head_dim == 64
    gpt = megatron_model(folder)
    eng = make_engine("vllm", arch, dtype="float32", seed=0)
    try:
        if arch.is_moe:  # a first reload of other weights: the second must replace them, experts included
            other = megatron_model(tiny_folder(tmp_path / "other", family, seed=1, **VLLM_SHAPE))
            eng.load_weights(megatron_to_hf(other.state_dict(), arch), version=0)
        eng.load_weights(megatron_to_hf(gpt.state_dict(), arch), version=int(arch.is_moe))
        tok = HFTokenizer.from_folder(folder)
        eps = [Episode.start(f"t{i}", "g", CountingEnv(tok), random.Random(i)) for i in range(6)]
        eng.generate(eps, max_new_tokens=20, temperature=0.7, seed=1)
    finally:
        eng.close()
    diffs: list[float] = []
    for e in eps:
        with torch.no_grad():
            actor = token_logprobs(gpt, torch.tensor([e.tokens]), temperature=0.7)[0].tolist()
        diffs += [abs(a - b) for a, b, m in zip(e.logp_mu, actor, e.loss_mask, strict=True) if m]
    print(f"{family}: vLLM logp_mu vs actor over {len(diffs)} tokens: max |diff| {max(diffs):.2e}")
    assert len(diffs) > 30 and max(diffs) < LOGP_ATOL
