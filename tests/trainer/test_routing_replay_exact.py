"""Routing replay (R3) with exact old logits (snapshot in the actor; the SegmentScorer of dedicated and
interruptSync): each segment of a trajectory spanning three versions (W = 2) is
scored under its own version's weights *and* the prefix routes that version sampled it through (re-prefills
included); under fp32 rollout r_d = 1 within 1e-5; the live audit's exact forwards replay the same routes. Also:
the replayed training step, its flip count, and R2."""

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.tokenizer import HFTokenizer
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.driver.loop.grpo_batch import assemble_batch
from asyncrl.trainer.oldlogits.audit import Auditor
from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings, SegmentScorer
from tests.support.hf_models import CountingEnv, folder_arch, tiny_folder

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py
VOCAB = 266


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("replay_exact"), "qwen3_moe")


def _actor_spec(folder: Path, correction: dict, old_logits: dict | None = None, lr: float = 3e-2) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate({
        "model": {"weights": str(folder), "rolloutDtype": "float32"},
        "correction": correction,
        **({"oldLogits": old_logits} if old_logits else {}),
        "async": {"maxStaleness": 2, "partialRollout": True},
        "train": {"learningRate": lr, "seed": 3},
    })


def _actor(folder: Path, correction: dict, old_logits: dict | None = None, lr: float = 3e-2) -> MegatronActor:
    return MegatronActor.from_spec(_actor_spec(folder, correction, old_logits, lr), VOCAB,
                                   num_threads=torch.get_num_threads())


def _generate(folder: Path, weights: list[dict], n: int, seed: int, switch_at: tuple[int, ...] = ()) -> list:
    """``n`` episodes from version 0; at agent token ``switch_at[i]`` of episode 0, version ``i + 1`` arrives."""
    eng = HFEngine(folder_arch(folder), dtype="float32", seed=seed, capture_routes=True)
    eng.load_weights(weights[0], version=0)

    def hook(seen: int) -> None:
        for i, at in enumerate(switch_at):
            if seen == at:
                eng.update_weights(weights[i + 1], version=i + 1)

    class Env(CountingEnv):
        def step(self, turn_text):  # noqa: ANN001, ANN202
            if self.hooked:
                hook(self.seen + 1)
            return super().step(turn_text)

    tok = HFTokenizer.from_folder(folder)
    eps = []
    for i in range(n):
        env = Env(tok, every=5, turns=3)
        env.hooked = i == 0
        eps.append(Episode.start(f"t{i}", "g", env, random.Random(seed * 100 + i)))
    eng.generate(eps, max_new_tokens=24, partial_rollout=True)
    trajs = [e.to_trajectory() for e in eps]
    for i, t in enumerate(trajs):  # one GRPO group with rewards 1, 0, 1, 0: nonzero advantages
        t.reward = float(i % 2 == 0)
    return [trajs]


@pytest.mark.slow  # three rollouts and two training steps of the tiny MoE: ~60 s on a loaded 2-core machine
def test_snapshot_scores_each_segment_with_its_versions_routes(folder: Path) -> None:
    # a large step, so that each version routes some prefix positions differently from the next
    actor = _actor(folder, {"reference": "exact", "routingReplay": "rollout"}, {"strategy": "snapshot"}, lr=0.3)
    weights = [actor.hf_state_dict()]
    for step in range(2):  # versions 1 and 2, trained on the actor's own rollouts
        batch = assemble_batch(_generate(folder, weights[-1:], 4, seed=step + 1), pad_id=0)
        actor.train_step(batch)
        weights.append(actor.hf_state_dict())
    assert actor.version == 2
    groups = _generate(folder, weights, 4, seed=9, switch_at=(4, 9))
    trajs = groups[0]
    assert all(set(t.sampled_versions) == {0, 1, 2} for t in trajs)  # every trajectory spans three versions
    assert all(list(t.routes.blocks) == [0, 1, 2] for t in trajs)
    batch = assemble_batch(groups, pad_id=0)
    logp_old = actor.old_logits.score(batch, actor)
    m = batch.loss_mask
    err = (logp_old[m] - batch.logp_mu[m]).abs().max()
    assert err < 1e-5, f"max |log r_d| {err:.2e}"
    # control: the newest routes for every segment (what a single-route replay would do) are not exact
    # wherever an older version routed a prefix position differently
    stale = batch.route_slots.clone()
    stale[:] = batch.routes[:, None]
    wrong = actor.old_logits.score(dataclasses.replace(batch, route_slots=stale), actor)
    moved = 0  # positions a version's tokens attended through that the newest version routed differently
    for b in range(batch.shape[0]):
        for s, v in enumerate(batch.route_slot_versions[b].tolist()):
            last = int((m[b] & (batch.versions[b] == v)).nonzero().max())  # its last token's logit: position last-1
            moved += int((batch.route_slots[b, s, :last] != stale[b, s, :last]).any(-1).any(-1).sum())
    print(f"positions routed differently by an older version: {moved}; max |log r_d| {err:.2e} exact, "
          f"{(wrong[m] - batch.logp_mu[m]).abs().max():.2e} with the newest routes")
    assert moved > 0 and (wrong[m] - batch.logp_mu[m]).abs().max() > 1e-4
    # the live audit of a cheap reference scores its rows exactly the same way, replaying each version's slot: given
    # the stale slots, its pi_old is the snapshot strategy's (before, its routers chose: pi_old = mu here, 9.7 away)
    auditor = Auditor(1, 1.0, seed=0, capacity=3)
    auditor.store = actor.old_logits.store
    correction = _actor_spec(folder, {"reference": "current", "routingReplay": "rollout"}).correction
    audited = auditor.run(dataclasses.replace(batch, route_slots=stale), actor, 2, wrong, wrong, correction)
    assert audited.rows == batch.shape[0] and audited.tokens == int(m.sum()), audited
    assert audited.abs_diff_p99 < 1e-5 and audited.abs_diff_mean < 1e-6, audited
    # dedicated and interruptSync score with a SegmentScorer outside the actor: whole trajectories (the
    # rollout host's interrupt-sync window) and (tokens, positions, routes) segments (a dedicated request)
    scorer = SegmentScorer(ScorerSettings(arch=folder_arch(folder), device="cpu"))
    worst = 0.0
    for v in (0, 1, 2):
        scorer.load(weights[v], version=v)
        for t, (positions, values) in zip(trajs, scorer.score(trajs, v), strict=True):
            mu = torch.tensor([t.logp_mu[p] for p in positions])
            worst = max(worst, float((torch.tensor(values) - mu).abs().max()))
        segs = [(t.tokens, t.unscored(v), t.routes.for_version(v)) for t in trajs]
        for (_, positions, _), values, t in zip(segs, scorer.score_segments(segs), trajs, strict=True):
            mu = torch.tensor([t.logp_mu[p] for p in positions])
            worst = max(worst, float((torch.tensor(values) - mu).abs().max()))
    assert worst < 1e-5, f"segment scorer: max |log r_d| {worst:.2e}"


def test_r3_training_step_replays_and_counts_flips(folder: Path) -> None:
    actor = _actor(folder, {"reference": "current", "routingReplay": "rollout"})
    batch = assemble_batch(_generate(folder, [actor.hf_state_dict()], 4, seed=5), pad_id=0)
    assert batch.routes is not None and batch.routes.dtype == torch.uint8
    report = actor.train_step(batch)
    assert report.route_tokens == float(batch.loss_mask.sum())
    assert report.route_flips == 0.0  # fp32 rollout, the same weights: the actor's router agrees everywhere
    assert actor.version == 1


def test_r2_records_routes_in_the_reference_forward(folder: Path) -> None:
    from asyncrl.trainer.actor.route_replay import old_logit_routes

    for reference in ("current", "ewma"):
        actor = _actor(folder, {"reference": reference, "routingReplay": "oldLogits"})
        groups = _generate(folder, [actor.hf_state_dict()], 4, seed=6)
        batch = assemble_batch(groups, pad_id=0)
        recorded = old_logit_routes(actor, batch)
        # the reference weights at arrival are the rollout's (version 0, fp32): the routes the engine captured,
        # on every position that was fed (all but each row's last token)
        for b, t in enumerate(groups[0]):
            n = len(t.tokens) - 1
            got, want = recorded.routes[b, :n].long(), batch.routes[b, :n].long()
            assert torch.equal(got.sort(-1).values, want.sort(-1).values)
        report = actor.train_step(batch)
        assert report.route_tokens == float(batch.loss_mask.sum()) and actor.version == 1
