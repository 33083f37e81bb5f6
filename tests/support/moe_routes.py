"""What the route-capture tests of both engines share: random MoE weights whose routers are decisive (no
near-ties between experts, so an fp32 forward elsewhere picks the same experts), and the routes of one
independent fp32 transformers forward to compare a capture with."""

from collections.abc import Callable

import numpy as np
import torch

from asyncrl.api.model_arch import ModelArch
from asyncrl.rollout.hf_model import build_model, hf_state_dict, load_hf_state_dict
from asyncrl.rollout.route_capture import capturing

Weights = Callable[[int], dict[str, torch.Tensor]]


def decisive_moe_weights(arch: ModelArch) -> Weights:
    """``seed -> HF state dict`` of ``arch`` (built once per seed): embeddings scaled x8 (sharper sampling) and
    every router's gate drawn N(0, 1) (decisive routes)."""
    cache: dict[int, dict[str, torch.Tensor]] = {}

    def make(seed: int) -> dict[str, torch.Tensor]:
        if seed not in cache:
            model = build_model(arch, seed=seed)
            with torch.no_grad():
                model.model.embed_tokens.weight.mul_(8.0)
                for layer in model.model.layers:
                    layer.mlp.gate.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed))
            cache[seed] = {k: v.clone() for k, v in hf_state_dict(model).items()}
        return cache[seed]

    return make


def reference_routes(arch: ModelArch, weights: dict[str, torch.Tensor], tokens: list[int]) -> np.ndarray:
    """``[T, L, k]`` routes of one unpadded fp32 transformers forward of ``arch`` over ``tokens``."""
    model = build_model(arch)
    load_hf_state_dict(model, weights)
    with torch.no_grad(), capturing(model) as tap:
        model(input_ids=torch.tensor([tokens]))
        return tap.take(1, len(tokens))[0]
