"""Pre-scored exact old logits (dedicated, interruptSync): carried by trajectories into the batch,
completed by the actor for its own version, never silently replaced for an unscored older token."""

import math

import pytest
import torch

from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.driver.loop.grpo_batch import assemble_batch
from asyncrl.trainer.oldlogits import PrecomputedProvider, UnscoredTokensError, make_provider
from asyncrl.trainer.oldlogits.registry import ProviderSettings


def _traj(tid: str, versions: list[int], reward: float = 1.0) -> Trajectory:
    n = 2 + len(versions)
    return Trajectory(
        traj_id=tid, group_id="g", task="t", tokens=list(range(n)), prompt_len=2,
        loss_mask=[False, False] + [True] * len(versions), versions=[-1, -1, *versions],
        logp_mu=[0.0, 0.0] + [-0.5] * len(versions), turn_ids=[-1, -1] + [0] * len(versions), reward=reward,
    )


def test_scores_travel_from_trajectory_to_batch_numpy_and_back() -> None:
    a, b = _traj("a", [3, 3, 4]), _traj("b", [4, 4], reward=0.0)
    a.set_logp_old(a.unscored(version=3), [-1.0, -2.0])
    assert a.unscored() == [4] and a.unscored(version=3) == []
    batch = assemble_batch([[a, b]], pad_id=0)
    assert batch.logp_old is not None
    assert batch.logp_old[0, 2:4].tolist() == [-1.0, -2.0]
    assert math.isnan(float(batch.logp_old[0, 4])) and torch.isnan(batch.logp_old[1]).all()
    back = TrainBatch.from_numpy(batch.to_numpy())
    assert torch.equal(torch.isnan(back.logp_old), torch.isnan(batch.logp_old))  # type: ignore[arg-type]
    # No strategy pre-scores: the field stays absent end to end.
    plain = assemble_batch([[_traj("c", [1])]], pad_id=0)
    assert plain.logp_old is None and "logp_old" not in plain.to_numpy()
    assert TrainBatch.from_numpy(plain.to_numpy()).logp_old is None


def test_set_logp_old_refuses_a_token_that_was_not_sampled() -> None:
    t = _traj("a", [1])
    with pytest.raises(ValueError, match="position 0 is not a sampled token"):
        t.set_logp_old([0], [-1.0])


def test_actor_fills_only_its_own_version_and_refuses_unscored_older_tokens() -> None:
    a = _traj("a", [3, 3, 4])
    a.set_logp_old([2, 3], [-1.0, -2.0])
    batch = assemble_batch([[a]], pad_id=0)
    theta = torch.full(batch.shape, -7.0)
    for key in ("dedicated", "interruptSync"):
        p = make_provider("exact", ProviderSettings(old_logits=_strategy(key)))
        assert isinstance(p, PrecomputedProvider)
        ref = p.logp_ref(batch, theta, actor_version=4, scored=p.score(batch, None))  # type: ignore[arg-type]
        assert ref[0].tolist() == [0.0, 0.0, -1.0, -2.0, -7.0]
        # At version 5 the token of version 4 is older than the actor and unscored: refused, named.
        with pytest.raises(UnscoredTokensError, match=r"1 trained tokens of versions \[4\]"):
            p.logp_ref(batch, theta, actor_version=5, scored=None)


def _strategy(key: str):  # noqa: ANN202 -- an OldLogitsSpec
    from asyncrl.api.old_logits import OldLogitsSpec, OldLogitStrategy

    # model_construct: this test is about the provider, whatever validation accepts today
    return OldLogitsSpec.model_construct(strategy=OldLogitStrategy(key))
