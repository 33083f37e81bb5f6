"""A LoRA rollout worker that joins late (a replacement, a worker whose pod restarted, a late broadcast member)
gets the actor's frozen base beside the current version's adapters, through every transport, and never samples
from a wrong model (trainer/weight_sync/lora_base.py).

Per transport: the actor's first delivery (base + adapters) goes to a first worker, a step is trained, the
second version (adapters alone) goes to the first worker as usual and to a fresh one with the base the actor
packs for it alone (``base_for_joiner``). Both workers' engines then hold the same weights bit for bit, and
under the fp32 rollout their log-probs equal the actor's within 1e-5 (r_d == 1). Without the base the fresh
worker refuses the adapters; a base of another fingerprint, or one that does not hash to its declared
fingerprint, is refused naming both."""

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.weight_sync import WeightTransport
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.driver.hosts.rollout_host import RolloutHost
from asyncrl.trainer.driver.loop import weight_sync as driver_sync
from asyncrl.trainer.weight_sync.actor_side import ActorSync
from asyncrl.trainer.weight_sync.broadcast import open_group
from asyncrl.trainer.weight_sync.lora_base import BaseRefs, complete, fingerprint
from asyncrl.trainer.weight_sync.outcome import Delivered

pytestmark = pytest.mark.usefixtures("megatron_on_cpu", "ray_session")  # tests/trainer/conftest.py, tests/conftest.py

B, T, PROMPT = 4, 12, 4


def _spec_json(transport: str) -> dict[str, Any]:
    return {
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "snapshot"},
        "async": {"maxStaleness": 2},
        "task": {"name": "calculator"},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64,
                  "rolloutDtype": "float32", "lora": {"rank": 4, "alpha": 8.0}},
        "train": {"learningRate": 5e-2, "seed": 5},
        "rollout": {"engine": "transformers"},
        "actor": {"weightSync": {"transport": transport, "bucketMiB": 1}},
    }


def _actor(spec: AsyncRLJobSpec, host: RolloutHost) -> MegatronActor:
    """The actor of ``spec`` over the task's vocabulary (what the rollout worker's engine is built for)."""
    return MegatronActor.from_spec(spec, host.worker.tokenizer.vocab_size, num_threads=torch.get_num_threads())


def _vocab(actor: MegatronActor) -> int:
    return int(actor.settings.arch.vocab_size)


def _batch(actor: MegatronActor, seed: int, version: int) -> TrainBatch:
    """An on-policy batch (mu is the actor's own log-probs) with advantages of both signs: a step moves B."""
    tokens = torch.randint(0, _vocab(actor), (B, T), generator=torch.Generator().manual_seed(seed))
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    versions = torch.where(loss_mask, version, -1)
    adv = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    batch = TrainBatch(tokens, loss_mask, torch.zeros(B, T), versions, adv, torch.where(loss_mask, 0, -1))
    return dataclasses.replace(batch, logp_mu=actor.logprobs(tokens) * loss_mask)


def _logp(host: RolloutHost, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = host.worker.engine.model(ids).logits.float()
    return torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]


def _sync(spec: AsyncRLJobSpec, transport: str, tmp_path: Any) -> ActorSync:
    sync = ActorSync(spec, rank=0, tp=1, transport=WeightTransport(transport), disk_root=str(tmp_path / "ws"))
    if transport == "broadcast":  # a group of the source alone: the joiner reads the version the actor kept
        from asyncrl.trainer.collective.endpoint import new_endpoint

        sync.group = open_group(new_endpoint("127.0.0.1"), 0, 1, timeout_s=60.0)
    return sync


def _handle(sync: ActorSync, actor: MegatronActor) -> Any:
    """The version as a receiver outside a broadcast group takes it: the handle, or the kept buckets' copy."""
    handle = sync.publish(actor)
    if sync.transport is WeightTransport.BROADCAST:
        sync.send(actor, int(actor.version))
        return sync.for_joiner(actor, int(actor.version))
    return handle


@pytest.mark.parametrize("transport", ["objectStore", "disk", "broadcast"])
def test_a_late_joiner_gets_the_base_and_samples_from_the_current_version(transport: str, tmp_path: Any) -> None:
    spec_json = _spec_json(transport)
    spec = AsyncRLJobSpec.model_validate(spec_json)
    first = RolloutHost(spec_json, worker_index=0, threads=1)
    actor = _actor(spec, first)
    sync = _sync(spec, transport, tmp_path)
    out = first.update_weights(_handle(sync, actor), 0)
    assert isinstance(out, Delivered)
    assert first._base_fingerprint == sync.base_fingerprint is not None  # the first delivery carried the base

    ids = torch.randint(0, _vocab(actor), (3, T), generator=torch.Generator().manual_seed(4))
    v0_logp = _logp(first, ids)
    assert actor.train_step(_batch(actor, 10, 0)).applied
    v1 = _handle(sync, actor)  # adapters alone
    assert isinstance(first.update_weights(v1, 1), Delivered)

    late = RolloutHost(spec_json, worker_index=1, threads=1)
    with pytest.raises(RuntimeError, match="holds no base and was handed version adapters alone"):
        late.update_weights(v1, 1)
    base = sync.base_for_joiner(actor)
    assert isinstance(base, BaseRefs) and base.fingerprint == sync.base_fingerprint
    got = late.update_weights(v1, 1, base)
    assert isinstance(got, Delivered) and late.worker.version == 1
    adapters = out.nbytes - base.nbytes  # the first delivery: base + version 0's adapters
    assert got.nbytes == base.nbytes + adapters > 0  # the joiner paid the base once, beside the adapters

    mine, theirs = _logp(late, ids), _logp(first, ids)
    assert torch.equal(mine, theirs)  # the same model, bit for bit
    actor_logp = actor.logprobs(ids)[:, 1:]
    r_d = torch.exp(actor_logp - mine)
    print(f"{transport}: max |r_d - 1| {float((r_d - 1).abs().max()):.2e}; base {base.nbytes} B, "
          f"adapters {adapters} B")
    assert float((r_d - 1).abs().max()) < 1e-5
    assert float((mine - v0_logp).abs().max()) > 1e-3  # version 1 is not the base alone: the test could fail
    assert first._base_fingerprint == late._base_fingerprint
    assert late.worker.engine._adapters.merges == 1  # the joiner merged version 1 onto the base it fetched

    # A base handed again, or a later version, is taken as it is (the base is not fetched twice).
    assert actor.train_step(_batch(actor, 11, 1)).applied
    assert isinstance(late.update_weights(_handle(sync, actor), 2, base), Delivered)


def test_a_base_of_another_fingerprint_is_refused_naming_both(tmp_path: Any) -> None:
    spec_json = _spec_json("objectStore")
    spec = AsyncRLJobSpec.model_validate(spec_json)
    host = RolloutHost(spec_json, worker_index=0, threads=1)
    actor = _actor(spec, host)
    sync = _sync(spec, "objectStore", tmp_path)
    host.update_weights(sync.publish(actor), 0)
    held = host._base_fingerprint
    other_json = {**spec_json, "train": {**spec_json["train"], "seed": 6}}  # the preset drawn with another seed
    other = _actor(AsyncRLJobSpec.model_validate(other_json), host)
    other_sync = _sync(AsyncRLJobSpec.model_validate(other_json), "objectStore", tmp_path)
    other_sync.publish(other)
    foreign = other_sync.base_for_joiner(other)
    assert foreign is not None and foreign.fingerprint != held
    assert actor.train_step(_batch(actor, 10, 0)).applied
    v1 = sync.publish(actor)  # adapters alone
    with pytest.raises(ValueError, match=f"holds base {held} and was handed the base {foreign.fingerprint}"):
        host.update_weights(v1, 1, foreign)
    with pytest.raises(ValueError, match=f"holds base {held} and was handed a version carrying base "
                                         f"{foreign.fingerprint}"):
        host.update_weights(other.hf_state_dict(), 1)  # a first delivery of the other base, as a plain dict

    # A fresh worker refuses a base whose tensors do not hash to the fingerprint declared with it.
    fresh = RolloutHost(spec_json, worker_index=1, threads=1)
    forged = BaseRefs(foreign.refs, held)
    with pytest.raises(ValueError, match=f"hashes to {foreign.fingerprint}, not to the {held}"):
        fresh.update_weights(v1, 1, forged)
    assert fresh.worker.version < 0  # nothing was installed

    # The actor refuses to hand out a base that is not the one its first delivery carried.
    sync.base_fingerprint = foreign.fingerprint
    with pytest.raises(RuntimeError, match=f"base is now {held}, but the first delivery carried"):
        sync.base_for_joiner(actor)


def test_the_fingerprint_is_the_wire_one() -> None:
    """The sender hashes fp32 copies cast per sample; the receiver hashes the wire tensors: equal. Any name,
    shape, dtype or sampled value that differs changes it."""
    g = torch.Generator().manual_seed(0)
    base = {"a.weight": torch.randn(300, 50, generator=g), "b.weight": torch.randn(7, generator=g)}
    wire = {k: v.to(torch.bfloat16) for k, v in base.items()}
    assert fingerprint(base, torch.bfloat16) == fingerprint(wire) != fingerprint(base)
    assert fingerprint(base) == fingerprint({k: v.clone() for k, v in reversed(base.items())})
    changed = dict(base, **{"b.weight": base["b.weight"] + 1e-3})
    assert fingerprint(changed) != fingerprint(base)
    assert fingerprint({"c.weight": base["a.weight"], "b.weight": base["b.weight"]}) != fingerprint(base)
    assert fingerprint(dict(base, **{"a.weight": base["a.weight"].reshape(50, 300)})) != fingerprint(base)


def test_complete_decides_per_case() -> None:
    base = {"m.q_proj.weight": torch.ones(4, 4)}
    adapters = {"m.q_proj.lora_A.weight": torch.ones(1, 4), "m.q_proj.lora_B.weight": torch.zeros(4, 1)}
    fp = fingerprint(base)
    first = complete({**base, **adapters}, None, None)  # a first delivery carries its base
    assert first.fingerprint == fp and first.base_nbytes == 0 and set(first.state) == set(base) | set(adapters)
    later = complete(adapters, None, fp)  # a worker holding the base takes adapters alone
    assert later.state == adapters and later.fingerprint == fp
    with pytest.raises(RuntimeError, match="holds no base"):
        complete(adapters, None, None)


def test_the_driver_sends_the_base_to_a_replacement_only_under_lora(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    calls: list[str] = []

    class Method:  # a Ray method: its arguments' refs resolved, its answer a ref
        def __init__(self, name: str, fn: Any) -> None:
            self.name, self.fn = name, fn

        def remote(self, *args: Any) -> Any:
            calls.append(self.name)
            return ray.put(self.fn(*(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)))

    base = BaseRefs(refs=None, fingerprint="wire-sha256:x")  # type: ignore[arg-type]
    actor = SimpleNamespace(base_for_joiner=Method("base_for_joiner", lambda: base))
    worker = SimpleNamespace(update_weights=Method("update_weights", lambda w, v, b: (w, v, b)))
    hosts = SimpleNamespace(weights="handle", sync=None, actor=actor)  # objectStore/disk: hosts.weights as it is
    assert driver_sync.to_replacement(hosts, worker, 3, lora=True) == ("handle", 3, base)  # type: ignore[arg-type]
    assert calls == ["base_for_joiner", "update_weights"]
    calls.clear()
    assert driver_sync.to_replacement(hosts, worker, 3) == ("handle", 3, None)  # type: ignore[arg-type]
    assert calls == ["update_weights"]  # a full fine-tuning job asks the actor nothing


def test_a_version_the_group_never_carried_is_packed_for_every_receiver(tmp_path: Any) -> None:
    """The driver found a broadcast member dead before forming the group: that version goes to every receiver
    through the object store (``weights_for_joiner``) although it was never sent. The actor packs it then (the
    first one with the base), and keeps it for the joiners that follow; a version it no longer holds is refused."""
    spec_json = _spec_json("broadcast")
    spec = AsyncRLJobSpec.model_validate(spec_json)
    host = RolloutHost(spec_json, worker_index=0, threads=1)
    actor = _actor(spec, host)
    sync = _sync(spec, "broadcast", tmp_path)
    sync.publish(actor)  # version 0's handle: nothing packed yet
    first = sync.for_joiner(actor, 0)
    assert first is not None and isinstance(host.update_weights(first, 0), Delivered)
    assert host._base_fingerprint == sync.base_fingerprint is not None  # the first version carried the base
    assert sync.for_joiner(actor, 0) is not None and sync.kept_version == 0
    assert actor.train_step(_batch(actor, 10, 0)).applied
    sync.for_joiner(actor, 0)  # kept: still served after the actor moved on
    sync.kept_version = -1  # as if it had not been kept
    with pytest.raises(RuntimeError, match="needs version 0; the actor kept version -1 and holds 1"):
        sync.for_joiner(actor, 0)
    later = sync.for_joiner(actor, 1)  # adapters alone, never broadcast
    assert later is not None and isinstance(host.update_weights(later, 1), Delivered)
    # rank 1 of a TP = 1 actor packs nothing and answers None
    assert ActorSync(spec, rank=1, tp=1, transport=WeightTransport.BROADCAST).for_joiner(actor, 1) is None


def test_a_dedicated_scorer_takes_the_base_and_merges_each_version_it_advances_to(tmp_path: Any) -> None:
    """A dedicated scorer started late takes the base (set_base), is pushed a version as adapters alone (it never
    saw the first delivery), and scores it as the actor does (fp32: within 1e-5); without the base it refuses."""
    from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer
    from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings

    spec_json = _spec_json("objectStore")
    spec = AsyncRLJobSpec.model_validate(spec_json)
    host = RolloutHost(spec_json, worker_index=0, threads=1)
    actor = _actor(spec, host)
    sync = _sync(spec, "objectStore", tmp_path)
    sync.publish(actor)  # the first delivery (with the base), which the scorer never sees
    assert actor.train_step(_batch(actor, 10, 0)).applied
    v1 = sync.publish(actor)  # adapters alone
    settings = ScorerSettings.from_spec(spec, _vocab(actor), device="cpu", token_budget=64)

    bare = DedicatedScorer(settings)
    bare.push_version([ray_put(v1)], 1)
    with pytest.raises(RuntimeError, match="holds no base and was handed version adapters alone"):
        bare.advance_to(1)

    scorer = DedicatedScorer(settings)
    base = sync.base_for_joiner(actor)
    assert base is not None and scorer.set_base(base) == base.nbytes > 0
    scorer.push_version([ray_put(v1)], 1)
    scorer.advance_to(1)
    ids = torch.randint(0, _vocab(actor), (2, T), generator=torch.Generator().manual_seed(7))
    positions = list(range(PROMPT, T))
    got = scorer.score([(row.tolist(), positions) for row in ids], 1)
    want = actor.logprobs(ids)[:, PROMPT:]
    assert float((torch.tensor(got) - want).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="holds base .* and was handed the base"):
        scorer.set_base(BaseRefs(base.refs, "wire-sha256:another"))


def ray_put(value: Any) -> Any:
    import ray

    return ray.put(value)
