"""Snapshot ``pi_old`` equals the brute-force reference (a fresh model per version), with retention.

A schedule of steps on the real megatron actor (tiny arch, fp32, CPU): each batch holds partial
trajectories spanning one, two and three versions; before each step the driver's live set comes from
:func:`asyncrl.trainer.oldlogits.retention.live_versions` over the *next* batch's trajectories and
the generate calls in flight, and the store must hold exactly that set plus the new version. The
engine is perfect (``logp_mu`` = the brute-force ``pi_old``), so every token is kept and ``r_d = 1``.
"""

import dataclasses

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.oldlogits import MissingSnapshotError
from asyncrl.trainer.oldlogits.retention import live_versions
from tests.support.bruteforce import brute_force_logp_old, fresh_model_logprobs

VOCAB, T, PROMPT, W = 40, 16, 4, 2
# Per step (the version the batch meets), per row: the versions of its trained segments, in order.
SCHEDULE: dict[int, list[list[int]]] = {
    0: [[0], [0], [0], [0]],
    1: [[0, 1], [1], [0], [1]],  # row 0: a partial trajectory spanning two versions
    2: [[0, 1, 2], [1, 2], [2], [0]],  # row 0 spans three versions
    3: [[2, 3], [3], [2], [3]],  # versions 0 and 1 are no longer referenced after step 2
    4: [[2, 3, 4], [4], [3, 4], [4]],
}


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _actor() -> MegatronActor:
    spec = AsyncRLJobSpec.model_validate({
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "snapshot"},
        "async": {"maxStaleness": W},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "train": {"learningRate": 1e-2, "seed": 5},
    })
    return MegatronActor.from_spec(spec, VOCAB, num_threads=torch.get_num_threads())


def _versions(layout: list[list[int]]) -> torch.Tensor:
    """``[B, T]``: -1 on the prompt, then each row's segments in equal parts (the last takes the rest)."""
    out = torch.full((len(layout), T), NO_VERSION)
    for r, segments in enumerate(layout):
        n = (T - PROMPT) // len(segments)
        for i, v in enumerate(segments):
            out[r, PROMPT + i * n: T if i == len(segments) - 1 else PROMPT + (i + 1) * n] = v
    return out


def _batch(layout: list[list[int]], seed: int) -> TrainBatch:
    versions = _versions(layout)
    B = versions.shape[0]
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(seed))
    loss_mask = versions >= 0
    adv = torch.tensor([1.0, -1.0] * B)[:B, None].expand(B, T) * loss_mask
    return TrainBatch(tokens, loss_mask, torch.zeros(B, T), versions, adv, torch.where(loss_mask, 0, -1))


def _trajectories(batch: TrainBatch) -> list[list[Trajectory]]:
    """The batch's rows as the driver holds them before training (one group per row)."""
    out = []
    for r in range(batch.shape[0]):
        mask = batch.loss_mask[r].tolist()
        out.append([Trajectory(
            traj_id=f"t{r}", group_id=f"g{r}", task="calculator", tokens=batch.tokens[r].tolist(),
            prompt_len=PROMPT, loss_mask=mask, versions=batch.versions[r].tolist(),
            logp_mu=[0.0] * T, turn_ids=[0 if m else -1 for m in mask],
        )])
    return out


def test_snapshot_pi_old_equals_brute_force_while_retention_releases_versions() -> None:
    actor = _actor()
    weights: dict[int, dict[str, torch.Tensor]] = {}  # HF weights per version, as rollout received them
    batches = {c: _batch(layout, seed=100 + c) for c, layout in SCHEDULE.items()}
    per_version_bytes = sum(p.numel() * p.element_size() for p in actor.named_weights().values())
    for c, batch in batches.items():
        assert actor.version == c
        weights[c] = actor.hf_state_dict()
        expected = brute_force_logp_old(actor.settings.arch, weights, batch.tokens, batch.versions,
                                        batch.loss_mask, temperature=actor.settings.temperature)
        got = actor.old_logits.score(batch, actor)
        assert got is not None
        torch.testing.assert_close(got, expected, rtol=0.0, atol=1e-6)
        # The driver's live set after this step: the next batch's tokens and a generate call in flight
        # since the current version (its tokens may be of c or of c + 1 once the weights arrive).
        nxt = batches.get(c + 1)
        live = live_versions(_trajectories(nxt) if nxt else [], [c], c, W)
        m = actor.train_step(dataclasses.replace(batch, logp_mu=expected), live_versions=live)
        assert m.applied and m.correction.keep_ratio == 1.0
        assert abs(m.correction.rd_min - 1.0) < 1e-5 and abs(m.correction.rd_max - 1.0) < 1e-5, m
        resident = sorted(live | {c + 1})
        assert actor.old_logits.store.versions == resident, (c, live)
        assert (m.snapshot_resident_versions, m.snapshot_resident_bytes) == (len(resident), len(resident) * per_version_bytes)
    # After step 2 only versions 2 and 3 were live: fewer than W + 1 resident, and 0, 1 really gone.
    assert sorted(live_versions(_trajectories(batches[3]), [2], 2, W)) == [2, 3]
    with pytest.raises(MissingSnapshotError, match="version 1 was released"):
        actor.old_logits.score(_batch([[1]], seed=7), actor)


def test_functional_scoring_equals_a_fresh_model_per_version() -> None:
    actor = _actor()
    tokens = _batch(SCHEDULE[0], seed=3).tokens
    first = {n: p.detach().clone() for n, p in actor.named_weights().items()}
    hf0 = actor.hf_state_dict()
    batch = _batch(SCHEDULE[0], seed=4)
    actor.train_step(dataclasses.replace(batch, logp_mu=actor.logprobs(batch.tokens) * batch.loss_mask))
    assert actor.version == 1
    # Version 0 scored from the stored tensors while the live model holds version 1.
    got = actor.logprobs_under(first, tokens)
    want = fresh_model_logprobs(actor.settings.arch, hf0, tokens, temperature=actor.settings.temperature)
    torch.testing.assert_close(got, want, rtol=0.0, atol=1e-6)
    assert not torch.allclose(got, actor.logprobs(tokens))  # the live version really differs
