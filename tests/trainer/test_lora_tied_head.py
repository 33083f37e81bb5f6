"""A LoRA base of a model with tied embeddings travels without ``lm_head.weight`` (the HF state dict's second name
for ``model.embed_tokens.weight``): in the first delivery and in a joiner's base (``lora_base.wire_state``). The
receivers tie it themselves, the actor and the receivers hash the same base, and an untied model's head still
travels (it is a weight of its own)."""

from typing import Any

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.weight_sync import WeightTransport
from asyncrl.rollout.adapter_merge import is_hf_adapter_name
from asyncrl.trainer.driver.hosts.rollout_host import RolloutHost
from asyncrl.trainer.weight_sync.actor_side import ActorSync
from asyncrl.trainer.weight_sync.lora_base import TIED_HEAD, fingerprint, wire_state
from asyncrl.trainer.weight_sync.objectstore import receive
from asyncrl.trainer.weight_sync.outcome import Delivered
from tests.trainer.test_lora_late_joiner import T, _actor, _batch, _logp, _spec_json, _vocab

pytestmark = pytest.mark.usefixtures("megatron_on_cpu", "ray_session")  # tests/trainer/conftest.py, tests/conftest.py


def _spec(tied: bool) -> dict[str, Any]:
    spec = _spec_json("objectStore")
    spec["model"] = {**spec["model"], "tieEmbeddings": tied}
    return spec


def test_wire_state_drops_the_head_only_when_tied() -> None:
    state = {"model.embed_tokens.weight": torch.ones(3, 2), TIED_HEAD: torch.ones(3, 2), "x.lora_A.weight": torch.ones(1, 2)}
    assert set(wire_state(state, tied=True)) == {"model.embed_tokens.weight", "x.lora_A.weight"}
    assert wire_state(state, tied=False) == state


@pytest.mark.parametrize("tied", [True, False])
def test_the_base_carries_the_head_once(tied: bool) -> None:
    spec_json = _spec(tied)
    spec = AsyncRLJobSpec.model_validate(spec_json)
    host = RolloutHost(spec_json, worker_index=0, threads=1)
    actor = _actor(spec, host)
    assert actor.settings.arch.tie_embeddings is tied
    sync = ActorSync(spec, rank=0, tp=1, transport=WeightTransport.OBJECT_STORE)
    first = sync.publish(actor)
    got = receive(first).state
    full = actor.hf_state_dict()  # lists the head in both cases (tied: the embedding's tensor again)
    assert TIED_HEAD in full
    assert (TIED_HEAD in got) is not tied
    head = full[TIED_HEAD].numel() * 4  # fp32 rollout: an fp32 wire
    sent = sum(v.numel() * v.element_size() for v in got.values())
    assert sent == sum(v.numel() * 4 for v in full.values()) - (head if tied else 0)
    assert isinstance(host.update_weights(first, 0), Delivered)  # the engine ties the head itself
    base_got = {k: v for k, v in got.items() if not is_hf_adapter_name(k)}
    assert host._base_fingerprint == sync.base_fingerprint == fingerprint(base_got)

    # A joiner's base: the same tensors, the same fingerprint, the head once.
    assert actor.train_step(_batch(actor, 10, 0)).applied
    v1 = sync.publish(actor)
    assert isinstance(host.update_weights(v1, 1), Delivered)
    base = sync.base_for_joiner(actor)
    assert base is not None and base.fingerprint == sync.base_fingerprint
    assert base.nbytes == sum(v.numel() * v.element_size() for v in base_got.values())
    late = RolloutHost(spec_json, worker_index=1, threads=1)
    assert isinstance(late.update_weights(v1, 1, base), Delivered)
    ids = torch.randint(0, _vocab(actor), (2, T), generator=torch.Generator().manual_seed(3))
    mine = _logp(late, ids)
    assert torch.equal(mine, _logp(host, ids))
    assert float((actor.logprobs(ids)[:, 1:] - mine).abs().max()) < 1e-5
    print(f"tied={tied}: base {base.nbytes} B (head {head} B {'left out' if tied else 'sent'})")
