"""The actor's two optimizers behind :class:`~asyncrl.trainer.megatron.compat.ActorOptimizer`
(:func:`make_optimizer` builds the one the runtime names): :class:`MainGradAdamW`, a torch AdamW over
megatron DDP's ``main_grad`` (the CPU default), and :class:`MegatronAdam`, megatron's own optimizer (the GPU
default; on the CPU under :class:`~asyncrl.trainer.megatron.compat.CudaOnCpu`)."""

import math
from typing import Any

import torch

from asyncrl.trainer.megatron.compat import (
    ActorOptimizer,
    OptimizerSettings,
    StepOutcome,
    current_runtime,
    megatron_code,
)
from asyncrl.trainer.megatron.parallel import clip_grads


class MainGradAdamW:
    """``torch.optim.AdamW`` over the gradients that megatron's DDP accumulates in ``main_grad``.

    The CPU default: a plain fp32 AdamW needs no shim of megatron's optimizer (the ``compat.CudaOnCpu``
    mode is the opt-in, ``distributed_optimizer=True``). Gradients still flow the megatron way (hooks into
    contiguous fp32 ``main_grad`` buffers, ``finish_grad_sync``); this class points ``param.grad`` at
    those buffers, clips with the model-parallel-aware norm and steps AdamW.
    """

    def __init__(self, ddp_model: Any, settings: OptimizerSettings) -> None:
        self._ddp = ddp_model
        self._params = [p for p in ddp_model.parameters() if p.requires_grad]
        self._max_grad_norm = settings.max_grad_norm
        # Megatron's grouping: no weight decay on 1-D parameters (norm weights, biases).
        groups = [
            {"params": [p for p in self._params if p.dim() > 1], "weight_decay": settings.weight_decay},
            {"params": [p for p in self._params if p.dim() <= 1], "weight_decay": 0.0},
        ]
        self._opt = torch.optim.AdamW(groups, lr=settings.lr, betas=settings.betas, eps=settings.eps)

    def set_learning_rate(self, lr: float) -> None:
        """Set the rate of every parameter group (the driver's warm-start schedule uses it)."""
        for group in self._opt.param_groups:
            group["lr"] = lr

    def learning_rate(self) -> float:
        """The rate the next step uses (every group has the same)."""
        return float(self._opt.param_groups[0]["lr"])

    def zero_grad(self) -> None:
        # param.grad must be None before backward: DDP's hook adds param.grad into main_grad, and
        # a param.grad still aliasing main_grad would be accumulated into twice.
        self._opt.zero_grad(set_to_none=True)
        self._ddp.zero_grad_buffer()

    def step(self) -> StepOutcome:
        self._ddp.finish_grad_sync()
        for p in self._params:
            p.grad = p.main_grad  # type: ignore[attr-defined]  # set by megatron's DDP
        max_norm = self._max_grad_norm if self._max_grad_norm is not None else math.inf
        # One sync point: the norm decides whether the update is applied at all. Model-parallel aware
        # (TP shards summed over the group, replicated grads once): the same global norm on every rank.
        norm = clip_grads(self._params, max_norm)
        if not math.isfinite(norm):
            return StepOutcome(grad_norm=norm, stepped=False)
        self._opt.step()
        return StepOutcome(grad_norm=norm, stepped=True)

    def state_dict(self) -> dict[str, Any]:
        return self._opt.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._opt.load_state_dict(state)


# dist_checkpointing format of the DistributedOptimizer's state: it reshards across TP and DP (the actor's
# checkpoints resume at another layout). "dp_reshardable" writes without gathering but reshards over DP
# only (megatron-core 0.16.1 ``distrib_optimizer.py:1187``).
OPTIMIZER_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}


class MegatronAdam:
    """megatron's own optimizer (``get_megatron_optimizer``, a ``ChainedOptimizer``): on CUDA as designed,
    on the CPU shim under ``compat.CudaOnCpu``.

    ``settings.bf16``: the model's params are bf16 (``compat.cast_model``) and megatron keeps fp32 main
    params; ``settings.distributed_optimizer``: megatron's ``DistributedOptimizer`` (the main params and
    Adam state sharded over the data-parallel ranks).

    :meth:`step` is megatron's ``ChainedOptimizer.step`` with one check added: megatron skips an update
    only when an fp16 grad scaler finds an inf, so with bf16 or fp32 a non-finite gradient would reach the
    weights. The global norm (model- and data-parallel reduced: the same on every rank) is read first; a
    non-finite norm skips the update on every rank alike, as :class:`MainGradAdamW` does.
    """

    def __init__(self, ddp_model: Any, settings: OptimizerSettings) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.settings = settings
        bf16 = bool(settings.bf16)
        config = OptimizerConfig(
            optimizer="adam",
            lr=settings.lr,
            min_lr=settings.lr,
            weight_decay=settings.weight_decay,
            adam_beta1=settings.betas[0],
            adam_beta2=settings.betas[1],
            adam_eps=settings.eps,
            clip_grad=settings.max_grad_norm or 0.0,
            bf16=bf16,
            params_dtype=torch.bfloat16 if bf16 else torch.float32,
            use_distributed_optimizer=bool(settings.distributed_optimizer),
        )
        self._ddp = ddp_model
        with megatron_code():
            self._opt = get_megatron_optimizer(config, [ddp_model])
        self._parts = list(getattr(self._opt, "chained_optimizers", [self._opt]))
        # No OptimizerParamScheduler drives this optimizer, and it is what applies megatron's group multipliers:
        # without it the 1-D params (norms, biases; wd_mult 0) would be decayed too. Pin rate and decay here.
        self.set_learning_rate(settings.lr)

    def set_learning_rate(self, lr: float) -> None:
        """Set the rate (and the decay) of every parameter group, times megatron's ``lr_mult``/``wd_mult``
        (the driver's warm-start schedule uses it)."""
        for group in self._opt.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.settings.weight_decay * group.get("wd_mult", 1.0)

    def learning_rate(self) -> float:
        """The rate the next step uses, before megatron's ``lr_mult`` (what :meth:`set_learning_rate` set)."""
        group = self._opt.param_groups[0]
        return float(group["lr"]) / group.get("lr_mult", 1.0)

    def zero_grad(self) -> None:
        self._opt.zero_grad(set_to_none=True)
        self._ddp.zero_grad_buffer()

    @torch.no_grad()
    def step(self) -> StepOutcome:
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        self._ddp.finish_grad_sync()
        with megatron_code():
            if self._opt.prepare_grads():  # an fp16 grad scaler found an inf (never with bf16/fp32)
                return StepOutcome(grad_norm=math.inf, stepped=False)
            norm = float(self._opt.get_grad_norm())  # one sync point, global: every rank decides alike
            if not math.isfinite(norm):
                return StepOutcome(grad_norm=norm, stepped=False)
            max_norm = self.settings.max_grad_norm
            if max_norm:
                for part in self._parts:
                    params = part.get_parameters()
                    if params:
                        clip_grad_by_total_norm_fp32(params, max_norm=max_norm, total_norm=norm)
            stepped = bool(self._opt.step_with_ready_grads())
        return StepOutcome(grad_norm=norm, stepped=stepped)

    def state_dict(self) -> dict[str, Any]:
        with megatron_code():
            return self._opt.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with megatron_code():
            self._opt.load_state_dict(state)

    def sharded_state_dict(self, model_sd: Any, *, is_loading: bool = False) -> dict[str, Any]:
        """megatron's ``sharded_state_dict`` of the optimizer over ``model_sd`` (the model's own, keys without
        prefix), for ``dist_checkpointing`` (:data:`OPTIMIZER_SHARDING`); ``is_loading``: the template to load into."""
        self._init_empty_state()  # a fresh optimizer (a load template, or a save before the first step)
        with megatron_code():
            return self._opt.sharded_state_dict(model_sd, is_loading=is_loading, metadata=dict(OPTIMIZER_SHARDING))

    def _init_empty_state(self) -> None:
        """Adam state (zeros, ``step`` 0: what torch's first step would create) for every parameter that has
        none yet, so a fresh optimizer can build its state dict: without Apex/TransformerEngine the ``DistributedOptimizer``'s ``state_dict`` reads one
        common ``step`` from the torch state (``distrib_optimizer.py:641``, an assert on a fresh one). megatron's
        own answer (``_init_optimizer_states_with_dummy_values``) takes an optimizer step, whose weight decay
        would move the fp32 weights that the distributed optimizer's main shards are views of."""
        for part in self._parts:
            inner = part.optimizer
            if not type(inner).__module__.startswith("torch.optim"):
                continue  # Apex/TransformerEngine FusedAdam: its step lives in the param groups, megatron's own path
            for group in inner.param_groups:
                for p in group["params"]:
                    state = inner.state[p]
                    if "step" not in state:
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["step"] = torch.tensor(0.0)

    def load_sharded(self, state: dict[str, Any]) -> None:
        """Load what ``dist_checkpointing.load`` returned for :meth:`sharded_state_dict` (``is_loading=True``).

        Two megatron-core 0.16.1 gaps of the torch-Adam path (without Apex/TransformerEngine, CPU or GPU) are
        bridged: the torch Adam state holds a ``step`` per parameter, which the ``fully_reshardable`` load copies
        into but never provides (``distrib_optimizer.py:2103`` skips it in the source, ``:940`` copies every
        destination key: ``KeyError: 'step'``), so while it runs each parameter's ``step`` is set aside and put
        back after (its value was already restored from the param groups, ``:817``); and that restored step is
        one tensor shared by all parameters (below)."""
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        restore = []
        for part in self._parts:
            if isinstance(part, DistributedOptimizer):
                restore.append((part, part._set_main_param_and_optimizer_states))
                part._set_main_param_and_optimizer_states = _without_step(part)  # type: ignore[method-assign]
        try:
            with megatron_code():
                self._opt.load_state_dict(state)
        finally:
            for part, original in restore:
                part._set_main_param_and_optimizer_states = original  # type: ignore[method-assign]
        # megatron restores the common step as ONE tensor shared by every parameter's state (``:822``); torch's
        # Adam increments each parameter's step in place, so a shared one would advance once per parameter.
        for part in self._parts:
            for state in part.optimizer.state.values():
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].clone()


def _without_step(part: Any) -> Any:
    """``part._set_main_param_and_optimizer_states`` with the main param's ``step`` set aside (:meth:`MegatronAdam.load_sharded`)."""
    original = part._set_main_param_and_optimizer_states

    def set_states(model_param: Any, tensors: dict[str, torch.Tensor]) -> None:
        group, order = part.model_param_group_index_map[model_param]
        state = part.optimizer.state[part.optimizer.param_groups[group]["params"][order]]
        step = state.pop("step", None)
        try:
            original(model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    return set_states


def make_optimizer(ddp_model: Any, settings: OptimizerSettings) -> ActorOptimizer:
    """The actor's optimizer: megatron's on a GPU (and on the CPU when ``settings`` ask for bf16 or the
    distributed optimizer, under ``compat.CudaOnCpu``), else :class:`MainGradAdamW` on the CPU
    (:meth:`~asyncrl.trainer.megatron.compat.MegatronRuntime.runs_megatron_optimizer` decides)."""
    runtime = current_runtime()
    resolved = settings.resolved(runtime)
    if runtime.runs_megatron_optimizer(resolved):
        return MegatronAdam(ddp_model, resolved)
    return MainGradAdamW(ddp_model, resolved)
