"""GRPO advantages and batch padding, with hand-derived values."""

import pytest
import torch

from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.driver.loop.grpo_batch import (
    assemble_batch,
    grpo_advantages,
    token_staleness,
)


def test_advantage_is_reward_minus_group_mean():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0 mean = 2/4 = 0.5 -> [0.5, -0.5, -0.5, 0.5]; group 1 all ones -> 0
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0], dtype=torch.float64)  # computed in float64
    torch.testing.assert_close(grpo_advantages(rewards, groups), expected, rtol=0, atol=0)


def test_std_normalisation_uses_population_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    # group 0: std = sqrt(mean([0.25]*4)) = 0.5 -> +-0.5 / (0.5 + 1e-6); group 1: 0 / (0 + eps) = 0
    got = grpo_advantages(rewards, groups, normalize_std=True)
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0, 0.0, 0.0], dtype=torch.float64) * (0.5 / (0.5 + 1e-6))
    torch.testing.assert_close(got, expected, rtol=1e-7, atol=0)


def test_vectorised_advantages_match_a_loop():
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(40, generator=g)
    groups = torch.randint(0, 5, (40,), generator=g)
    got = grpo_advantages(rewards, groups, normalize_std=True)
    for i in range(40):
        members = rewards[groups == groups[i]]
        ref = (rewards[i] - members.mean()) / (members.std(unbiased=False) + 1e-6)
        torch.testing.assert_close(got[i].float(), ref, rtol=1e-5, atol=1e-6)


def test_shape_errors_print_both_shapes():
    with pytest.raises(ValueError, match=r"rewards \(3,\) and group_index \(2,\)"):
        grpo_advantages(torch.zeros(3), torch.zeros(2, dtype=torch.int64))


def _traj(gid: str, i: int, agent: list[tuple[int, int, bool]], reward: float) -> Trajectory:
    """Prompt [1, 2]; then (token, version, sampled) triples; env tokens have version -1."""
    toks = [1, 2] + [a[0] for a in agent]
    vs = [-1, -1] + [a[1] for a in agent]
    mask = [False, False] + [a[2] for a in agent]
    return Trajectory(
        traj_id=f"{gid}-{i}", group_id=gid, task="t", tokens=toks, prompt_len=2, loss_mask=mask, versions=vs,
        logp_mu=[-0.5 if m else 0.0 for m in mask], turn_ids=[0 if m else -1 for m in mask], reward=reward,
    )


def test_batch_is_padded_and_aligned():
    a0 = _traj("a", 0, [(5, 3, True), (9, -1, False), (6, 4, True)], reward=1.0)
    a1 = _traj("a", 1, [(7, 4, True)], reward=0.0)
    b = assemble_batch([[a0, a1]], pad_id=0)
    assert b.tokens.tolist() == [[1, 2, 5, 9, 6], [1, 2, 7, 0, 0]]
    assert b.loss_mask.tolist() == [[False, False, True, False, True], [False, False, True, False, False]]
    assert b.versions.tolist() == [[-1, -1, 3, -1, 4], [-1, -1, 4, -1, -1]]
    assert b.turn_ids.tolist() == [[-1, -1, 0, -1, 0], [-1, -1, 0, -1, -1]]  # the trajectory's own name
    # rewards [1, 0], mean 0.5: advantages +0.5 / -0.5 over the real tokens, 0 on padding
    assert b.advantages.tolist() == [[0.5] * 5, [-0.5, -0.5, -0.5, 0.0, 0.0]]
    assert b.logp_mu[0].tolist() == [0.0, 0.0, -0.5, 0.0, -0.5]
    # environment tokens (version -1) are never trained
    assert not (b.loss_mask & (b.versions == -1)).any()
    assert token_staleness(b.versions, b.loss_mask, 4).tolist() == [1, 0, 0]


def test_a_trained_token_without_version_is_rejected():
    bad = _traj("a", 0, [(5, -1, True)], reward=1.0)
    with pytest.raises(ValueError, match="a-0 trains on tokens without a version"):
        assemble_batch([[bad]], pad_id=0)


def test_advantages_are_float64_so_a_float32_overflow_never_becomes_nan():
    # rewards of 1e300 are inf in float32, and inf - mean(inf, -inf) is NaN: the batch's loss and gradient norm with it
    # (issue 35: one 1e30 session per group gave loss -1.4e22 and a NaN gradient norm). In float64 the group
    # [1e300, -1e300] has mean 0 and advantages exactly +-1e300.
    rewards = torch.tensor([1e300, -1e300], dtype=torch.float64)
    adv = grpo_advantages(rewards, torch.tensor([0, 0]))
    assert adv.dtype == torch.float64 and adv.tolist() == [1e300, -1e300]
    assert torch.isnan(rewards.float() - rewards.float().mean()).any()  # what float32 made of them


def test_a_non_finite_advantage_is_refused_before_the_actor():
    with pytest.raises(ValueError, match="non-finite advantage never reaches the actor"):
        grpo_advantages(torch.tensor([float("inf"), 0.0], dtype=torch.float64), torch.tensor([0, 0]))


def test_out_of_range_rewards_and_over_length_trajectories_are_refused_and_counted():
    from asyncrl.rollout.trajectory import TrajectoryStatus
    from asyncrl.trainer.driver.loop.grpo_batch import refuse_unusable

    trajs = [_traj("g", i, [(3, 4, True)], r) for i, r in enumerate([1e30, float("nan"), 0.5, 1e6, -1e6 - 1])]
    long = _traj("g", 9, [(3, 4, True)], 0.25)
    long.tokens += [7] * 20  # 24 tokens against a context of 16 (its other fields are not read here)
    refused = refuse_unusable([*trajs, long], max_reward=1e6, context=16)
    assert refused == {"reward_out_of_range": 3, "over_length": 1}
    assert [t.status for t in trajs] == [TrajectoryStatus.ABORTED, TrajectoryStatus.ABORTED, TrajectoryStatus.FINISHED,
                                         TrajectoryStatus.FINISHED, TrajectoryStatus.ABORTED]  # |1e6| is in range
    assert long.status is TrajectoryStatus.ABORTED
    assert all(t.reward == 0.0 and not t.success for t in (*trajs[:2], trajs[4], long))  # never in reward_sum


def test_the_workers_endpoint_refusals_reach_the_drivers_counter_once_each():
    from prometheus_client import CollectorRegistry

    from asyncrl.rollout.agent.limits import REFUSAL_REASONS
    from asyncrl.trainer.driver.loop.accounting import count_refusals
    from asyncrl.trainer.driver.run.metrics import create_metrics

    m = create_metrics(CollectorRegistry())

    def total(reason: str) -> float:
        return m.registry.get_sample_value("asyncrl_agent_requests_refused_total", {"reason": reason}) or 0.0

    assert all(total(r) == 0.0 for r in REFUSAL_REASONS)  # pre-set: the series exist before the first refusal
    seen: dict[str, int] = {}
    count_refusals(m, seen, {"unauthorized": 5, "header_timeout": 1})
    count_refusals(m, seen, {"unauthorized": 7, "header_timeout": 1})  # a running count: +2 and +0
    count_refusals(m, seen, {"unauthorized": 3, "header_timeout": 0})  # a replaced worker, from 0 again: +3
    assert (total("unauthorized"), total("header_timeout")) == (5 + 2 + 3, 1.0)
