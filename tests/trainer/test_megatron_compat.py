"""The CPU/GPU compatibility layer: idempotent init, and the optimizer over megatron's main_grad."""

import math

import pytest
import torch
import torch.distributed as dist

from asyncrl.api.model_arch import LlamaArch
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model
from asyncrl.trainer.megatron.optimizers import make_optimizer

ARCH = LlamaArch(32, 1, 4, 2, 64, 40, 16, tie_embeddings=False)


@pytest.fixture(scope="module")
def runtime() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


def test_init_is_idempotent(runtime: compat.MegatronRuntime) -> None:
    from megatron.core import parallel_state

    again = compat.init_megatron(seed=1)
    assert again is runtime and compat.init_megatron(seed=1, device="cpu") is runtime
    with pytest.raises(RuntimeError, match="cannot switch to 'cuda'"):
        compat.init_megatron(seed=1, device="cuda")
    assert dist.is_initialized() and dist.get_world_size() == 1
    assert parallel_state.get_tensor_model_parallel_world_size() == 1
    assert parallel_state.get_pipeline_model_parallel_world_size() == 1
    if not torch.cuda.is_available():
        assert runtime.on_cpu and runtime.backend == "gloo" and runtime.device == torch.device("cpu")


def _loss(ddp: torch.nn.Module) -> torch.Tensor:
    tokens = torch.randint(0, ARCH.vocab_size, (3, 10), generator=torch.Generator().manual_seed(0))
    return -token_logprobs(ddp, tokens).sum()


@pytest.mark.parametrize("max_grad_norm", [1e-3, None])
def test_optimizer_steps_on_main_grad_and_clips(runtime, max_grad_norm) -> None:
    torch.manual_seed(0)
    ddp = compat.wrap_ddp(build_gpt_model(ARCH, init_std=0.1))
    opt = make_optimizer(ddp, compat.OptimizerSettings(lr=1e-2, max_grad_norm=max_grad_norm))
    before = [p.detach().clone() for p in ddp.parameters()]
    opt.zero_grad()
    _loss(ddp).backward()
    outcome = opt.step()
    assert outcome.stepped and math.isfinite(outcome.grad_norm) and outcome.grad_norm > 1e-3
    params = list(ddp.parameters())
    # The gradients live in DDP's main_grad buffers and the optimizer used them in place.
    assert all(p.grad is p.main_grad for p in params)
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
    if max_grad_norm is None:
        assert float(clipped) == pytest.approx(outcome.grad_norm, rel=1e-6)
    else:
        assert float(clipped) == pytest.approx(max_grad_norm, rel=1e-4)
    assert all(not torch.equal(b, p) for b, p in zip(before, params, strict=True))

    # A second step starts from zeroed buffers: the gradient is not accumulated twice.
    opt.zero_grad()
    assert all(p.grad is None and float(p.main_grad.abs().sum()) == 0.0 for p in params)


def test_nonfinite_gradient_skips_the_update(runtime) -> None:
    torch.manual_seed(0)
    ddp = compat.wrap_ddp(build_gpt_model(ARCH, init_std=0.1))
    opt = make_optimizer(ddp, compat.OptimizerSettings(lr=1e-2))
    opt.zero_grad()
    (_loss(ddp) * float("inf")).backward()
    before = [p.detach().clone() for p in ddp.parameters()]
    outcome = opt.step()
    assert not outcome.stepped and not math.isfinite(outcome.grad_norm)
    assert all(torch.equal(b, p) for b, p in zip(before, ddp.parameters(), strict=True))
