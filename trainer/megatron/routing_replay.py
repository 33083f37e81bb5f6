"""Routing replay on the actor's megatron ``GPTModel``: record or replay each MoE layer's top-k experts.

megatron-core 0.16.1 routes through :class:`~megatron.core.transformer.moe.router_replay.RouterReplay` when a
``TopKRouter`` has one (``topk_routing_with_score_function(router_replay=...)``): ``RECORD`` keeps the top-k
indices it computed, ``REPLAY_FORWARD`` takes the given indices and gathers the router's scores at them, so the
routing *probabilities* still come from this forward's router logits and gradients reach the router weights.
Its class keeps every instance in one process-global list (``global_router_replay_instances``) and its static
methods act on all of them; the actor, a dedicated scorer and a test's second model may share one process, so
:func:`install` gives each model instance routers of its own (:class:`ModelRouterReplay`, left out of that list)
and this module drives only the instances of the model it is given.

Layouts: asyncrl's routes are ``[B, T, L, k]`` (rollout/routes.py: batch-first, like the tokens); megatron's
router sees ``[S * B, E]`` logits flattened from its sequence-first ``[S, B, E]`` (index ``s * B + b``).

Router fusion (``moe_router_fusion``) computes top-k in a TransformerEngine kernel that never consults the
replay: :func:`install` refuses a model built with it (the actor pins it off: trainer/megatron/model.py).
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction


def _unwrap(model: Any) -> Any:
    while hasattr(model, "module"):  # megatron's DDP wrapper (as trainer/megatron/model.unwrap)
        model = model.module
    return model


class ModelRouterReplay(RouterReplay):
    """One MoE layer's replay state, owned by one model (not in megatron's global list).

    While replaying it also computes the router's own top-k and keeps, per token, whether the two expert
    sets differ (``flipped`` ``[S * B]`` bool): the route-flip share costs one top-k per layer, no forward.
    """

    def __init__(self) -> None:  # megatron's __init__ would append self to the global list
        self.target_topk_idx: torch.Tensor | None = None
        self.recorded_topk_idx: torch.Tensor | None = None
        self.router_replay_action: RouterReplayAction | None = None
        self.replay_backward_list: list[torch.Tensor] = []
        self.flipped: torch.Tensor | None = None

    def get_replay_topk(self, scores: torch.Tensor, topk: int, num_groups: int | None = None,
                        group_topk: int | None = None,
                        default_compute_topk: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.router_replay_action is RouterReplayAction.REPLAY_FORWARD and default_compute_topk is not None:
            with torch.no_grad():
                _, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
                target = self.target_topk_idx.to(scores.device)  # type: ignore[union-attr]
                self.flipped = (own.sort(dim=-1).values != target.sort(dim=-1).values).any(dim=-1)
        return super().get_replay_topk(scores, topk, num_groups, group_topk, default_compute_topk)



def install(model: Any) -> int:
    """Give every ``TopKRouter`` of ``model`` its own :class:`ModelRouterReplay` (idle: it routes as usual);
    returns the number of MoE layers. Raises ``ValueError`` for a fused router."""
    routers = [m for m in _unwrap(model).modules() if hasattr(m, "router_replay") and hasattr(m, "topk")]
    for r in routers:
        if r.config.moe_router_fusion:
            raise ValueError("routing replay: this model's router is fused (moe_router_fusion), which computes "
                             "top-k without consulting the replay; build it with moe_router_fusion=False")
        r.router_replay = ModelRouterReplay()
    return len(routers)


def replays_of(model: Any) -> list[ModelRouterReplay]:
    """The replay instance of each MoE layer of ``model``, in layer order (empty: dense, or not installed)."""
    return [m.router_replay for m in _unwrap(model).modules()
            if isinstance(getattr(m, "router_replay", None), ModelRouterReplay)]


def _to_megatron(routes: torch.Tensor, layer: int) -> torch.Tensor:
    """``[B, T, L, k]`` -> layer ``layer``'s ``[T * B, k]`` long (megatron's sequence-first token order)."""
    B, T, _, k = routes.shape
    return routes[:, :, layer, :].transpose(0, 1).reshape(T * B, k).long()


def _from_megatron(indices: list[torch.Tensor], B: int, T: int) -> torch.Tensor:
    """Per layer ``[T * B, k]`` -> ``[B, T, L, k]`` (int16: up to 32768 experts)."""
    return torch.stack([i.reshape(T, B, -1).transpose(0, 1) for i in indices], dim=2).to(torch.int16)


@contextmanager
def replaying(model: Any, routes: torch.Tensor | None) -> Iterator[list[ModelRouterReplay]]:
    """Forwards of ``model`` inside the block route every position through ``routes`` ``[B, T, L, k]`` (the
    forwards' tokens ``[B, T]``); ``routes=None`` routes as usual. Yields the layers' replay instances
    (their ``flipped`` after a forward)."""
    layers = replays_of(model)
    if routes is None:
        yield layers
        return
    if routes.dim() != 4 or routes.shape[2] != len(layers):
        raise ValueError(f"routing replay: routes must be [B, T, {len(layers)}, k] for this model's "
                         f"{len(layers)} MoE layers; got shape {tuple(routes.shape)}")
    try:
        for i, layer in enumerate(layers):
            layer.clear_indices()
            layer.flipped = None
            layer.target_topk_idx = _to_megatron(routes, i)
            layer.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
        yield layers
    finally:
        for layer in layers:
            layer.clear_indices()
            layer.clear_router_replay_action()


class Recording:
    """The routes of the forwards run inside :func:`recording` (the last one's)."""

    def __init__(self, layers: list[ModelRouterReplay]) -> None:
        self.layers = layers

    def routes(self, batch: int, seq: int) -> torch.Tensor:
        """``[B, T, L, k]`` int16 top-k experts of the last forward over ``[B, T]`` tokens."""
        got = [layer.recorded_topk_idx for layer in self.layers]
        if any(g is None for g in got):
            raise RuntimeError("routing replay: no forward ran while recording")
        return _from_megatron([g for g in got if g is not None], batch, seq)


@contextmanager
def recording(model: Any) -> Iterator[Recording]:
    """Forwards of ``model`` inside the block route as usual and keep their top-k indices."""
    layers = replays_of(model)
    if not layers:
        raise ValueError("routing replay: this model has no MoE router to record (a dense model, or "
                         "trainer.megatron.routing_replay.install was not called)")
    try:
        for layer in layers:
            layer.clear_indices()
            layer.set_router_replay_action(RouterReplayAction.RECORD)
        yield Recording(layers)
    finally:
        for layer in layers:
            layer.clear_router_replay_action()


def flipped_positions(layers: list[ModelRouterReplay], batch: int, seq: int) -> torch.Tensor | None:
    """``[B, T]`` bool: positions the model's own router would have sent to another expert set, in at least
    one layer, in the last replayed forward (None when nothing was replayed)."""
    flags = [layer.flipped for layer in layers]
    if not flags or any(f is None for f in flags):
        return None
    any_layer = torch.stack([f for f in flags if f is not None]).any(dim=0)  # [T * B]
    return any_layer.reshape(seq, batch).t()
