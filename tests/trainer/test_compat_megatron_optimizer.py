"""megatron's own optimizer on the CPU shim (``compat.CudaOnCpu``), one process: ``FP32Optimizer``, the bf16
``Float16OptimizerWithFloat16Params`` and the ``DistributedOptimizer`` construct and step; fp32 steps equal
the CPU default (torch AdamW over ``main_grad``), clipping included; a non-finite gradient skips the update
(megatron itself would apply it: it checks for infs only under an fp16 grad scaler); the shim is active only
inside megatron's optimizer code. The DP=2 comparison is ``test_distributed_optimizer.py``."""

import math

import pytest
import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.model import build_gpt_model
from asyncrl.trainer.megatron.optimizers import MegatronAdam, make_optimizer

ARCH = LlamaArch(32, 1, 4, 2, 64, 40, 16, tie_embeddings=False)


@pytest.fixture(scope="module")
def runtime() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


def _loss(ddp: torch.nn.Module, step: int) -> torch.Tensor:
    tokens = torch.randint(0, ARCH.vocab_size, (3, 10), generator=torch.Generator().manual_seed(step))
    return -token_logprobs(ddp, tokens).float().sum()


def _train(settings: compat.OptimizerSettings, steps: int = 3, *, megatron: bool = False,
           ) -> tuple[list[torch.Tensor], list[float], str]:
    """``steps`` updates of a fresh model; ``megatron``: megatron's optimizer even where make_optimizer would
    pick the CPU default (fp32, not distributed: its ``FP32Optimizer``)."""
    torch.manual_seed(0)
    gpt = compat.cast_model(build_gpt_model(ARCH, init_std=0.1), settings)
    ddp = compat.wrap_ddp(gpt, distributed_optimizer=bool(settings.distributed_optimizer))
    opt = MegatronAdam(ddp, settings) if megatron else make_optimizer(ddp, settings)
    norms = []
    for step in range(steps):
        opt.zero_grad()
        _loss(ddp, step).backward()
        outcome = opt.step()
        assert outcome.stepped
        norms.append(outcome.grad_norm)
    return [p.detach().float().clone() for p in gpt.parameters()], norms, compat.optimizer_kind(opt)


BASE = compat.OptimizerSettings(lr=1e-2, weight_decay=0.1, max_grad_norm=0.5)


def test_resolved_defaults_follow_the_device(runtime: compat.MegatronRuntime) -> None:
    auto = compat.OptimizerSettings(lr=1e-3, bf16=None, distributed_optimizer=None).resolved(runtime)
    assert (auto.bf16, auto.distributed_optimizer) == (False, False)  # the CPU shim: fp32 torch AdamW
    assert not auto.megatron_optimizer
    asked = compat.OptimizerSettings(lr=1e-3, bf16=None, distributed_optimizer=True).resolved(runtime)
    assert (asked.bf16, asked.distributed_optimizer, asked.megatron_optimizer) == (False, True, True)


@pytest.mark.parametrize("distributed", [False, True], ids=["fp32-optimizer", "distributed-optimizer"])
def test_megatron_fp32_steps_equal_the_cpu_default(runtime: compat.MegatronRuntime, distributed: bool) -> None:
    ref, ref_norms, ref_kind = _train(BASE)
    got, norms, kind = _train(compat.OptimizerSettings(**{**BASE.__dict__, "distributed_optimizer": distributed}),
                              megatron=True)
    assert ref_kind == "MainGradAdamW/AdamW"
    assert kind == ("MegatronAdam/DistributedOptimizer" if distributed else "MegatronAdam/FP32Optimizer")
    assert all(n > 0.5 for n in ref_norms)  # the clip acts on every step
    assert norms == pytest.approx(ref_norms, abs=1e-5)
    assert max(float((a - b).abs().max()) for a, b in zip(ref, got, strict=True)) < 1e-5


@pytest.mark.parametrize("distributed", [False, True], ids=["float16-optimizer", "distributed-optimizer"])
def test_bf16_params_with_fp32_main_params(runtime: compat.MegatronRuntime, distributed: bool) -> None:
    ref, ref_norms, _ = _train(BASE)
    got, norms, kind = _train(compat.OptimizerSettings(**{**BASE.__dict__, "bf16": True,
                                                          "distributed_optimizer": distributed}))
    assert kind == ("MegatronAdam/DistributedOptimizer" if distributed
                    else "MegatronAdam/Float16OptimizerWithFloat16Params")
    # bf16 forward/backward: close to fp32, not equal (the weights are rounded to bf16 after every step)
    assert norms == pytest.approx(ref_norms, rel=5e-2)
    assert max(float((a - b).abs().max()) for a, b in zip(ref, got, strict=True)) < 5e-2


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
def test_a_nonfinite_gradient_skips_the_update(runtime: compat.MegatronRuntime, bf16: bool) -> None:
    settings = compat.OptimizerSettings(lr=1e-2, bf16=bf16, distributed_optimizer=True)
    torch.manual_seed(0)
    gpt = compat.cast_model(build_gpt_model(ARCH, init_std=0.1), settings)
    ddp = compat.wrap_ddp(gpt, distributed_optimizer=True)
    opt = make_optimizer(ddp, settings)
    opt.zero_grad()
    (_loss(ddp, 0) * float("inf")).backward()
    before = [p.detach().clone() for p in gpt.parameters()]
    outcome = opt.step()
    assert not outcome.stepped and not math.isfinite(outcome.grad_norm)
    assert all(torch.equal(b, p) for b, p in zip(before, gpt.parameters(), strict=True))
    opt.zero_grad()  # the next update is clean again
    _loss(ddp, 1).backward()
    assert opt.step().stepped


def test_the_shim_is_active_only_inside_megatron_code(runtime: compat.MegatronRuntime) -> None:
    t = torch.zeros(2)
    assert t.type() == "torch.FloatTensor"
    with compat.megatron_code():
        assert t.type() == "torch.cuda.FloatTensor" and t.cuda() is t
        assert torch.zeros(1, device="cuda").device.type == "cpu"
        assert t.type(torch.float64).dtype == torch.float64  # a cast is still a cast
    assert t.type() == "torch.FloatTensor"
