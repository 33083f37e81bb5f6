"""The megatron actor: references, non-finite handling, SFT, weight export, checkpoints."""

import logging
import os

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.megatron.actor import MegatronActor
from asyncrl.trainer.megatron.batch import TrainBatch

VOCAB = 40
B, T, PROMPT = 6, 14, 4


def _spec(reference: str, **train) -> AsyncRLJobSpec:
    doc = {
        "correction": {"reference": reference},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "task": {"temperature": 1.0},
        "train": {"learningRate": 1e-2, "seed": 3, **train},
    }
    if reference == "exact":
        doc["oldLogits"] = {"strategy": "snapshot"}
    return AsyncRLJobSpec.model_validate(doc)


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
    segment_ids = torch.where(loss_mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -1))
    return TrainBatch(tokens, loss_mask, logp_mu, versions, advantages, segment_ids)


def _params(actor: MegatronActor) -> list[torch.Tensor]:
    return [p.detach().clone() for p in actor._params]


def test_behavior_step_updates_weights_and_version() -> None:
    actor = _actor("behavior")
    batch = _batch(actor)
    before = _params(actor)
    m = actor.train_step(batch)
    assert m.stepped and m.version == actor.version == 1 and m.reference == "behavior"
    assert m.valid_tokens == B * (T - PROMPT) - 3
    # behavior: pi_ref = mu, so r_d = 1 exactly and nothing is rejected by the discrepancy mask.
    assert m.correction["rd_min"] == m.correction["rd_max"] == 1.0
    assert m.correction["keep_ratio"] == 1.0
    assert all(not torch.equal(b, p) for b, p in zip(before, actor._params, strict=True))
    flat = m.as_dict()
    assert flat["actor/reference"] == "behavior" and flat["actor/version"] == 1.0
    assert "actor/correction/kl_k3" in flat


def test_current_reference_is_the_pre_step_forward() -> None:
    actor = _actor("current")
    batch = _batch(actor, noise=0.0)
    explicit = actor.logprobs(batch.tokens)  # an extra no-grad forward with the pre-step weights
    with_grad = actor._logprobs(batch.tokens, 1.0)
    assert torch.equal(with_grad.detach(), explicit)  # bit-identical: the detached forward is that reference
    # logp_mu was recorded by these very weights, so r_d = pi_ref / mu = 1 and r_s = 1.
    m = actor.train_step(batch)
    assert m.stepped and m.correction["rd_max"] == pytest.approx(1.0, abs=1e-6)
    assert m.correction["rs_min"] == m.correction["rs_max"] == 1.0


def test_exact_reference_takes_logp_ref_from_the_batch() -> None:
    actor = _actor("exact")
    batch = _batch(actor)
    with pytest.raises(ValueError, match="has no logp_ref"):
        actor.train_step(batch)
    logp_ref = batch.logp_mu + 0.01 * batch.loss_mask
    m = actor.train_step(TrainBatch.from_fields(batch, logp_ref=logp_ref))
    assert m.stepped and m.reference == "exact"
    # r_d = exp(0.01) on every valid token.
    assert m.correction["rd_mean"] == pytest.approx(torch.tensor(0.01).exp().item(), rel=1e-5)

    other = _actor("behavior")
    with pytest.raises(ValueError, match="only reference 'exact' takes"):
        other.train_step(TrainBatch.from_fields(batch, logp_ref=logp_ref))


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
    with caplog.at_level(logging.WARNING, logger="asyncrl.trainer.megatron.actor"):
        m = actor.train_step(batch)
    assert not m.stepped and m.version == 0 and m.nonfinite_loss_total == 1
    assert all(torch.equal(b, p) for b, p in zip(before, actor._params, strict=True))
    assert "non-finite loss" in caplog.text and "valid_tokens" in caplog.text
    monkeypatch.setattr(correction, "correction_loss", real)
    assert actor.train_step(batch).stepped and actor.version == 1


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


def test_checkpoint_round_trip_resumes_identically(tmp_path) -> None:
    actor = _actor("behavior", maxGradNorm=0.5)
    first, second = _batch(actor, seed=1), _batch(actor, seed=2)
    actor.train_step(first)
    ckpt = tmp_path / "step_1"
    actor.save_checkpoint(str(ckpt))
    actor.save_checkpoint(str(ckpt))  # overwrite in place: still one complete folder
    assert sorted(os.listdir(tmp_path)) == ["step_1"]
    expected = actor.train_step(second)
    after = _params(actor)

    fresh = _actor("behavior", maxGradNorm=0.5)
    fresh.load_checkpoint(str(ckpt))
    assert fresh.version == 1
    got = fresh.train_step(second)  # optimizer moments restored too, or this step would differ
    assert got.version == expected.version == 2 and got.loss == expected.loss
    assert all(torch.equal(a, p) for a, p in zip(after, fresh._params, strict=True))


def test_train_batch_reports_every_shape_problem() -> None:
    ok = torch.zeros(2, 3)
    with pytest.raises(ValueError) as err:
        TrainBatch(
            tokens=torch.zeros(2, 3, dtype=torch.long),
            loss_mask=torch.zeros(2, 3),  # float, not bool
            logp_mu=ok,
            versions=torch.zeros(2, 4, dtype=torch.long),  # wrong T
            advantages=ok,
            segment_ids=torch.zeros(2, 3, dtype=torch.long),
        )
    assert "loss_mask has dtype torch.float32, expected torch.bool" in str(err.value)
    assert "versions has shape (2, 4), tokens has (2, 3)" in str(err.value)


def test_train_batch_takes_the_driver_padded_batch() -> None:
    from asyncrl.rollout.trajectory import Trajectory
    from asyncrl.trainer.driver.batch import assemble_batch

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
    padded = assemble_batch([[traj]], pad_id=0)
    batch = TrainBatch.from_fields(padded)
    assert batch.shape == (1, 4) and batch.logp_ref is None
    assert batch.logp_mu.tolist() == [[0.0, 0.0, -0.5, -0.25]]


def test_unknown_reference_lists_the_valid_ones() -> None:
    from asyncrl.trainer.megatron.references import reference_rule

    with pytest.raises(
        ValueError, match="valid references: behavior, current, linear, loglinear, ewma, exact"
    ):
        reference_rule("proximal")
