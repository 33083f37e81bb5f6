"""logp_mu is the log-prob of the sampled token under the engine's own (temperature-scaled) policy."""

import random
from collections.abc import Callable

import pytest
import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.rollout.envs import get_task, make_env
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model, load_hf_state_dict
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus

Weights = Callable[[int], dict[str, torch.Tensor]]


def full_forward_logp(
    arch: LlamaArch, weights: dict[str, torch.Tensor], t: Trajectory, temperature: float
) -> torch.Tensor:
    """fp32 log-probs of every token of ``t`` from one full forward (no cache, no padding) -> [T-1]."""
    model = build_model(arch)
    load_hf_state_dict(model, weights)
    ids = torch.tensor([t.tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()  # [T-1, V], position t-1 predicts token t
    return torch.log_softmax(logits / temperature, dim=-1).gather(1, ids[0, 1:, None]).squeeze(1)


def run(
    arch: LlamaArch,
    weights: Weights,
    env_cls: type,
    dtype: str,
    temperature: float,
    n: int = 12,
    fp32_head: bool = False,
) -> list[Trajectory]:
    eng = HFEngine(arch, dtype=dtype, seed=0, fp32_head=fp32_head)
    eng.load_weights(weights(0), version=0)
    rng = random.Random(0)
    eps = [Episode.start(f"t{i}", "g", env_cls(every=4, turns=2), rng) for i in range(n)]
    eng.generate(eps, max_new_tokens=24, temperature=temperature)
    return [e.to_trajectory() for e in eps]


def test_fp32_logp_mu_equals_full_forward(arch: LlamaArch, weights: Weights, script_env: type) -> None:
    trajs = run(arch, weights, script_env, "float32", temperature=0.7)
    assert len({t.prompt_len for t in trajs}) > 1  # variable prompts: the batch was left-padded
    worst = 0.0
    for t in trajs:
        ref = full_forward_logp(arch, weights(0), t, temperature=0.7)
        sampled = torch.tensor(t.loss_mask[1:])
        mu = torch.tensor(t.logp_mu[1:])
        worst = max(worst, (mu[sampled] - ref[sampled]).abs().max().item())
    assert worst < 2e-5  # cache path vs full forward in fp32: kernel noise only (measured here: max 2.4e-6)


def bf16_deltas(arch: LlamaArch, weights: Weights, env_cls: type, fp32_head: bool) -> torch.Tensor:
    """|logp_mu (bf16 engine) - logp (fp32 full forward)| over the sampled tokens of 24 episodes."""
    deltas = []
    for t in run(arch, weights, env_cls, "bfloat16", temperature=1.0, n=24, fp32_head=fp32_head):
        ref = full_forward_logp(arch, weights(0), t, temperature=1.0)
        sampled = torch.tensor(t.loss_mask[1:])
        deltas.append((torch.tensor(t.logp_mu[1:])[sampled] - ref[sampled]).abs())
    return torch.cat(deltas)


def test_bf16_logp_mu_is_close_to_fp32(arch: LlamaArch, weights: Weights, script_env: type) -> None:
    d = bf16_deltas(arch, weights, script_env, fp32_head=False)
    assert d.max() > 0  # bf16 really differs from fp32 ...
    assert d.mean() < 0.02 and d.max() < 0.2  # ... but only by rounding
    head = bf16_deltas(arch, weights, script_env, fp32_head=True)
    assert head.mean() < d.mean() / 2  # fp32 final norm + LM head: much closer to the fp32 actor


def test_fp32_head_is_exact_in_fp32(arch: LlamaArch, weights: Weights, script_env: type) -> None:
    trajs = run(arch, weights, script_env, "float32", temperature=0.7, fp32_head=True)
    for t in trajs:
        ref = full_forward_logp(arch, weights(0), t, temperature=0.7)
        sampled = torch.tensor(t.loss_mask[1:])
        assert (torch.tensor(t.logp_mu[1:])[sampled] - ref[sampled]).abs().max() < 2e-5


def test_env_tokens_are_forced_unversioned_and_turns_count(
    arch: LlamaArch, weights: Weights, script_env: type
) -> None:
    for t in run(arch, weights, script_env, "float32", temperature=1.0):
        P = t.prompt_len
        assert t.versions[:P] == [NO_VERSION] * P and not any(t.loss_mask[:P])
        forced = [i for i in range(P, len(t.tokens)) if not t.loss_mask[i]]
        for i in forced:
            assert (t.versions[i], t.logp_mu[i], t.turn_ids[i]) == (NO_VERSION, 0.0, -1)
        for i in range(P, len(t.tokens)):
            if t.loss_mask[i]:
                assert t.versions[i] == 0 and t.logp_mu[i] < 0.0
        # ScriptEnv answers after every 4 agent tokens with 3 tokens: turns 0,0,0,0,-1,-1,-1,1,1,1,1,...
        agent_turns = [k for k in t.turn_ids[P:] if k >= 0]
        assert agent_turns[:9] == [0, 0, 0, 0, 1, 1, 1, 1, 2][: len(agent_turns[:9])]
        if t.status is TrajectoryStatus.FINISHED:
            assert t.success and len(t.tokens) - P == 4 + 3 + 4 + 3 + 1
        else:
            assert t.status is TrajectoryStatus.TRUNCATED and len(t.tokens) - P == 24


@pytest.mark.parametrize("task", ["calculator", "chain-calculator", "arithmetic"])
def test_engine_rewards_match_the_task_verdict(arch: LlamaArch, weights: Weights, task: str) -> None:
    eng = HFEngine(arch, dtype="float32", seed=1)
    eng.load_weights(weights(1), version=3)
    rng = random.Random(1)
    eps = [Episode.start(f"t{i}", "g", make_env(task), rng) for i in range(16)]
    eng.generate(eps, max_new_tokens=20)
    for e in eps:
        t = e.to_trajectory()
        ep = get_task(task).rescore(t.tokens, t.loss_mask, t.prompt_len)  # re-checks forced tokens too
        assert (ep.reward, ep.success) == (t.reward, t.success)
        assert ep.done == (t.status is TrajectoryStatus.FINISHED)
        assert set(t.sampled_versions) <= {3}
