"""The megatron actor: references, non-finite handling, SFT, weight export, checkpoints."""

import dataclasses
import logging
import math
import os

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor

VOCAB = 40
B, T, PROMPT = 6, 14, 4


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _spec(reference: str, **train) -> AsyncRLJobSpec:
    doc = {
        # ewma: the paper's reset rule, named (the tests below count its resets whatever the spec's default)
        "correction": {"reference": reference, **({"ewma": {"reset": {"rule": "paper"}}} if reference == "ewma" else {})},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "task": {"temperature": 1.0},
        "train": {"learningRate": 1e-2, "seed": 3, **train},
    }
    return AsyncRLJobSpec.model_validate(doc)  # exact (snapshot) is tested in test_actor_snapshots.py


def _actor(reference: str = "behavior", **train) -> MegatronActor:
    return MegatronActor.from_spec(_spec(reference, **train), VOCAB, num_threads=torch.get_num_threads())


def _batch(actor: MegatronActor, *, seed: int = 0, noise: float = 0.05, version: int = 0) -> TrainBatch:
    """Prompt of PROMPT tokens, then sampled tokens; logp_mu = on-policy logp + noise (a fake
    train-inference discrepancy), advantages +1 / -1 by row."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    loss_mask[0, -3:] = False  # a shorter (right-padded) trajectory
    logp_mu = (actor.logprobs(tokens) + noise * torch.randn(B, T, generator=g)) * loss_mask
    versions = torch.where(loss_mask, torch.full((B, T), version), torch.full((B, T), -1))
    advantages = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    turn_ids = torch.where(loss_mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -1))
    return TrainBatch(tokens, loss_mask, logp_mu, versions, advantages, turn_ids)


def _params(actor: MegatronActor) -> list[torch.Tensor]:
    return [p.detach().clone() for p in actor._params]


def test_behavior_step_updates_weights_and_version() -> None:
    actor = _actor("behavior")
    batch = _batch(actor)
    before = _params(actor)
    m = actor.train_step(batch)
    assert m.applied and m.version == actor.version == 1 and m.reference == "behavior"
    assert m.valid_tokens == B * (T - PROMPT) - 3
    # behavior: pi_ref = mu, so r_d = 1 exactly and nothing is rejected by the discrepancy mask.
    assert m.correction.rd_min == m.correction.rd_max == 1.0
    assert m.correction.keep_ratio == 1.0
    assert all(not torch.equal(b, p) for b, p in zip(before, actor._params, strict=True))
    assert math.isfinite(m.correction.kl_k3) and m.audit is None  # typed: the driver flattens it for text


def test_current_reference_is_the_pre_step_forward() -> None:
    actor = _actor("current")
    batch = _batch(actor, noise=0.0)
    explicit = actor.logprobs(batch.tokens)  # an extra no-grad forward with the pre-step weights
    with_grad = actor._logprobs(batch.tokens, 1.0)
    assert torch.equal(with_grad.detach(), explicit)  # bit-identical: the detached forward is that reference
    # logp_mu was recorded by these very weights, so r_d = pi_ref / mu = 1 and r_s = 1.
    m = actor.train_step(batch)
    assert m.applied and m.correction.rd_max == pytest.approx(1.0, abs=1e-6)
    assert m.correction.rs_min == m.correction.rs_max == 1.0


class _Spy:
    """Wraps correction_loss and keeps the tensors of its last call."""

    def __init__(self, monkeypatch) -> None:
        import asyncrl.trainer.correction as correction

        self._real = correction.correction_loss
        self.calls: list[dict[str, torch.Tensor]] = []
        monkeypatch.setattr(correction, "correction_loss", self)

    def __call__(self, logp_theta, logp_ref, logp_mu, *args, **kwargs):
        self.calls.append(
            {"theta": logp_theta.detach().clone(), "ref": logp_ref.clone(), "mu": logp_mu.clone()}
        )
        return self._real(logp_theta, logp_ref, logp_mu, *args, **kwargs)


@pytest.mark.parametrize("reference", ["linear", "loglinear"])
def test_interpolated_reference_uses_token_versions_against_the_actor_version(monkeypatch, reference) -> None:
    actor = _actor(reference)
    for seed in (10, 11):  # two steps: the actor is at version 2
        actor.train_step(_batch(actor, seed=seed))
    batch = _batch(actor, seed=3)
    versions = batch.versions.clone()
    versions[:, PROMPT : PROMPT + 3] = 0  # gap 2 (actor version 2)
    versions[:, PROMPT + 3 : PROMPT + 6] = 1  # gap 1
    versions[:, PROMPT + 6 :] = 2  # gap 0
    versions[~batch.loss_mask] = -1
    batch = dataclasses.replace(batch, versions=versions)
    theta = actor.logprobs(batch.tokens)
    spy = _Spy(monkeypatch)
    assert actor.train_step(batch).reference == reference
    ref, mu = spy.calls[-1]["ref"], spy.calls[-1]["mu"]
    torch.testing.assert_close(spy.calls[-1]["theta"], theta, rtol=0.0, atol=0.0)
    b, t2, t1, t0 = 1, PROMPT, PROMPT + 3, PROMPT + 6
    # Behaviour weight alpha = 1 / (gap + 1): gap 0 -> mu exactly; gap 2 -> alpha = 1/3.
    assert ref[b, t0] == mu[b, t0]
    if reference == "loglinear":
        expected_gap2 = mu[b, t2] / 3 + 2 * theta[b, t2] / 3
        expected_gap1 = mu[b, t1] / 2 + theta[b, t1] / 2
    else:
        expected_gap2 = torch.log(mu[b, t2].exp() / 3 + 2 * theta[b, t2].exp() / 3)
        expected_gap1 = torch.log(mu[b, t1].exp() / 2 + theta[b, t1].exp() / 2)
    torch.testing.assert_close(ref[b, t2], expected_gap2, rtol=0.0, atol=1e-6)
    torch.testing.assert_close(ref[b, t1], expected_gap1, rtol=0.0, atol=1e-6)


def test_ewma_reference_forward_update_and_restore(monkeypatch) -> None:
    actor = _actor("ewma")  # decay auto with W = 2: beta = 2 / (2 + 2) = 0.5
    batch = _batch(actor, noise=0.0)
    theta0 = _params(actor)
    spy = _Spy(monkeypatch)
    m = actor.train_step(batch)
    # theta_prox starts as the RL-start weights, so the first reference is the pre-step forward.
    assert torch.equal(spy.calls[-1]["ref"], spy.calls[-1]["theta"])
    assert m.applied and m.reference == "ewma" and not m.ewma_reset
    theta1 = _params(actor)
    # total: 0.5 * 1 + 1 = 1.5, theta_prox = (0.5 / 1.5) theta0 + theta1 / 1.5 = theta0 / 3 + 2 theta1 / 3.
    for name, p0, p1 in zip(actor._named, theta0, theta1, strict=True):
        torch.testing.assert_close(actor.old_logits.controller.params[name], p0 / 3 + 2 * p1 / 3, rtol=1e-6, atol=1e-7)
    # The EWMA forward swaps its weights in and back: the next gradient forward sees theta1 exactly.
    expected_theta = actor.logprobs(batch.tokens)
    actor.train_step(batch)
    assert torch.equal(spy.calls[-1]["theta"], expected_theta)
    assert not torch.equal(spy.calls[-1]["ref"], expected_theta)  # theta_prox != theta1


def test_ewma_resets_when_the_keep_ratio_stays_low() -> None:
    actor = _actor("ewma")  # reset after 3 consecutive steps with keep ratio < 0.8
    resets = []
    for step in range(3):
        # logp_mu far from the policy: |log r_d| ~ 3 > log 2, so the [0.5, 2] mask rejects most tokens.
        m = actor.train_step(_batch(actor, seed=20 + step, noise=3.0))
        assert m.correction.keep_ratio < 0.8
        resets.append((m.ewma_reset, m.ewma_reset_reason))
    assert resets == [(False, ""), (False, ""), (True, "keep_ratio_collapse")] and m.ewma_resets_total == 1
    for name, p in actor._named.items():
        assert torch.equal(actor.old_logits.controller.params[name], p.detach()), name


def test_nonfinite_loss_stops_the_step(monkeypatch, caplog) -> None:
    import asyncrl.trainer.correction as correction

    real = correction.correction_loss

    def poisoned(*args, **kwargs):
        result = real(*args, **kwargs)
        return type(result)(loss=result.loss * float("nan"), metrics=result.metrics)

    actor = _actor("behavior")
    batch = _batch(actor)
    monkeypatch.setattr(correction, "correction_loss", poisoned)
    before = _params(actor)
    with caplog.at_level(logging.WARNING, logger="asyncrl.trainer.actor.megatron_actor"):
        m = actor.train_step(batch)
    assert not m.applied and m.version == 0 and m.nonfinite_loss_total == 1
    assert all(torch.equal(b, p) for b, p in zip(before, actor._params, strict=True))
    assert "non-finite loss" in caplog.text and "valid_tokens" in caplog.text
    monkeypatch.setattr(correction, "correction_loss", real)
    assert actor.train_step(batch).applied and actor.version == 1


def test_sft_step_learns_a_fixed_batch() -> None:
    actor = _actor("behavior")
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    losses = [actor.sft_step(tokens, loss_mask).loss for _ in range(8)]
    # Starts near uniform: ln 40 = 3.69 nats; 8 Adam steps at lr 1e-2 must bring it down.
    assert losses[0] == pytest.approx(torch.tensor(float(VOCAB)).log().item(), abs=0.2)
    assert losses[-1] < losses[0] - 0.3
    assert actor.version == 8


def test_sft_step_weights_are_a_weighted_mean_over_the_mask() -> None:
    tokens = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    plain, ones = _actor("behavior"), _actor("behavior")
    assert ones.sft_step(tokens, loss_mask, torch.ones(B, T)).loss == pytest.approx(plain.sft_step(tokens, loss_mask).loss)
    # weight 0 everywhere but one token: the loss is that token's cross-entropy alone (the prompt's weight is masked)
    w = torch.full((B, T), 7.0)
    w[:, PROMPT:] = 0.0
    w[0, PROMPT] = 3.0
    one, again = _actor("behavior"), _actor("behavior")
    only = torch.zeros(B, T, dtype=torch.bool)
    only[0, PROMPT] = True
    assert one.sft_step(tokens, loss_mask, w).loss == pytest.approx(again.sft_step(tokens, only).loss, rel=1e-5)
    with pytest.raises(ValueError, match=r"weights \(2, 3\) must be the tokens' \[B, T\] shape"):
        one.sft_step(tokens, loss_mask, torch.ones(2, 3))


def test_hf_state_dict_loads_into_transformers() -> None:
    from transformers import LlamaForCausalLM

    from asyncrl.trainer.megatron.convert import llama_config

    actor = _actor("behavior")
    actor.train_step(_batch(actor))
    hf = LlamaForCausalLM(llama_config(actor.settings.arch)).eval()
    hf.load_state_dict(actor.hf_state_dict(), strict=True)
    tokens = torch.randint(0, VOCAB, (3, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logp_hf = torch.log_softmax(hf(tokens).logits, -1)[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    torch.testing.assert_close(actor.logprobs(tokens)[:, 1:], logp_hf, rtol=0.0, atol=1e-5)


@pytest.mark.parametrize("reference", ["behavior", "ewma"])
def test_checkpoint_round_trip_resumes_identically(tmp_path, reference: str) -> None:
    actor = _actor(reference, maxGradNorm=0.5)
    first, second = _batch(actor, seed=1), _batch(actor, seed=2)
    actor.train_step(first)
    ckpt = tmp_path / "step_1"
    actor.save_checkpoint(str(ckpt))
    actor.save_checkpoint(str(ckpt))  # overwrite in place: still one complete folder
    assert sorted(os.listdir(tmp_path)) == ["step_1"]
    expected = actor.train_step(second)
    after = _params(actor)

    fresh = _actor(reference, maxGradNorm=0.5)
    fresh.load_checkpoint(str(ckpt))
    assert fresh.version == 1
    got = fresh.train_step(second)  # optimizer moments (and theta_prox) restored, or this would differ
    assert got.version == expected.version == 2 and got.loss == expected.loss
    assert all(torch.equal(a, p) for a, p in zip(after, fresh._params, strict=True))
    if reference == "ewma":
        for name, value in actor.old_logits.controller.params.items():
            assert torch.equal(fresh.old_logits.controller.params[name], value), name


def test_train_batch_reports_every_shape_problem() -> None:
    ok = torch.zeros(2, 3)
    with pytest.raises(ValueError) as err:
        TrainBatch(
            tokens=torch.zeros(2, 3, dtype=torch.long),
            loss_mask=torch.zeros(2, 3),  # float, not bool
            logp_mu=ok,
            versions=torch.zeros(2, 4, dtype=torch.long),  # wrong T
            advantages=ok,
            turn_ids=torch.zeros(2, 3, dtype=torch.long),
        )
    assert "loss_mask has dtype torch.float32, expected torch.bool" in str(err.value)
    assert "versions has shape (2, 4), tokens has (2, 3)" in str(err.value)


def test_the_driver_batch_crosses_the_ray_boundary_field_for_field() -> None:
    from asyncrl.rollout.trajectory import Trajectory
    from asyncrl.trainer.driver.loop.grpo_batch import assemble_batch

    traj = Trajectory(
        traj_id="t0",
        group_id="g0",
        task="calculator",
        tokens=[1, 2, 3, 4],
        prompt_len=2,
        loss_mask=[False, False, True, True],
        versions=[-1, -1, 0, 0],
        logp_mu=[0.0, 0.0, -0.5, -0.25],
        turn_ids=[-1, -1, 0, 0],
        reward=1.0,
    )
    sent = assemble_batch([[traj]], pad_id=0)
    arrays = sent.to_numpy()
    assert list(arrays) == ["tokens", "loss_mask", "logp_mu", "versions", "advantages", "turn_ids"]
    got = TrainBatch.from_numpy(arrays)
    assert got.shape == (1, 4) and got.logp_mu.tolist() == [[0.0, 0.0, -0.5, -0.25]]
    assert got.turn_ids.tolist() == [[-1, -1, 0, 0]]
    for name, value in vars(sent).items():
        if value is None:  # logp_old: only when a strategy pre-scored tokens
            assert getattr(got, name) is None, name
            continue
        assert torch.equal(getattr(got, name), value) and getattr(got, name).dtype == value.dtype, name
    with pytest.raises(ValueError, match=r"missing fields \['turn_ids'\], unknown fields \['segment_ids'\]"):
        TrainBatch.from_numpy({**{k: v for k, v in arrays.items() if k != "turn_ids"},
                               "segment_ids": arrays["turn_ids"]})


def test_unknown_reference_lists_the_valid_ones() -> None:
    settings = _actor("behavior").settings
    bad = dataclasses.replace(settings, correction=settings.correction.model_copy(update={"reference": "proximal"}))
    with pytest.raises(
        ValueError, match="'proximal' has no old-logit provider; valid: behavior, current, linear, loglinear, ewma"
    ):
        MegatronActor(bad)


@pytest.mark.parametrize("reference", ["behavior", "ewma"])
def test_policy_gradient_moves_logp_with_the_advantage_sign(reference: str) -> None:
    actor = _actor(reference)
    batch = _batch(actor, noise=0.0)  # on-policy: r_d = 1, nothing rejected
    start = actor.logprobs(batch.tokens)
    for _ in range(4):
        assert actor.train_step(batch).applied
    delta = ((actor.logprobs(batch.tokens) - start) * batch.loss_mask).sum(dim=1)  # [B]
    # Rows alternate A = +1 / -1: sampled tokens of positive rows gain log-prob, negative rows lose.
    assert torch.all(delta[0::2] > 0) and torch.all(delta[1::2] < 0), delta
