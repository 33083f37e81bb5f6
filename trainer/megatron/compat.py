"""The one place that knows whether megatron-core runs on a GPU or on the CPU.

megatron-core 0.16.1 is GPU code: it hard-codes ``torch.cuda.current_device()`` in the RoPE
buffers, the attention scratch buffer and the DDP grad buffers, seeds a CUDA RNG tracker, and its
optimizers assert ``torch.cuda.FloatTensor``. On a CUDA machine this module leaves all of that as
designed (NCCL, the CUDA RNG tracker, megatron's own optimizer). Without CUDA it applies the
smallest shim that was measured to work (``docs/architecture.md`` (megatron-core on the CPU)):

1. ``torch.cuda.current_device`` answers ``"cpu"``, so every ``device=current_device()`` lands on
   the CPU;
2. the RNG tracker is megatron's *inference* tracker (public API): its ``fork()`` is a null
   context, so dropout (0 here anyway) uses the ordinary CPU generator;
3. a gloo process group (the actor's ranks, or a private one of size 1), then ``initialize_model_parallel(tp, pp)``;
4. by default a ``torch.optim.AdamW`` over the DDP wrapper's ``main_grad`` buffers (``optimizers.MainGradAdamW``);
   megatron's own optimizer when the job asks for it (``OptimizerSettings(distributed_optimizer=True)`` or
   ``bf16=True``): its code runs under :class:`CudaOnCpu` (6). :meth:`MegatronRuntime.runs_megatron_optimizer`
   decides; :func:`asyncrl.trainer.megatron.optimizers.make_optimizer` builds the one it names;
5. (CPU or GPU without TransformerEngine) the MoE router's missing ``te_general_gemm`` global;
6. while megatron's optimizer code runs (construction, ``step``, state dicts), :class:`CudaOnCpu`, a
   ``TorchFunctionMode`` that rewrites three things and nothing else (measured with megatron-core 0.16.1,
   torch 2.13 on gloo: ``FP32Optimizer``, ``Float16OptimizerWithFloat16Params`` and ``DistributedOptimizer``
   at DP=1 and DP=2 construct and step, clipping active, weights equal to one process):

   - ``device='cuda'`` in a factory call means the CPU: ``optimizer/optimizer.py:473,481,485,907``
     (``found_inf``, ``_dummy_overflow_buf``, ``_scale_one``, ``_scale``), ``optimizer/clip_grads.py:90,103,
     115,174,207`` (the norm's all-reduce buffer, the overflow buffer), ``optimizer/grad_scaler.py:15,88-94``;
   - ``Tensor.type()`` without arguments answers the CUDA name (``torch.cuda.FloatTensor`` for a CPU
     ``torch.FloatTensor``): the dtype dispatch of ``optimizer/optimizer.py:671,690``,
     ``optimizer/distrib_optimizer.py:361,420,582`` (a ``TypeError`` on CPU tensors otherwise) and the
     assert of ``optimizer/clip_grads.py:167``;
   - ``Tensor.cuda()`` is the tensor itself (``optimizer/optimizer.py:375,380`` reloading offloaded state,
     ``distrib_optimizer.py:1089``, ``grad_scaler.py:140``).

   ``multi_tensor_applier`` needs nothing: without Apex/TransformerEngine megatron falls back to its
   local ``torch`` implementations (``optimizer/clip_grads.py:35``, ``core/utils.py:1193``), and gloo in
   torch 2.13 runs the distributed optimizer's ``reduce_scatter_tensor``/``all_gather_into_tensor``.

Nothing outside this module branches on the device kind; callers ask :func:`init_megatron` for a
:class:`MegatronRuntime` and use its ``device`` and the optimizer from
:func:`asyncrl.trainer.megatron.optimizers.make_optimizer` (which asks the runtime which one runs). The
optimizers import this module, never the other way round.
"""

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

from asyncrl.trainer.collective.endpoint import Endpoint
from asyncrl.trainer.megatron.parallel import Layout

_RUNTIME: "MegatronRuntime | None" = None


@dataclass(frozen=True)
class MegatronRuntime:
    """What the rest of the actor needs to know about the process's megatron setup."""

    device: torch.device
    on_cpu: bool  # True = the CPU shim is active (gloo, inference RNG tracker, torch AdamW)
    backend: str  # torch.distributed backend: "gloo" or "nccl"

    @property
    def use_cpu_initialization(self) -> bool:
        """Initialise weights with the CPU generator (deterministic under ``torch.manual_seed``)."""
        return self.on_cpu

    def runs_megatron_optimizer(self, settings: "OptimizerSettings") -> bool:
        """Whether megatron's own optimizer runs for ``settings`` here: always on CUDA; on the CPU shim only
        when the resolved settings ask for bf16 or the distributed optimizer (else a torch AdamW, (4))."""
        return not self.on_cpu or settings.resolved(self).megatron_optimizer


def init_megatron(
    seed: int = 0,
    *,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    init_method: Endpoint | None = None,
    rank: int = 0,
    world: int = 1,
) -> MegatronRuntime:
    """Set up torch.distributed and megatron's parallel state (``tp x pp x ep``, DP = the rest); idempotent.

    A second call in the same process re-seeds megatron's RNG tracker and returns the same
    runtime; the process group and the parallel state are created only once (megatron's parallel
    state is per process, so tests share it through a module-scoped fixture).

    Args:
        seed: seed of megatron's RNG tracker (and of torch's default generators).
        device: ``auto`` = the runtime already set up in this process, else CUDA when available,
            else the CPU shim; ``cpu`` forces the shim even on a CUDA host (the CPU test suite);
            asking for a kind other than the one already set up raises (it cannot change in-process).
        tp, pp, ep: tensor, pipeline and expert model-parallel sizes (:class:`parallel.Layout` checks them).
        init_method: the group's rendezvous (the endpoint and token :func:`parallel.rendezvous` drew on rank 0);
            None with ``world == 1``: a private one-process group (or a launcher's ``env://``).
        rank, world: this process's rank in the actor's ``world`` ranks.
    """
    layout = Layout(tp=tp, pp=pp, ep=ep, rank=rank, world=world, init_method=init_method)
    global _RUNTIME
    if _RUNTIME is not None:
        if device != "auto" and (device == "cpu") != _RUNTIME.on_cpu:
            raise RuntimeError(
                f"megatron already runs on {_RUNTIME.device} in this process; cannot switch to {device!r}"
            )
        on_cpu = _RUNTIME.on_cpu
    else:
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("init_megatron(device='cuda') but torch sees no CUDA device")
        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if on_cpu:
        # (1) megatron calls torch.cuda.current_device() at ~170 sites; on CPU they must mean "cpu".
        torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]
    from megatron.core import parallel_state, tensor_parallel

    if _RUNTIME is None:
        backend = "gloo" if on_cpu else "nccl"
        if on_cpu:
            dev = torch.device("cpu")
        else:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
        if not dist.is_initialized():
            _init_process_group(backend, layout)
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                expert_model_parallel_size=layout.ep,
            )
        _RUNTIME = MegatronRuntime(device=dev, on_cpu=on_cpu, backend=backend)

    _moe_without_transformer_engine()
    torch.manual_seed(seed)
    # (2) The training tracker snapshots CUDA RNG states; the inference tracker does not.
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=on_cpu)
    return _RUNTIME


def _cpu_current_device() -> str:
    return "cpu"


def _moe_without_transformer_engine() -> None:
    """(5) megatron-core 0.16.1's MoE router reads the module global ``te_general_gemm``, which its
    ``moe_utils`` defines only when TransformerEngine imports (``NameError`` otherwise, CPU or GPU:
    ``docs/architecture.md`` (megatron-core on the CPU)). ``None`` is the value it tests for: the router's
    plain ``torch`` matmul."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None  # type: ignore[attr-defined]


def _init_process_group(backend: str, layout: Layout) -> None:
    """The actor group's (``layout.init_method``), a launcher's (``torchrun`` sets ``MASTER_ADDR``/
    ``WORLD_SIZE``) or a private one of size 1."""
    if layout.init_method is not None:  # rank 0 serves the group's authenticated store, every rank proves the token
        from asyncrl.trainer.collective.groups import init_default_group

        init_default_group(layout.init_method, backend, layout.rank, layout.world, layout.collective_timeout_s)
        return
    if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, init_method="env://")
        return
    # A group of one rendezvous in the process's own memory: no port to collide with the other processes on
    # the host, and no file left behind by a process that is killed (a file rendezvous left a folder each).
    dist.init_process_group(backend, store=dist.HashStore(), world_size=1, rank=0)


def wrap_ddp(model: Any, *, distributed_optimizer: bool = False) -> Any:
    """Wrap a megatron module in megatron's DDP (grads accumulate into fp32 ``param.main_grad``).

    ``distributed_optimizer``: lay the grad buffers out for megatron's ``DistributedOptimizer`` (pair it
    with ``OptimizerSettings(distributed_optimizer=True)``; gloo runs its reduce-scatter on the CPU).
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    current_runtime()
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=distributed_optimizer
    )
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


@dataclass(frozen=True)
class StepOutcome:
    """What one optimizer step did."""

    grad_norm: float  # global L2 norm of the gradients before clipping (nan/inf when non-finite)
    stepped: bool  # False = the update was skipped (non-finite gradients)


class ActorOptimizer(Protocol):
    """The optimizer interface the actor uses, whichever implementation sits behind it."""

    def set_learning_rate(self, lr: float) -> None: ...

    def learning_rate(self) -> float: ...

    def zero_grad(self) -> None: ...

    def step(self) -> StepOutcome: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class OptimizerSettings:
    """AdamW hyper-parameters (from ``spec.train``)."""

    lr: float
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None = no clipping (the norm is still measured)
    # bf16 params with fp32 main params in megatron's optimizer (the model must be bf16: cast_model), and
    # megatron's DistributedOptimizer (Adam state sharded over DP; needs wrap_ddp(distributed_optimizer=True)).
    # None = the device's default (resolved): both on CUDA, neither on the CPU shim.
    bf16: bool | None = False
    distributed_optimizer: bool | None = False

    def resolved(self, runtime: "MegatronRuntime") -> "OptimizerSettings":
        """These settings with ``None`` replaced by the device's default (True on CUDA, False on the CPU)."""
        on_gpu = not runtime.on_cpu
        return dataclasses.replace(
            self,
            bf16=on_gpu if self.bf16 is None else self.bf16,
            distributed_optimizer=on_gpu if self.distributed_optimizer is None else self.distributed_optimizer,
        )

    @property
    def megatron_optimizer(self) -> bool:
        """Whether megatron's own optimizer runs (always on CUDA; on the CPU when either option is set)."""
        return bool(self.bf16 or self.distributed_optimizer)


def optimizer_kind(optimizer: Any) -> str:
    """``MegatronAdam/DistributedOptimizer``, ``MainGradAdamW/AdamW``: ours, then what sits inside."""
    inner = getattr(optimizer, "_opt", None)
    names = [type(o).__name__ for o in getattr(inner, "chained_optimizers", [inner])]
    return f"{type(optimizer).__name__}/{'+'.join(names)}"


def cast_model(gpt: Any, settings: OptimizerSettings) -> Any:
    """``gpt`` in the optimizer's parameter dtype: bf16 (config included: megatron's optimizer keeps fp32
    main params of bf16 model params) when ``settings.bf16`` (resolved), else unchanged (fp32)."""
    if not settings.bf16:
        return gpt
    gpt.config.bf16, gpt.config.params_dtype = True, torch.bfloat16
    return gpt.to(torch.bfloat16)


class CudaOnCpu(TorchFunctionMode):
    """(6) megatron's optimizer code on the CPU: ``device='cuda'`` factory arguments become the CPU,
    ``Tensor.type()`` answers the CUDA type name, ``Tensor.cuda()`` is the tensor (module docstring, with the
    megatron-core 0.16.1 sites). Active only inside :func:`megatron_code` on the CPU shim."""

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def megatron_code() -> Iterator[None]:
    """The context megatron's optimizer runs in: :class:`CudaOnCpu` on the CPU shim, nothing on CUDA."""
    if current_runtime().on_cpu:
        with CudaOnCpu():
            yield
    else:
        yield


def current_runtime() -> MegatronRuntime:
    if _RUNTIME is None:
        raise RuntimeError(
            "megatron is not initialised in this process; call compat.init_megatron(seed) first"
        )
    return _RUNTIME
