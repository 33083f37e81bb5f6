"""Routing replay on the actor's megatron model (trainer/megatron/routing_replay.py): record-then-replay is exact,
other routes change the logits and replay restores them, router gradients flow, instances stay per model,
and the rollout engine's routes are the actor's under fp32."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.core.transformer.moe.router_replay import RouterReplay

from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.tokenizer import HFTokenizer
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import megatron_to_hf
from asyncrl.trainer.megatron.logprobs import token_logprobs
from asyncrl.trainer.megatron.routing_replay import flipped_positions, recording, replaying, replays_of
from tests.support.hf_models import CountingEnv, folder_arch, megatron_model, tiny_folder, tokens

torch.set_num_threads(1)
VOCAB = 266  # the tiny folders' vocabulary


@pytest.fixture(scope="module", autouse=True)
def megatron() -> compat.MegatronRuntime:
    return compat.init_megatron(seed=0, device="cpu")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("replay"), "qwen3_moe")


def _record(gpt, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad(), recording(gpt) as rec:
        logp = token_logprobs(gpt, ids)
    return logp, rec.routes(*ids.shape)


def test_record_then_replay_reproduces_the_log_probs_exactly(folder: Path) -> None:
    gpt = megatron_model(folder)
    ids = tokens(VOCAB)
    logp, routes = _record(gpt, ids)
    assert routes.shape == (*ids.shape, 2, 2) and routes.dtype == torch.int16
    with torch.no_grad():
        replayed = token_logprobs(gpt, ids, routes=routes)
        flips = flipped_positions(replays_of(gpt), *ids.shape)
        plain = token_logprobs(gpt, ids)
    assert torch.equal(replayed, logp) and torch.equal(plain, logp)  # bit-identical
    assert flips is not None and flips.shape == ids.shape and not bool(flips.any())


def test_other_routes_change_the_log_probs_and_replay_restores_them(folder: Path) -> None:
    gpt = megatron_model(folder)
    ids = tokens(VOCAB)
    logp, routes = _record(gpt, ids)
    # every position's expert set replaced by the two experts it did not pick (4 experts, top-2)
    every = torch.arange(4).expand(*routes.shape[:3], 4)
    keep = ~(every[..., :, None] == routes[..., None, :].long()).any(-1)
    others = every[keep].reshape(routes.shape)
    with torch.no_grad():
        forced = token_logprobs(gpt, ids, routes=others)
        layers = replays_of(gpt)
        flips = flipped_positions(layers, *ids.shape)
        back = token_logprobs(gpt, ids, routes=routes)
        flips_back = flipped_positions(layers, *ids.shape)
    assert (forced - logp)[:, 1:].abs().min() > 0  # every scored token moved
    assert flips is not None and bool(flips.all())  # every position was routed elsewhere
    assert torch.equal(back, logp)
    assert flips_back is not None and not bool(flips_back.any())


def test_router_gradients_flow_under_replay(folder: Path) -> None:
    gpt = megatron_model(folder)
    ids = tokens(VOCAB)
    _, routes = _record(gpt, ids)
    gpt.zero_grad()
    token_logprobs(gpt, ids, routes=routes)[:, 1:].sum().backward()
    router_grads = [layer.mlp.router.weight.grad for layer in gpt.decoder.layers]
    assert all(g is not None and float(g.abs().sum()) > 0 for g in router_grads)


def test_each_model_has_its_own_replay_instances(folder: Path) -> None:
    before = len(RouterReplay.global_router_replay_instances)
    a, b = megatron_model(folder), megatron_model(folder)
    assert len(RouterReplay.global_router_replay_instances) == before  # none joins megatron's global list
    ra, rb = replays_of(a), replays_of(b)
    assert len(ra) == len(rb) == 2 and not {id(x) for x in ra} & {id(x) for x in rb}
    ids = tokens(VOCAB)
    _, routes = _record(a, ids)
    with replaying(a, routes):  # b routes by itself meanwhile
        assert all(r.router_replay_action is None for r in rb)


def test_replay_of_the_engines_routes_gives_the_engines_log_probs_fp32(folder: Path) -> None:
    """The transformers engine's captured routes, replayed in the megatron actor (fp32 both): r_d = 1."""
    arch = folder_arch(folder)
    gpt = megatron_model(folder)
    eng = HFEngine(arch, dtype="float32", seed=0, capture_routes=True)
    eng.load_weights(megatron_to_hf(gpt.state_dict(), arch), version=0)  # what weight sync sends
    tok = HFTokenizer.from_folder(folder)
    eps = [Episode.start(f"t{i}", "g", CountingEnv(tok), random.Random(i)) for i in range(3)]
    eng.generate(eps, max_new_tokens=12)
    for e in eps:
        t = e.to_trajectory()
        assert t.routes is not None
        ids = torch.tensor([t.tokens])
        routes = torch.from_numpy(t.routes.latest(len(t.tokens))[None].astype(np.int16))
        with torch.no_grad():
            logp = token_logprobs(gpt, ids, routes=routes)[0]
        mask = torch.tensor(t.loss_mask)
        mu = torch.tensor(t.logp_mu)
        assert int(mask.sum()) > 5 and (logp[mask] - mu[mask]).abs().max() < 1e-5
