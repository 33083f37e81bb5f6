"""Route capture in the transformers engine (routing replay R3): every forward's top-k experts per MoE layer,
kept per version, re-prefills after a weight update included."""

import random
from collections.abc import Callable

import numpy as np
import pytest
import torch

from asyncrl.api.model_arch import ModelArch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.routes import RouteLog, route_dtype
from asyncrl.rollout.tokenizer import TOKENIZER
from tests.support import moe_routes
from tests.support.moe_routes import Weights, decisive_moe_weights

MOE = ModelArch(64, 2, 4, 2, 128, TOKENIZER.vocab_size, 256, False, norm_epsilon=1e-6, family="qwen3_moe",
                kv_channels=16, num_experts=4, moe_top_k=2, moe_ffn_hidden_size=32, norm_topk_prob=True)


@pytest.fixture(scope="module")
def moe_weights() -> Weights:
    return decisive_moe_weights(MOE)


def reference_routes(weights: dict[str, torch.Tensor], tokens: list[int]) -> np.ndarray:
    """``[T, L, k]`` routes of one fp32 transformers forward of this file's model over ``tokens``."""
    return moe_routes.reference_routes(MOE, weights, tokens)


def test_routes_of_every_version_match_a_full_forward(moe_weights: Callable, script_env: type) -> None:
    eng = HFEngine(MOE, dtype="float32", seed=0, capture_routes=True)
    eng.load_weights(moe_weights(0), version=0)

    def hook(seen: int) -> None:
        if seen == 5:
            eng.update_weights(moe_weights(1), version=1)

    rng = random.Random(0)
    eps = [Episode.start(f"t{i}", "g", script_env(every=4, turns=3, on_step=hook if i == 0 else None), rng)
           for i in range(4)]
    eng.generate(eps, max_new_tokens=40, partial_rollout=True)
    assert eng.counters.swaps_in_flight == 1
    for e in eps:
        t = e.to_trajectory()
        assert t.is_partial and t.routes is not None
        assert list(t.routes.blocks) == [0, 1]  # the version-0 prefix, then the re-prefill under version 1
        last_v0 = max(i for i, v in enumerate(t.versions) if v == 0)
        # version 0 routed every position up to the one that sampled its last token ...
        assert t.routes.length(0) >= last_v0
        # ... version 1 re-prefilled the whole prefix and routed every fed token (all but the last)
        assert t.routes.length(1) == len(t.tokens) - 1
        for v in (0, 1):
            got = t.routes.for_version(v)
            assert got.dtype == np.uint8 and got.shape[1:] == (MOE.num_layers, MOE.moe_top_k)
            want = reference_routes(moe_weights(v), t.tokens[: len(got)])
            # top-k order is the router's; compare the expert sets per position and layer
            assert (np.sort(got, axis=-1) == np.sort(want, axis=-1)).all()
        assert (t.routes.latest(len(t.tokens))[:-1] == t.routes.for_version(1)).all()


def test_no_capture_by_default_and_dense_models_refuse_it(moe_weights: Callable, script_env: type) -> None:
    eng = HFEngine(MOE, dtype="float32", seed=0)
    eng.load_weights(moe_weights(0), version=0)
    eps = [Episode.start("t", "g", script_env(), random.Random(0))]
    eng.generate(eps, max_new_tokens=6)
    assert eps[0].to_trajectory().routes is None
    from dataclasses import replace
    with pytest.raises(ValueError, match="dense"):
        HFEngine(replace(MOE, family="qwen3", num_experts=0, moe_top_k=0, moe_ffn_hidden_size=0),
                 capture_routes=True)


def test_route_log_blocks() -> None:
    log = RouteLog(moe_layers=2, top_k=2)
    r = np.arange(12, dtype=np.uint8).reshape(3, 2, 2)
    log.record(3, 0, r)
    log.record(3, 3, r[:1])
    assert log.length(3) == 4 and (log.for_version(3)[3] == r[0]).all()
    with pytest.raises(ValueError, match="positions 0..3"):
        log.record(3, 5, r[:1])  # a gap
    log.record(4, 0, r[:2])
    assert list(log.blocks) == [3, 4] and log.nbytes == 4 * 4 + 2 * 4
    latest = log.latest(4)  # version 4's two positions, then experts 0..k-1
    assert (latest[:2] == r[:2]).all() and (latest[2:] == [0, 1]).all()
    snap = log.copy()
    log.record(4, 2, r[:1])
    assert snap.length(4) == 2 and log.length(4) == 3
    assert route_dtype(256) is np.uint8 and route_dtype(257) is np.int16


def test_release_and_acquire_keep_a_moe_model(moe_weights: Callable, script_env: type) -> None:
    """interruptSync releases the engine's model and acquires it back: a MoE model's fused experts must be
    kept under their checkpoint names (the names load_hf_state_dict takes), or the job stops at acquire."""
    eng = HFEngine(MOE, dtype="float32", seed=0, capture_routes=True)
    eng.load_weights(moe_weights(0), version=0)
    before = {k: v.clone() for k, v in eng.model.state_dict().items()}
    eng.release()
    eng.acquire()
    after = eng.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
