"""The update step (issue 10): minibatches, PPO epochs, micro-batches with gradient accumulation, one version
per batch, a reference held from the batch's arrival, and the EWMA reset on the in-bounds ratio."""

import dataclasses
import math
from typing import Any

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.actor.update_plan import (
    in_bounds_ratio,
    micro_batches,
    select_rows,
    sum_stats,
    update_rows,
)
from asyncrl.trainer.correction import correction_loss
from asyncrl.trainer.correction.stats import CorrectionStats

VOCAB = 40
B, T, PROMPT = 6, 14, 4
REFERENCES = ["behavior", "current", "linear", "loglinear", "ewma", "exact/snapshot", "exact/dedicated"]


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _spec(reference: str = "behavior", correction: dict[str, Any] | None = None, **train: Any) -> AsyncRLJobSpec:
    ref, _, strategy = reference.partition("/")
    doc: dict[str, Any] = {
        "correction": {"reference": ref, **(correction or {})},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "task": {"temperature": 1.0, "groupSize": 2},
        "train": {"learningRate": 3e-2, "seed": 3, "promptsPerStep": 3, **train},
    }
    if strategy:
        doc["oldLogits"] = {"strategy": strategy}
    return AsyncRLJobSpec.model_validate(doc)


def _actor(reference: str = "behavior", correction: dict[str, Any] | None = None, **train: Any) -> MegatronActor:
    return MegatronActor.from_spec(_spec(reference, correction, **train), VOCAB, num_threads=torch.get_num_threads())


def _batch(actor: MegatronActor, *, seed: int = 0, noise: float = 0.05) -> TrainBatch:
    """Tokens sampled by the actor's own version; logp_mu = its logp + noise (a fake discrepancy)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    loss_mask[0, -3:] = False  # a shorter (right-padded) trajectory
    logp_mu = (actor.logprobs(tokens) + noise * torch.randn(B, T, generator=g)) * loss_mask
    versions = torch.where(loss_mask, torch.full((B, T), actor.version), torch.full((B, T), -1))
    advantages = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    turn_ids = torch.where(loss_mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -1))
    return TrainBatch(tokens, loss_mask, logp_mu, versions, advantages, turn_ids)


def _params(actor: MegatronActor) -> list[torch.Tensor]:
    return [p.detach().clone() for p in actor._params]


class _Calls:
    """Wraps the real correction_loss and keeps what each call (one micro-batch) saw."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, nan_on: tuple[int, ...] = ()) -> None:
        import asyncrl.trainer.correction as correction

        self.calls: list[dict[str, Any]] = []
        self.nan_on = nan_on
        monkeypatch.setattr(correction, "correction_loss", self)

    def __call__(self, logp_theta: torch.Tensor, logp_ref: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = correction_loss(logp_theta, logp_ref, *args, **kwargs)
        self.calls.append({"theta": logp_theta.detach().clone(), "ref": logp_ref.detach().clone(),
                           "stats": result.metrics.to_floats()})
        if len(self.calls) - 1 in self.nan_on:  # a fault injected into this call's loss value
            return dataclasses.replace(result, loss=result.loss * math.nan)
        return result


# ---------------------------------------------------------------- the plan (pure)
def test_update_rows_counts_cover_and_determinism() -> None:
    plan = update_rows(12, minibatches=3, epochs=2, seed=5, version=7)
    assert len(plan) == 6 and [len(r) for r in plan] == [4] * 6
    for epoch in (plan[:3], plan[3:]):  # every epoch trains every row exactly once
        assert sorted(torch.cat(epoch).tolist()) == list(range(12))
    assert [r.tolist() for r in plan] == [r.tolist() for r in update_rows(12, minibatches=3, epochs=2, seed=5, version=7)]
    assert [r.tolist() for r in plan[:3]] != [r.tolist() for r in plan[3:]]  # reshuffled per epoch
    other = update_rows(12, minibatches=3, epochs=1, seed=5, version=8)
    assert [r.tolist() for r in other] != [r.tolist() for r in plan[:3]]  # and per version
    # One minibatch: batch order, no shuffle, every epoch the whole batch.
    assert [r.tolist() for r in update_rows(5, minibatches=1, epochs=3, seed=1, version=0)] == [list(range(5))] * 3
    # More minibatches than rows: one row each.
    assert [len(r) for r in update_rows(3, minibatches=8, epochs=1, seed=0, version=0)] == [1, 1, 1]
    # 7 rows in 3 minibatches: sizes 3, 2, 2 (tensor_split).
    assert sorted(len(r) for r in update_rows(7, minibatches=3, epochs=1, seed=0, version=0)) == [2, 2, 3]


def test_update_rows_keep_grpo_groups_together_when_they_fit() -> None:
    # 4 groups of 3 consecutive rows in 2 minibatches: each minibatch holds 2 whole groups.
    for rows in update_rows(12, minibatches=2, epochs=2, seed=0, version=3, group_size=3):
        groups = {int(r) // 3 for r in rows}
        assert len(rows) == 6 and sorted(rows.tolist()) == sorted(g * 3 + i for g in groups for i in range(3))
    # 4 groups in 6 minibatches: groups cannot stay whole, rows are split instead (6 x 2 rows).
    assert [len(r) for r in update_rows(12, minibatches=6, epochs=1, seed=0, version=3, group_size=3)] == [2] * 6


def test_micro_batches_split_by_the_token_budget() -> None:
    rows = torch.arange(7)
    assert [c.tolist() for c in micro_batches(rows, 10, 0)] == [list(range(7))]
    assert [len(c) for c in micro_batches(rows, 10, 30)] == [3, 3, 1]  # 30 // 10 = 3 rows per forward
    assert [len(c) for c in micro_batches(rows, 10, 5)] == [1] * 7  # a row is never split


def test_sum_stats_equals_one_call_over_all_rows() -> None:
    g = torch.Generator().manual_seed(0)
    theta, ref, mu = (torch.randn(B, T, generator=g) * 0.3 - 2.0 for _ in range(3))
    adv = torch.randn(B, generator=g)
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[2] = False  # a row without tokens: its call reports neutral extremes, which must not count
    spec = _spec().correction
    whole = correction_loss(theta, ref, mu, adv, mask, spec).metrics.to_floats()
    parts = [correction_loss(theta[r], ref[r], mu[r], adv[r], mask[r], spec).metrics for r in ([0, 1], [2], [3, 4, 5])]
    summed = sum_stats(parts).to_floats()
    for f in dataclasses.fields(CorrectionStats):
        assert math.isclose(getattr(summed, f.name), getattr(whole, f.name), rel_tol=1e-5, abs_tol=1e-5), f.name
    empty = sum_stats([parts[1]]).to_floats()
    assert empty.rd_min == empty.rs_max == 1.0 and in_bounds_ratio(empty) == 1.0
    # in-bounds ratio = 1 - (below + above) / valid, by hand on the whole batch:
    assert in_bounds_ratio(whole) == 1.0 - (whole.rd_below_tokens + whole.rd_above_tokens) / whole.valid_tokens


# ---------------------------------------------------------------- the actor
def test_one_version_per_batch_after_all_updates() -> None:
    actor = _actor("current", minibatches=3, epochs=2)
    before = _params(actor)
    m = actor.train_step(_batch(actor))
    assert (m.updates, m.updates_applied, m.updates_skipped, m.micro_batches) == (6, 6, 0, 6)
    assert m.applied and m.version == actor.version == 1
    assert all(not torch.equal(b, p) for b, p in zip(before, actor._params, strict=True))
    # Correction counts are summed over the updates: 2 epochs see every valid token twice.
    assert m.correction.valid_tokens == 2 * m.valid_tokens == 2 * (B * (T - PROMPT) - 3)
    assert math.isfinite(m.loss) and math.isfinite(m.loss_last) and m.grad_norm > 0 and m.grad_norm_last > 0
    assert actor.train_step(_batch(actor, seed=1)).version == 2


@pytest.mark.parametrize("aggregation", ["tokenMean", "sequenceMean"])
@pytest.mark.parametrize("reference", ["behavior", "current"])
def test_micro_batches_accumulate_to_the_gradient_of_one_forward(reference: str, aggregation: str) -> None:
    # The same weights and batch: all 6 rows in one forward vs one row per forward (budget T + 1 < 2T).
    correction = {"lossAggregation": aggregation}
    whole = _actor(reference, correction)
    split = _actor(reference, correction, microBatchTokens=T + 1)
    split.load_hf_state_dict(whole.hf_state_dict())
    batch = _batch(whole)
    batch = dataclasses.replace(batch, loss_mask=batch.loss_mask.clone())
    batch.loss_mask[3, PROMPT:] = False  # a row without tokens (sequenceMean: not a sequence of the mean)
    a, b = whole.train_step(batch), split.train_step(batch)
    assert (a.micro_batches, b.micro_batches) == (1, 6)
    assert math.isclose(a.loss, b.loss, rel_tol=1e-6) and math.isclose(a.grad_norm, b.grad_norm, rel_tol=1e-6)
    assert a.correction.record() == pytest.approx(b.correction.record(), rel=1e-6, abs=1e-6)
    # The update's gradient (main_grad keeps it after the step, scaled by the same clip): one forward's,
    # to fp32 summation order. The weights after AdamW are not compared: its first step divides each
    # gradient by its own magnitude, which turns a 1e-12 difference on a 1e-9 gradient into a visible one.
    for p, q in zip(whole._params, split._params, strict=True):
        torch.testing.assert_close(p.main_grad, q.main_grad, rtol=1e-5, atol=1e-8)


def test_one_update_costs_no_extra_forward_for_current(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncrl.trainer.actor.megatron_actor as actor_module

    forwards: list[int] = []
    real = actor_module.token_logprobs

    def counting(model: Any, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        forwards.append(tokens.shape[0])
        return real(model, tokens, **kwargs)

    single, several = _actor("current"), _actor("current", minibatches=2)
    b1, b2 = _batch(single), _batch(several)
    monkeypatch.setattr(actor_module, "token_logprobs", counting)
    single.train_step(b1)
    assert forwards == [B]  # the gradient forward only: its detached output is the reference
    forwards.clear()
    several.train_step(b2)
    # One no-grad forward at arrival, then a gradient forward per minibatch (3 groups of 2 rows: 4 + 2).
    assert forwards[0] == B and sorted(forwards[1:]) == [2, 4]


@pytest.mark.parametrize("reference", REFERENCES)
def test_reference_is_held_from_arrival_and_the_clip_acts_within_the_batch(
    monkeypatch: pytest.MonkeyPatch, reference: str
) -> None:
    actor = _actor(reference, minibatches=2, epochs=3)
    batch = _batch(actor)
    arrival = actor.logprobs(batch.tokens)  # [B, T] under the weights the batch meets
    plan = update_rows(B, minibatches=2, epochs=3, seed=3, version=0, group_size=2)
    calls = _Calls(monkeypatch)
    m = actor.train_step(batch)
    assert m.updates_applied == len(plan) == len(calls.calls) == 6 and m.version == 1
    first_seen: dict[int, torch.Tensor] = {}
    for rows, call in zip(plan, calls.calls, strict=True):
        for i, row in enumerate(rows.tolist()):
            seen = first_seen.setdefault(row, call["ref"][i])
            assert torch.equal(call["ref"][i], seen), f"row {row}: logp_ref changed between updates"
    assert sorted(first_seen) == list(range(B))
    held = torch.stack([first_seen[r] for r in range(B)])
    mask = batch.loss_mask
    if reference in ("current", "ewma", "exact/snapshot", "exact/dedicated"):
        # All tokens of the actor's own version, theta_prox = the weights at version 0: pi_ref = pi_theta at
        # arrival, bit for bit (for exact/dedicated the actor fills its own version from the arrival forward).
        torch.testing.assert_close(held[mask], arrival[mask], rtol=0.0, atol=0.0)
        first = calls.calls[0]["stats"]
        assert first.rs_min == first.rs_max == 1.0  # the first update meets the reference exactly
    later = [c["stats"] for c in calls.calls[2:]]  # the second and third epochs
    assert min(s.rs_min for s in later) < 1.0 < max(s.rs_max for s in later)  # r_s moved away from 1
    clipped = sum(s.clip_low_tokens + s.clip_high_tokens for s in later)
    assert clipped > 0, f"{reference}: the clip never acted within the batch"
    assert m.correction.clip_low_tokens + m.correction.clip_high_tokens >= clipped


def test_a_non_finite_update_is_skipped_and_the_batch_still_makes_one_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actor = _actor("current", minibatches=3)
    _Calls(monkeypatch, nan_on=(1,))  # the second update's loss is NaN
    m = actor.train_step(_batch(actor))
    assert (m.updates, m.updates_applied, m.updates_skipped) == (3, 2, 1)
    assert m.applied and m.version == 1 and m.nonfinite_loss_total == 1 and math.isfinite(m.loss)
    _Calls(monkeypatch, nan_on=(0, 1, 2))  # every update non-finite: no version, no new weights
    before = _params(actor)
    m = actor.train_step(_batch(actor, seed=1))
    assert not m.applied and m.version == 1 and m.updates_applied == 0 and m.nonfinite_loss_total == 1 + 3
    assert math.isnan(m.loss) and math.isnan(m.grad_norm)
    assert all(torch.equal(b, p) for b, p in zip(before, actor._params, strict=True))


def test_ewma_folds_in_once_per_version() -> None:
    actor = _actor("ewma", minibatches=3, epochs=2)
    for seed in range(3):
        actor.train_step(_batch(actor, seed=seed))
    ctl = actor.old_logits.controller  # type: ignore[attr-defined]
    # W = 2: beta = 0.5 per version; total weight after 3 versions 1 -> 1.5 -> 1.75 -> 1.875.
    assert ctl.step == actor.version == 3 and math.isclose(ctl.total_weight, 1.875, rel_tol=1e-12)


@pytest.mark.parametrize("mode", ["truncate", "none"])
def test_ewma_reset_fires_under_modes_that_reject_nothing(mode: str) -> None:
    # logp_mu 1.5 nats away from the actor (noise 1.5): most r_d outside [0.5, 2]. Nothing is rejected under
    # truncate or none (keep ratio 1), but the in-bounds ratio is low and the reset fires after k = 2 versions.
    correction = {"mask": {"mode": mode}, "ewma": {"reset": {"rule": "paper", "keepRatioBelow": 0.8, "consecutiveSteps": 2}}}
    actor = _actor("ewma", correction, minibatches=2)
    steps = [actor.train_step(_batch(actor, seed=s, noise=1.5)) for s in range(2)]
    for m in steps:
        assert m.correction.keep_ratio == 1.0 and m.in_bounds_ratio < 0.8
        assert m.in_bounds_ratio == pytest.approx(
            1 - (m.correction.rd_below_tokens + m.correction.rd_above_tokens) / m.correction.valid_tokens
        )
    assert [m.ewma_reset for m in steps] == [False, True] and steps[1].ewma_reset_reason == "keep_ratio_collapse"


def test_select_rows_keeps_every_field() -> None:
    actor = _actor()
    batch = _batch(actor)
    batch = dataclasses.replace(batch, logp_old=torch.full((B, T), -1.0))
    sub = select_rows(batch, torch.tensor([1, 4]))
    assert sub.shape == (2, T) and sub.logp_old is not None and torch.equal(sub.tokens, batch.tokens[[1, 4]])


@pytest.mark.parametrize("reference", ["current", "ewma", "exact/snapshot"])
def test_arrival_forwards_in_micro_batches_hold_the_same_reference(
    monkeypatch: pytest.MonkeyPatch, reference: str
) -> None:
    # microBatchTokens bounds the arrival forwards too (provider scoring, the no-grad logp_theta): the held
    # reference of every row is the one of a single forward, to fp32 batching noise.
    whole = _actor(reference, minibatches=2)
    split = _actor(reference, minibatches=2, microBatchTokens=T + 1)
    split.load_hf_state_dict(whole.hf_state_dict())
    batch = _batch(whole)
    held: list[torch.Tensor] = []
    for actor in (whole, split):
        calls = _Calls(monkeypatch)
        actor.train_step(batch)
        plan = update_rows(B, minibatches=2, epochs=1, seed=3, version=0, group_size=2)
        rows = torch.cat([c for r in plan for c in micro_batches(r, T, actor.settings.micro_batch_tokens)])
        ref = torch.empty(B, T)
        ref[rows] = torch.cat([c["ref"] for c in calls.calls])
        held.append(ref)
    assert len(calls.calls) == B  # one row per forward
    torch.testing.assert_close(held[0], held[1], rtol=1e-6, atol=1e-6)
