"""The actor on a CUDA device: megatron as designed (NCCL, CUDA RNG tracker, megatron's optimizer).

Run on a GPU host in its own process: ``pytest -m gpu tests/trainer/test_megatron_gpu.py``
(megatron's setup is per process, and the CPU suite pins it to the CPU shim).
"""

import dataclasses

import pytest
import torch

pytestmark = pytest.mark.gpu

VOCAB = 40


@pytest.fixture(scope="module")
def cuda_runtime():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from asyncrl.trainer.megatron import compat

    try:
        runtime = compat.init_megatron(seed=0, device="cuda")
    except RuntimeError as err:  # this process already set megatron up on the CPU
        pytest.skip(f"run the gpu tests in their own process: {err}")
    assert not runtime.on_cpu and runtime.backend == "nccl"
    return runtime


def compat_kind(actor) -> str:
    from asyncrl.trainer.megatron import compat

    return compat.optimizer_kind(actor._optimizer)


def test_actor_trains_and_exports_weights_on_cuda(cuda_runtime) -> None:
    from transformers import LlamaForCausalLM

    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.batch import TrainBatch
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.megatron.convert import llama_config

    # fp32 params (the export is compared to transformers at 1e-4) with megatron's distributed optimizer (the
    # GPU default); bench/gpu_check.sh's actor stage runs the default bf16 precision.
    spec = AsyncRLJobSpec.model_validate(
        {"correction": {"reference": "ewma"}, "model": {"hiddenSize": 64, "numLayers": 2},
         "actor": {"megatron": {"precision": "fp32"}}}
    )
    actor = MegatronActor(dataclasses.replace(ActorSettings.from_spec(spec, VOCAB), device="cuda"))
    B, T = 8, 16
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, 4:] = True
    assert actor.sft_step(tokens, loss_mask).applied
    logp_mu = actor.logprobs(tokens).cpu() * loss_mask
    versions = torch.where(loss_mask, actor.version, -1)
    advantages = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    turn_ids = torch.where(loss_mask, 0, -1)
    m = actor.train_step(TrainBatch(tokens, loss_mask, logp_mu, versions, advantages, turn_ids))
    assert m.applied and m.version == 2 and m.reference == "ewma"
    assert compat_kind(actor) == "MegatronAdam/DistributedOptimizer"

    hf = LlamaForCausalLM(llama_config(actor.settings.arch)).eval()
    hf.load_state_dict(actor.hf_state_dict(), strict=True)
    with torch.no_grad():
        ref = torch.log_softmax(hf(tokens).logits, -1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    torch.testing.assert_close(actor.logprobs(tokens)[:, 1:].cpu(), ref, rtol=0.0, atol=1e-4)
