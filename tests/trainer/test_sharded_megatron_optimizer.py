"""Checkpoints of megatron's own optimizer (the ``DistributedOptimizer`` on the CPU shim): its
``sharded_state_dict`` saved with the model through ``dist_checkpointing`` (``fully_reshardable``), written by
every rank with the replicated tensors' writes spread over DP, and resumed at another layout: a DP=2 folder
resumes at one process and at TP=2, a one-process folder at DP=2; the version sequence continues and the next
step equals the uninterrupted run (log-probs, loss, grad norm, weights within 1e-4). A folder of the torch
AdamW refuses to load into megatron's optimizer, naming both.

Spawns real gloo ranks (megatron-core, the project's actor): ~40 s per layout on loaded cores.
"""

from typing import Any

import pytest

from tests.support.parallel_ranks import job
from tests.support.sharded_ranks import run_layout, step_diffs

TOL = 1e-4
pytestmark = pytest.mark.slow


def _job(distributed_optimizer: bool = True) -> dict[str, Any]:
    out = job("behavior")
    out["actor"] = {"megatron": {"distributedOptimizer": distributed_optimizer}}
    return out


@pytest.fixture(scope="module")
def from_dp2(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("dp2")
    ranks = run_layout(2, 1, str(out / "run"), {"job": _job(), "before": 2, "save": str(out / "ckpt"), "after": 1})
    assert [s["version"] for s in ranks[0]["steps"]] == [1, 2, 3]
    return ranks[0], str(out / "ckpt")


@pytest.mark.parametrize(("world", "tp"), [(1, 1), (2, 2)], ids=["dp1", "tp2"])
def test_a_dp2_checkpoint_resumes_at_another_layout(from_dp2: tuple[dict[str, Any], str], tmp_path: Any,
                                                    world: int, tp: int) -> None:
    uninterrupted, ckpt = from_dp2
    resumed = run_layout(world, tp, str(tmp_path), {"job": _job(), "load": ckpt, "after": 1})
    for rank in resumed:
        assert rank["loaded_version"] == 2 and [s["version"] for s in rank["steps"]] == [3]
        diffs = step_diffs(uninterrupted, rank, slice(2, 3))
        print(f"dp2 -> world {world} tp {tp} rank {rank['rank']}: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert max(diffs.values()) < TOL, diffs


def test_a_one_process_checkpoint_resumes_at_dp2(tmp_path: Any) -> None:
    cfg = {"job": _job(), "before": 2, "save": str(tmp_path / "ckpt"), "after": 1}
    (uninterrupted,) = run_layout(1, 1, str(tmp_path / "run"), cfg)
    resumed = run_layout(2, 1, str(tmp_path / "resumed"), {"job": _job(), "load": str(tmp_path / "ckpt"), "after": 1})
    for rank in resumed:
        assert rank["loaded_version"] == 2
        diffs = step_diffs(uninterrupted, rank, slice(2, 3))
        print(f"world 1 -> dp2 rank {rank['rank']}: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
        assert max(diffs.values()) < TOL, diffs


def test_a_torch_adamw_folder_does_not_load_into_megatrons_optimizer(tmp_path: Any) -> None:
    from dataclasses import replace

    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.checkpoint_io import load_actor, save_actor
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.checkpoint.folder import CheckpointError
    from tests.support.parallel_ranks import VOCAB

    def actor(distributed_optimizer: bool) -> MegatronActor:
        spec = AsyncRLJobSpec.model_validate(_job(distributed_optimizer))
        return MegatronActor(replace(ActorSettings.from_spec(spec, VOCAB), device="cpu"))

    save_actor(actor(False), str(tmp_path / "adamw"))
    with pytest.raises(CheckpointError, match="holds a torch AdamW's state and this actor runs megatron's optimizer"):
        load_actor(actor(True), str(tmp_path / "adamw"))
    save_actor(actor(True), str(tmp_path / "megatron"))
    with pytest.raises(CheckpointError, match="holds megatron's optimizer state .* this actor runs the torch AdamW"):
        load_actor(actor(False), str(tmp_path / "megatron"))


def test_a_bf16_actor_resumes_with_its_fp32_ewma_state(tmp_path: Any) -> None:
    """``precision: bf16`` (the GPU default) on the CPU shim: bf16 params, fp32 main params in megatron's
    distributed optimizer, the EWMA ``theta_prox`` kept in fp32 and saved as fp32 beside its bf16 parameter;
    a fresh actor resumes it exactly (log-probs, the next step's loss and weights)."""
    from dataclasses import replace

    import torch

    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.checkpoint_io import load_actor, save_actor
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from tests.support.parallel_ranks import VOCAB, _batch

    cfg = job("ewma")
    cfg["actor"] = {"megatron": {"precision": "bf16"}}
    settings = replace(ActorSettings.from_spec(AsyncRLJobSpec.model_validate(cfg), VOCAB), device="cpu")
    actor = MegatronActor(settings)
    assert {p.dtype for p in actor._params} == {torch.bfloat16}
    batch = _batch(actor)
    assert all(actor.train_step(batch).applied for _ in range(2))
    theta = actor.old_logits.state_dict()["ewma"]["params"]
    assert {t.dtype for t in theta.values()} == {torch.float32}  # fp32 beside bf16 parameters
    save_actor(actor, str(tmp_path / "ckpt"))
    fresh = MegatronActor(settings)
    load_actor(fresh, str(tmp_path / "ckpt"))
    assert fresh.version == 2
    resumed = fresh.old_logits.state_dict()["ewma"]["params"]
    assert all(resumed[k].dtype == torch.float32 and torch.equal(resumed[k], v) for k, v in theta.items())
    assert torch.equal(actor.logprobs(batch.tokens), fresh.logprobs(batch.tokens))
    a, b = actor.train_step(batch), fresh.train_step(batch)
    assert a.loss == b.loss and a.grad_norm == b.grad_norm
    assert all(torch.equal(p, q) for p, q in zip(actor._params, fresh._params, strict=True))
