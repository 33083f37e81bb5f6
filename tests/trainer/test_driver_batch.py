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
