"""LoRA with ``oldLogits.strategy: interruptSync``, in process: a rollout worker's interrupt-sync scorer scores the
version it holds with the training-side model on the base it kept plus that version's adapters, merged in fp32
(``RolloutHost._scorer_weights``), never a full-weight copy taken off the wire for it. Under the fp32 rollout its
``pi_old`` equals the actor's log-probs within 1e-5, for the first worker (which kept the base of the first
delivery) and for a late joiner (which kept the base the actor packed for it alone)."""

from typing import Any

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.weight_sync import WeightTransport
from asyncrl.rollout.adapter_merge import is_hf_adapter_name
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory
from asyncrl.trainer.driver.hosts.rollout_host import RolloutHost
from asyncrl.trainer.weight_sync.actor_side import ActorSync
from asyncrl.trainer.weight_sync.outcome import Delivered
from tests.trainer.test_lora_late_joiner import PROMPT, T, _actor, _batch, _spec_json, _vocab

pytestmark = pytest.mark.usefixtures("megatron_on_cpu", "ray_session")  # tests/trainer/conftest.py, tests/conftest.py


def _spec() -> dict[str, Any]:
    spec = _spec_json("objectStore")
    spec["oldLogits"] = {"strategy": "interruptSync"}
    return spec


def _trajectory(tokens: list[int], version: int, i: int) -> Trajectory:
    n = len(tokens)
    sampled = [p >= PROMPT for p in range(n)]
    return Trajectory(traj_id=f"t{i}", group_id=f"g{i}", task="calculator", tokens=tokens, prompt_len=PROMPT,
                      loss_mask=sampled, versions=[version if s else NO_VERSION for s in sampled],
                      logp_mu=[0.0] * n, turn_ids=[0 if s else -1 for s in sampled])


def test_interrupt_sync_scores_base_plus_the_versions_adapters(tmp_path: Any) -> None:
    spec_json = _spec()
    spec = AsyncRLJobSpec.model_validate(spec_json)
    host = RolloutHost(spec_json, worker_index=0, threads=1)
    actor = _actor(spec, host)
    sync = ActorSync(spec, rank=0, tp=1, transport=WeightTransport.OBJECT_STORE)
    assert isinstance(host.update_weights(sync.publish(actor), 0), Delivered)  # the first delivery: base + adapters
    assert actor.train_step(_batch(actor, 10, 0)).applied
    v1 = sync.publish(actor)  # version 1: adapters alone
    assert isinstance(host.update_weights(v1, 1), Delivered)
    # The scorer keeps the version's adapters; the base it merges them onto came once, with the first delivery.
    assert host._weights and all(is_hf_adapter_name(k) for k in host._weights)
    assert host._score_merge is not None and host._score_merge.base
    assert not any(is_hf_adapter_name(k) for k in host._score_merge.base)

    ids = torch.randint(0, _vocab(actor), (3, T), generator=torch.Generator().manual_seed(7))
    want = actor.logprobs(ids)[:, PROMPT:]
    trajs = [_trajectory(row.tolist(), 1, i) for i, row in enumerate(ids)]
    out = host.sync_score(trajs, 1, release=True)
    assert out.tokens == 3 * (T - PROMPT)
    got = torch.tensor([vals for pos, vals in out.scores])
    assert [pos for pos, _ in out.scores] == [list(range(PROMPT, T))] * 3
    err = float((got - want).abs().max())
    print(f"first worker: max |pi_old - actor| {err:.2e}")
    assert err < 1e-5
    assert host.worker.engine._adapters.merges == 2  # the engine merged both versions too (it samples from them)

    # A late joiner keeps the base the actor packed for it alone, and scores the same.
    late = RolloutHost(spec_json, worker_index=1, threads=1)
    base = sync.base_for_joiner(actor)
    assert base is not None
    assert isinstance(late.update_weights(v1, 1, base), Delivered)
    assert late._weights and all(is_hf_adapter_name(k) for k in late._weights)
    theirs = late.sync_score([_trajectory(row.tolist(), 1, i) for i, row in enumerate(ids)], 1, release=False)
    late_got = torch.tensor([vals for _, vals in theirs.scores])
    print(f"late joiner: max |pi_old - actor| {float((late_got - want).abs().max()):.2e}")
    assert float((late_got - want).abs().max()) < 1e-5
    # The adapters matter: the base alone scores otherwise (the test could fail).
    base_only = late._score_merge.base if late._score_merge is not None else {}
    late._scorer.load(base_only, 1)
    alone = torch.tensor([vals for _, vals in late._scorer.score(
        [_trajectory(row.tolist(), 1, i) for i, row in enumerate(ids)], 1)])
    assert float((alone - want).abs().max()) > 1e-3
