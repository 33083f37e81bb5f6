"""GRPO advantages and batch assembly: groups of trajectories -> padded ``[B, T]`` tensors.

Advantage (DeepSeekMath GRPO, with the group mean as baseline):

    A_i = r_i - mean_{j in group(i)} r_j                      (normalize_std = False)
    A_i = (r_i - mean_j r_j) / (std_j r_j + eps)              (normalize_std = True)

``std`` is the population standard deviation of the group's rewards (``unbiased=False``), so a
group of identical rewards has ``A = 0`` either way and contributes no gradient. The measured
recipe for this task (measured on the embedded model and tasks) uses the plain difference: dividing by a small std inflates
the advantage of nearly-solved groups and did not help. A sequence's advantage is broadcast to
all its tokens; ``loss_mask`` decides which of them count.

Rewards and advantages are float64 here: a float32 reward of 1e300 is inf, and ``inf - inf`` a NaN advantage
that poisons the whole batch's loss. Trajectories the actor must not see are refused before a batch is built
(:func:`refuse_unusable`): a reward outside ``spec.task.endpoint.maxRewardMagnitude`` (the same bound the agent
endpoint enforces; built-in rewards are in [0, 1]) and a trajectory longer than the actor's context.

Pure functions: tensors and plain records in, tensors out; torch only.
"""

import math
from collections import Counter
from collections.abc import Sequence
from typing import Literal

import torch

from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.driver.loop.route_batch import route_fields


def grpo_advantages(
    rewards: torch.Tensor, group_index: torch.Tensor, normalize_std: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """Group-baseline advantages.

    Args:
        rewards: ``[N]`` float rewards, one per trajectory.
        group_index: ``[N]`` int64 group of each trajectory, values in ``[0, G)``.
        normalize_std: also divide by the group's reward std (population std, plus ``eps``).
        eps: added to the std so that single-sample and uniform groups stay finite.

    Returns:
        ``[N]`` advantages (float64; ``ValueError`` when one is not finite).
    """
    if rewards.dim() != 1 or rewards.shape != group_index.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} must both be [N]"
        )
    rewards = rewards.to(torch.float64)
    n_groups = int(group_index.max().item()) + 1 if group_index.numel() else 0
    zeros = torch.zeros(n_groups, dtype=torch.float64)
    count = zeros.clone().index_add_(0, group_index, torch.ones_like(rewards))
    mean = zeros.clone().index_add_(0, group_index, rewards) / count.clamp(min=1)
    centred = rewards - mean[group_index]
    if normalize_std:
        var = zeros.clone().index_add_(0, group_index, centred.square()) / count.clamp(min=1)
        centred = centred / (var.sqrt()[group_index] + eps)
    bad = ~torch.isfinite(centred)
    if bad.any():
        i = int(bad.nonzero()[0].item())
        raise ValueError(f"advantage of row {i} is {float(centred[i])!r} (its reward {float(rewards[i])!r}): a "
                         "non-finite advantage never reaches the actor; refuse such rewards first (refuse_unusable)")
    return centred


def assemble_batch(
    groups: Sequence[Sequence[Trajectory]], pad_id: int, normalize_std: bool = False
) -> TrainBatch:
    """Flatten groups (in order) into one right-padded :class:`TrainBatch` with GRPO advantages.

    Row ``b`` is the ``b``-th trajectory of the flattened groups (its reward: ``trajectory.reward``).

    Raises:
        ValueError: a trajectory trains on a token without a version, or on a prompt token.
    """
    trajs = [t for g in groups for t in g]
    if not trajs:
        raise ValueError("assemble_batch needs at least one trajectory")
    B, T = len(trajs), max(len(t.tokens) for t in trajs)
    group_index = torch.tensor([gi for gi, g in enumerate(groups) for _ in g], dtype=torch.int64)
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    adv = grpo_advantages(rewards, group_index, normalize_std).to(torch.float32)  # |A| <= 2 maxRewardMagnitude

    tokens = torch.full((B, T), pad_id, dtype=torch.int64)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    logp_mu = torch.zeros(B, T, dtype=torch.float32)
    versions = torch.full((B, T), NO_VERSION, dtype=torch.int64)
    turn_ids = torch.full((B, T), -1, dtype=torch.int64)
    scored = any(t.logp_old is not None for t in trajs)
    logp_old = torch.full((B, T), torch.nan, dtype=torch.float32) if scored else None
    attention_mask = torch.zeros(B, T, dtype=torch.bool)  # True = a real (non-padding) token
    for b, t in enumerate(trajs):
        n = len(t.tokens)
        tokens[b, :n] = torch.tensor(t.tokens, dtype=torch.int64)
        loss_mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.bool)
        logp_mu[b, :n] = torch.tensor(t.logp_mu, dtype=torch.float32)
        versions[b, :n] = torch.tensor(t.versions, dtype=torch.int64)
        turn_ids[b, :n] = torch.tensor(t.turn_ids, dtype=torch.int64)
        if logp_old is not None and t.logp_old is not None:
            logp_old[b, :n] = torch.tensor(t.logp_old, dtype=torch.float32)
        attention_mask[b, :n] = True
    # Why check here: a trained token without a version would make its staleness unknowable
    # (docs/architecture.md, the path of one token), and a trained prompt token has no logp_mu to correct against.
    bad = loss_mask & (versions == NO_VERSION)
    if bad.any():
        b = int(bad.any(dim=1).nonzero()[0].item())
        raise ValueError(f"trajectory {trajs[b].traj_id} trains on tokens without a version (loss_mask True, version -1)")
    if any(any(t.loss_mask[: t.prompt_len]) for t in trajs):
        raise ValueError("a trajectory has loss_mask True inside its prompt")
    turn_ids = torch.where(loss_mask, turn_ids, torch.full_like(turn_ids, -1))
    advantages = adv[:, None].expand(B, T) * attention_mask  # 0 on padding
    return TrainBatch(tokens, loss_mask, logp_mu, versions, advantages.contiguous(), turn_ids, logp_old,
                      **route_fields(trajs, T))  # routing replay: none unless the engine captured routes


Unusable = Literal["reward_out_of_range", "over_length"]


def unusable(t: Trajectory, *, max_reward: float, context: int) -> Unusable | None:
    """Why the actor must not train on ``t`` (None: it may): its reward is not finite or over ``max_reward`` in
    magnitude, or it is longer than ``context`` tokens (0: unchecked)."""
    if not (math.isfinite(t.reward) and abs(t.reward) <= max_reward):
        return "reward_out_of_range"
    if context and len(t.tokens) > context:
        return "over_length"
    return None


def refuse_unusable(trajs: Sequence[Trajectory], *, max_reward: float, context: int) -> Counter[Unusable]:
    """Turn every unusable trajectory of ``trajs`` (:func:`unusable`) ABORTED in place, reward 0 and unsuccessful,
    so that it never enters a batch, ``reward_mean``, success or ``reward_sum``; returns how many, by reason."""
    refused: Counter[Unusable] = Counter()
    for t in trajs:
        if t.status is TrajectoryStatus.ABORTED:
            continue
        why = unusable(t, max_reward=max_reward, context=context)
        if why is not None:
            refused[why] += 1
            t.info["end_reason"] = f"refused by the trainer: {why} (reward {t.reward!r}, {len(t.tokens)} tokens)"
            t.status, t.reward, t.success = TrajectoryStatus.ABORTED, 0.0, False
    return refused


def token_staleness(versions: torch.Tensor, loss_mask: torch.Tensor, actor_version: int) -> torch.Tensor:
    """Per-token version gaps of the trained tokens.

    Args:
        versions: ``[B, T]`` int64 token versions.
        loss_mask: ``[B, T]`` bool, True = trained token.
        actor_version: the version of the weights the batch trains.

    Returns:
        ``[K]`` int64 gaps ``actor_version - versions`` of the ``K`` trained tokens.
    """
    if versions.shape != loss_mask.shape:
        raise ValueError(f"versions {tuple(versions.shape)} and loss_mask {tuple(loss_mask.shape)} must match")
    return actor_version - versions[loss_mask]
