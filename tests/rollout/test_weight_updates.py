"""Weight updates that arrive while a batch is generating (partial rollout on/off)."""

import random
from collections.abc import Callable

import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model, load_hf_state_dict
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus

Weights = Callable[[int], dict[str, torch.Tensor]]


def logp_under(arch: LlamaArch, weights: dict[str, torch.Tensor], t: Trajectory) -> torch.Tensor:
    """fp32 full-forward log-prob of each token of ``t`` (index i = token i+1) -> [T-1]."""
    model = build_model(arch)
    load_hf_state_dict(model, weights)
    ids = torch.tensor([t.tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1)


def generate_with_update(
    arch: LlamaArch, weights: Weights, env_cls: type, partial: bool, updates: int = 1
) -> tuple[HFEngine, list[Trajectory]]:
    """8 episodes; after the 5th agent token of episode 0, ``updates`` weight updates arrive."""
    eng = HFEngine(arch, dtype="float32", seed=0)
    eng.load_weights(weights(0), version=0)

    def hook(seen: int) -> None:
        if seen == 5:  # called inside generate(): the update must wait for a token boundary
            for k in range(updates):
                eng.update_weights(weights(1 + k), version=1 + k)

    rng = random.Random(0)
    eps = [
        Episode.start(f"t{i}", "g", env_cls(every=4, turns=3, on_step=hook if i == 0 else None), rng)
        for i in range(8)
    ]
    eng.generate(eps, max_new_tokens=40, partial_rollout=partial)
    return eng, [e.to_trajectory() for e in eps]


def test_partial_rollout_switches_version_mid_trajectory(
    arch: LlamaArch, weights: Weights, script_env: type
) -> None:
    eng, trajs = generate_with_update(arch, weights, script_env, partial=True)
    assert eng.version == 1 and eng.counters.swaps_in_flight == 1
    assert eng.counters.prefills == 2  # batch start + re-prefill of every prefix under the new weights
    assert all(t.status is TrajectoryStatus.FINISHED for t in trajs)  # 22 tokens each, cap 40
    for t in trajs:
        vs = t.sampled_versions
        assert t.is_partial and vs == sorted(vs) and set(vs) == {0, 1}  # old prefix, then new version
        assert vs.count(0) == 5  # lock-step: every episode had sampled 5 tokens at the swap
        # each token's logp_mu is that of the version that sampled it: prefix mu kept, and the
        # continuation's cache really was recomputed under the new weights
        sampled = torch.tensor(t.loss_mask[1:])
        v = torch.tensor(t.versions[1:])
        mu = torch.tensor(t.logp_mu[1:])
        for version in (0, 1):
            sel = sampled & (v == version)
            ref = logp_under(arch, weights(version), t)
            assert (mu[sel] - ref[sel]).abs().max() < 2e-5


def test_no_partial_rollout_finishes_under_old_weights(
    arch: LlamaArch, weights: Weights, script_env: type
) -> None:
    eng, trajs = generate_with_update(arch, weights, script_env, partial=False)
    for t in trajs:
        assert not t.is_partial and set(t.sampled_versions) == {0}
    assert eng.version == 1 and eng.counters.swaps_in_flight == 0  # swapped after the batch
    eps = [Episode.start("n", "g", script_env(), random.Random(1))]
    eng.generate(eps, max_new_tokens=10)
    assert set(eps[0].to_trajectory().sampled_versions) == {1}


def test_newer_pending_update_supersedes_older(arch: LlamaArch, weights: Weights, script_env: type) -> None:
    eng, trajs = generate_with_update(arch, weights, script_env, partial=True, updates=2)
    assert eng.version == 2 and eng.counters.updates_superseded == 1
    assert all(set(t.sampled_versions) == {0, 2} for t in trajs)


def test_update_from_another_thread(arch: LlamaArch, weights: Weights, generate_in_background) -> None:
    eng = HFEngine(arch, dtype="float32", seed=0)
    eng.load_weights(weights(0), version=0)
    th, eps = generate_in_background(eng)
    eng.update_weights(weights(1), version=1)
    th.join(30)
    assert not th.is_alive() and eng.version == 1
    for e in eps:
        vs = e.to_trajectory().sampled_versions
        assert vs == sorted(vs) and vs[0] == 0
    assert any(e.to_trajectory().is_partial for e in eps)
