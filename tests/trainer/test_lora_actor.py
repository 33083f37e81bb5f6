"""The LoRA actor (spec.model.lora): it trains the adapters only, its versions are adapters (snapshots, EWMA,
weight sync), the exact route scores a batch spanning versions in ONE forward with the per-version result, and
the transformers engine, given the base once and then adapters only, samples with r_d == 1 under fp32."""

import dataclasses

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.megatron import lora as lora_module
from asyncrl.trainer.weight_sync.source import hf_tensors

VOCAB = 40
B, T, PROMPT = 6, 14, 4

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _actor(reference: str = "exact", **lora: object) -> MegatronActor:
    spec = {
        "correction": {"reference": reference},
        "async": {"maxStaleness": 2},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64,
                  "lora": {"rank": 4, "alpha": 8.0, **lora}},
        "train": {"learningRate": 5e-2, "seed": 5},
    }
    if reference == "exact":
        spec["oldLogits"] = {"strategy": "snapshot"}
    return MegatronActor.from_spec(AsyncRLJobSpec.model_validate(spec), VOCAB, num_threads=torch.get_num_threads())


def _batch(actor: MegatronActor, seed: int, version: int) -> TrainBatch:
    """A batch whose mu is the actor's own log-probs (on-policy: the mask keeps every token)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    versions = torch.where(loss_mask, torch.full((B, T), version), torch.full((B, T), -1))
    adv = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    seg = torch.where(loss_mask, 0, -1)
    batch = TrainBatch(tokens, loss_mask, torch.zeros(B, T), versions, adv, seg)
    return dataclasses.replace(batch, logp_mu=actor.logprobs(tokens) * loss_mask)


def test_only_the_adapters_move_and_they_are_the_versions() -> None:
    actor = _actor()
    named = actor.named_weights()
    assert named and all(lora_module.is_adapter_name(n) for n in named)
    base = {k: v.clone() for k, v in actor.gpt.state_dict().items() if not lora_module.is_adapter_name(k)
            and not k.endswith("_extra_state")}
    before = {k: v.clone() for k, v in named.items()}
    assert actor.train_step(_batch(actor, 1, 0)).applied
    after = {k: v for k, v in actor.gpt.state_dict().items() if k in base}
    assert all(torch.equal(base[k], after[k]) for k in base)  # the base is frozen
    assert any(not torch.equal(before[k], named[k]) for k in named)  # the adapters trained
    # a kept version is its adapters: the snapshot store holds exactly the adapter tensors
    store = actor.old_logits.store
    (v0,) = [v for v in store.versions if v == 0]
    assert set(store.get(v0)) == set(named)
    full = sum(v.numel() for v in actor.gpt.state_dict().values() if torch.is_tensor(v))
    per_version = 4 * sum(v.numel() for v in named.values())  # fp32 adapters
    assert store.nbytes == len(store.versions) * per_version
    assert per_version < 0.2 * 4 * full  # rank 4 on a 32-wide toy model: 14 % (SmolLM2-135M at rank 8: 0.9 %)


def test_ewma_averages_the_adapters() -> None:
    actor = _actor("ewma")
    assert actor.train_step(_batch(actor, 1, 0)).applied
    prox = actor.old_logits.controller.params
    assert set(prox) == set(actor.named_weights())


def test_a_batch_spanning_versions_is_scored_in_the_planned_bank_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    actor = _actor()
    g = torch.Generator().manual_seed(7)
    probe = torch.randint(0, VOCAB, (B, T), generator=g)
    by_version = {}
    for v, seed in enumerate((10, 11)):
        by_version[v] = actor.logprobs(probe)
        assert actor.train_step(_batch(actor, seed, v)).applied
    by_version[2] = actor.logprobs(probe)
    assert not torch.equal(by_version[0], by_version[1]) and not torch.equal(by_version[1], by_version[2])
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    versions = torch.full((B, T), -1)
    versions[:, PROMPT:PROMPT + 3] = 0  # every row spans three versions (a partial rollout's trajectory)
    versions[:, PROMPT + 3:PROMPT + 7] = 1
    versions[:, PROMPT + 7:] = 2
    versions[1, PROMPT:] = 1  # and one row is a single version
    expected = torch.zeros(B, T)
    for v, logp in by_version.items():
        expected = torch.where(loss_mask & (versions == v), logp, expected)
    banks = []
    real = lora_module.adapter_bank

    def counting(*args, **kwargs):
        banks.append(args[3])  # the slot of every row
        return real(*args, **kwargs)

    monkeypatch.setattr("asyncrl.trainer.actor.megatron_actor.adapter_bank", counting)
    batch = TrainBatch(probe, loss_mask, torch.zeros(B, T), versions, torch.zeros(B, T), torch.where(loss_mask, 0, -1))
    scored = actor.old_logits.score(batch, actor)
    # each (row, version) pair cut after the version's last token (trainer/oldlogits/span_plan.py): 5 pairs of v0
    # need 7 positions, 5 of v1 11, row 1's v1 and 5 of v2 all 14; one forward per length (35 + 55 + 84 positions
    # and 3 x 14 overhead = 216) beats 2 (222) or 1 (16 x 14 + 14 = 238)
    assert [s.tolist() for s in banks] == [[0] * 5, [1] * 5, [1, 2, 2, 2, 2, 2]]
    torch.testing.assert_close(scored * loss_mask, expected, rtol=0.0, atol=2e-6)


def test_engine_merges_adapters_and_r_d_is_one_under_fp32() -> None:
    """The engine takes the base once (hf_state_dict), then each version as adapters alone (the weight sync's
    tensors); a trajectory whose tokens span two versions has pi_old / mu_old == 1 within 1e-5."""
    actor = _actor()
    engine = HFEngine(actor.settings.arch, dtype="float32", seed=0, device="cpu")
    engine.load_weights(actor.hf_state_dict(), version=0)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    mu = {}
    for v, seed in enumerate((10, 11)):
        with torch.no_grad():
            mu[v] = torch.log_softmax(engine.model(ids).logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        assert actor.train_step(_batch(actor, seed, v)).applied
        sent = dict(hf_tensors(actor.named_weights(), actor.settings.arch, adapter_scale=actor.lora.spec.scale))
        assert sent and all(".lora_" in k for k in sent)  # adapters only on the wire
        engine.update_weights(sent, version=v + 1)
    assert engine._adapters.merges == 3  # version 0 (base + its B = 0 adapters), then versions 1 and 2
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    versions = torch.full((B, T), -1)
    versions[:, PROMPT:PROMPT + 5] = 0
    versions[:, PROMPT + 5:] = 1  # each trajectory spans versions 0 and 1
    logp_mu = torch.zeros(B, T)
    for v in (0, 1):
        logp_mu[:, 1:] = torch.where((versions == v)[:, 1:], mu[v], logp_mu[:, 1:])
    batch = TrainBatch(ids, loss_mask, logp_mu * loss_mask, versions, torch.zeros(B, T), torch.where(loss_mask, 0, -1))
    pi_old = actor.old_logits.score(batch, actor)
    r_d = torch.exp(pi_old - logp_mu)[loss_mask]
    print(f"max |r_d - 1| {float((r_d - 1).abs().max()):.2e} over {int(loss_mask.sum())} tokens")
    assert float((r_d - 1).abs().max()) < 1e-5
    assert float((mu[0] - mu[1]).abs().max()) > 1e-3  # the versions differ: the test could fail
