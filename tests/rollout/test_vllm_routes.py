"""Route capture in the vLLM engine (routing replay R3, ``make test-vllm``): the top-k experts of every MoE layer
for every position vLLM computes, kept per version like the transformers engine's (tests/rollout/
test_route_capture.py), a re-prefill after a weight update in the middle of a trajectory included.

vLLM's own routed-experts output cannot be turned on in its CPU build (tests/rollout/test_vllm_routed_experts.py);
the engine process reads the routes from the hook vLLM's routers call for that output (``RouteTap`` in
rollout/vllm_server.py). One engine process for the module (its start costs ~20 s).
"""

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from asyncrl.api.model_arch import ModelArch
from asyncrl.rollout.engine_registry import make_engine
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.rollout.vllm_engine import VLLMEngine
from tests.support import moe_routes
from tests.support.moe_routes import Weights, decisive_moe_weights

pytestmark = pytest.mark.vllm

# head_dim 64: vLLM's CPU attention kernel has no 16 (test_route_capture.py's MoE shape); float32 only on CPU
MOE = ModelArch(128, 2, 2, 1, 256, TOKENIZER.vocab_size, 256, False, norm_epsilon=1e-6, family="qwen3_moe",
                kv_channels=64, num_experts=4, moe_top_k=2, moe_ffn_hidden_size=32, norm_topk_prob=True)


@pytest.fixture(scope="module")
def moe_weights() -> Weights:
    return decisive_moe_weights(MOE)


@pytest.fixture(scope="module")
def engine() -> Iterator[VLLMEngine]:
    eng = make_engine("vllm", MOE, dtype="float32", seed=0, capture_routes=True)
    assert isinstance(eng, VLLMEngine)
    yield eng
    eng.close()


def reference_routes(weights: dict[str, torch.Tensor], tokens: list[int]) -> np.ndarray:
    """``[T, L, k]`` routes of one fp32 transformers forward of this file's model over ``tokens``."""
    return moe_routes.reference_routes(MOE, weights, tokens)


def test_routes_of_every_version_match_a_full_forward(
    engine: VLLMEngine, moe_weights: Weights, script_env: type
) -> None:
    engine.load_weights(moe_weights(0), version=0)

    def hook(seen: int) -> None:
        if seen == 5:
            engine.update_weights(moe_weights(1), version=1)  # from the generate thread: lands at the next step

    rng = random.Random(0)
    eps = [Episode.start(f"t{i}", "g", script_env(every=4, turns=3, on_step=hook if i == 0 else None), rng)
           for i in range(4)]
    engine.generate(eps, max_new_tokens=40, temperature=1.0, seed=5, partial_rollout=True)
    assert engine.counters.swaps_in_flight >= 1
    same = total = 0
    for e in eps:
        t = e.to_trajectory()
        assert t.is_partial and t.routes is not None
        assert list(t.routes.blocks) == [0, 1]  # the version-0 prefix, then the re-prefill under version 1
        last_v0 = max(i for i, v in enumerate(t.versions) if v == 0)
        assert t.routes.length(0) >= last_v0  # version 0 routed every position up to its last token's
        assert t.routes.length(1) == len(t.tokens) - 1  # version 1 re-prefilled and routed every fed token
        for v in (0, 1):
            got = t.routes.for_version(v)
            assert got.dtype == np.uint8 and got.shape[1:] == (MOE.num_layers, MOE.moe_top_k)
            want = reference_routes(moe_weights(v), t.tokens[: len(got)])
            ok = (np.sort(got, axis=-1) == np.sort(want, axis=-1)).all(axis=(1, 2))  # expert sets, all layers
            same, total = same + int(ok.sum()), total + len(ok)
        assert (t.routes.latest(len(t.tokens))[:-1] == t.routes.for_version(1)).all()
    print(f"vLLM routes vs a transformers fp32 forward: {same}/{total} positions alike in every layer")
    assert same == total


def test_dense_models_refuse_route_capture() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="dense"):  # refused before any engine process starts
        VLLMEngine(replace(MOE, family="qwen3", num_experts=0, moe_top_k=0, moe_ffn_hidden_size=0),
                   capture_routes=True)
