"""The transformers rollout engine on a CUDA device (a rollout pod's GPU, handed over by Ray).

Run on a GPU host: ``pytest -m gpu tests/rollout/test_hf_engine_gpu.py``.
"""

import random
from collections.abc import Callable

import pytest
import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model, load_hf_state_dict

pytestmark = pytest.mark.gpu

Weights = Callable[[int], dict[str, torch.Tensor]]


@pytest.fixture(autouse=True)
def _cuda() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def test_engine_samples_on_cuda_and_logp_mu_matches_a_cpu_forward(arch: LlamaArch, weights: Weights,
                                                                   script_env: type) -> None:
    eng = HFEngine(arch, dtype="float32", seed=0)
    assert eng.device.type == "cuda"  # chosen by itself: the process sees a GPU
    eng.load_weights(weights(0), version=0)
    assert all(p.device.type == "cuda" for p in eng.model.parameters())
    rng = random.Random(0)
    eps = [Episode.start(f"t{i}", "g", script_env(every=4, turns=2), rng) for i in range(8)]
    eng.generate(eps, max_new_tokens=24, temperature=0.7)
    cpu = build_model(arch)
    load_hf_state_dict(cpu, weights(0))
    worst = 0.0
    for t in (e.to_trajectory() for e in eps):
        ids = torch.tensor([t.tokens])
        with torch.no_grad():
            logits = cpu(input_ids=ids).logits[0, :-1].float()  # [T-1, V]: position t-1 predicts token t
        ref = torch.log_softmax(logits / 0.7, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1)
        sampled = torch.tensor(t.loss_mask[1:])
        worst = max(worst, (torch.tensor(t.logp_mu[1:])[sampled] - ref[sampled]).abs().max().item())
    assert worst < 1e-4  # fp32 on two devices: kernel differences only

    held = torch.cuda.memory_allocated()
    eng.release()  # the model leaves the GPU; the weights stay on the host
    assert eng.released and torch.cuda.memory_allocated() < held
    eng.acquire()
    assert next(eng.model.parameters()).device.type == "cuda"
