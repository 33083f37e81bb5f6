"""Capture the top-k expert indices of every MoE layer in a transformers forward (routing replay, R3).

transformers' Qwen3-MoE router (``mlp.gate``, ``Qwen3MoeTopKRouter``) returns ``(logits, weights, indices)``
with ``indices`` ``[B * S, k]``; a forward hook on each router keeps them, and :meth:`RouteTap.take` hands the
forward's routes over as one ``[B, S, L, k]`` array (``L`` = MoE layers in layer order).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from asyncrl.rollout.routes import route_dtype


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The router module of each MoE layer, in layer order (empty for a dense model)."""
    return [m for name, m in model.named_modules() if name.endswith("mlp.gate") and hasattr(m, "top_k")]


class RouteTap:
    """Routes of the last forward, one ``[B * S, k]`` tensor per MoE layer."""

    def __init__(self, model: torch.nn.Module, num_experts: int) -> None:
        self._model = model
        self._dtype = route_dtype(num_experts)
        self._seen: list[torch.Tensor] = []

    def watches(self, model: torch.nn.Module) -> bool:
        """Whether the hooks sit on ``model``'s routers."""
        return model is self._model

    def hook(self, _module: torch.nn.Module, _args: Any, output: tuple[torch.Tensor, ...]) -> None:
        self._seen.append(output[2])

    def take(self, batch: int, seq: int) -> np.ndarray:
        """``[B, S, L, k]`` expert ids of the forward that just ran (and forget them)."""
        if not self._seen:
            raise RuntimeError("RouteTap.take: no MoE router ran since the last take")
        stacked = torch.stack([i.reshape(batch, seq, -1) for i in self._seen], dim=2)  # [B, S, L, k]
        self._seen.clear()
        return stacked.to("cpu").numpy().astype(self._dtype)


@contextmanager
def capturing(model: Any) -> Iterator[RouteTap]:
    """A :class:`RouteTap` hooked on ``model``'s routers for the duration of the block (``model``: a
    transformers ``PreTrainedModel``, typed ``Any`` for its ``config.num_experts``)."""
    routers = moe_routers(model)
    if not routers:
        raise ValueError("route capture needs a mixture-of-experts model; this one has no MoE router")
    tap = RouteTap(model, int(model.config.num_experts))
    handles = [r.register_forward_hook(tap.hook) for r in routers]
    try:
        yield tap
    finally:
        for h in handles:
            h.remove()
