"""Sharded actor checkpoints in one process (real megatron ``dist_checkpointing`` on files): what a folder
records, a torn folder refused and the driver falling back, the former single-file ``actor.pt`` still
loading, and the warm-start cache. Resharding across layouts is in test_sharded_resume.py (spawned ranks)."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.checkpoint_io import load_actor, model_state, save_actor
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.checkpoint.folder import CheckpointError
from asyncrl.trainer.driver.run import checkpoints, recovery
from tests.support.sharded_ranks import single_file

VOCAB = 40
B, T = 4, 12


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _actor(reference: str = "ewma") -> MegatronActor:
    spec = AsyncRLJobSpec.model_validate({
        "correction": {"reference": reference},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "task": {"temperature": 1.0},
        "train": {"learningRate": 1e-2, "seed": 3, "maxGradNorm": 0.5},
    })
    return MegatronActor.from_spec(spec, VOCAB, num_threads=torch.get_num_threads())


def _batch(actor: MegatronActor, seed: int) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, 3:] = True
    logp_mu = (actor.logprobs(tokens) + 0.05 * torch.randn(B, T, generator=g)) * loss_mask
    versions = torch.where(loss_mask, torch.full((B, T), actor.version), torch.full((B, T), -1))
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None].expand(B, T).contiguous()
    turn_ids = torch.where(loss_mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -1))
    return TrainBatch(tokens, loss_mask, logp_mu, versions, advantages, turn_ids)


def _same_params(a: MegatronActor, b: MegatronActor) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a._params, b._params, strict=True))


def test_a_folder_holds_the_shards_and_a_marker_with_every_files_checksum(tmp_path: Path) -> None:
    actor = _actor()
    actor.train_step(_batch(actor, 1))
    save_actor(actor, str(tmp_path / "ckpt"))
    meta = json.loads((tmp_path / "ckpt" / "meta.json").read_text())
    on_disk = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name != "meta.json")
    assert sorted(meta["files"]) == on_disk  # every file megatron wrote is checksummed, nothing else lies there
    assert "common.pt" in on_disk and any(n.endswith(".distcp") for n in on_disk)
    assert meta["format"] == "sharded" and meta["version"] == 1
    assert meta["layout"] == {"tp": 1, "pp": 1, "dp": 1, "world": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folder left


def test_a_torn_sharded_folder_is_refused_and_the_driver_falls_back(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    actor = _actor()
    for v in (1, 2):
        actor.train_step(_batch(actor, v))
        save_actor(actor, str(checkpoints.path_for(root, actor.version)))
        recovery.save(root, recovery.DriverState(actor.version, [actor.version], {}))
    newest = checkpoints.path_for(root, 2)
    shard = next(p for p in newest.iterdir() if p.name.endswith(".distcp"))
    shard.write_bytes(shard.read_bytes()[:50])  # a disk that lost the tail of rank 0's shards
    (root / ".step-000003.tmp-4242").mkdir()  # ranks wrote, rank 0 never sealed: no marker, swept
    (root / ".step-000003.tmp-4242" / "__1_0.distcp").write_bytes(b"x")

    fresh = _actor()
    with pytest.raises(CheckpointError, match=rf"{shard.name} has 50 bytes"):
        load_actor(fresh, str(newest))
    assert fresh.version == 0  # refused before anything was loaded
    assert checkpoints.sweep_temporaries(root) == [root / ".step-000003.tmp-4242"]
    point = checkpoints.choose_resume(root)
    assert point.checkpoint is not None and point.checkpoint.version == 1
    assert f"{shard.name} has 50 bytes" in point.skipped[0].reason
    assert (root / "step-000002.corrupt").is_dir()
    load_actor(fresh, str(point.checkpoint.path))
    assert fresh.version == 1


def test_a_single_file_checkpoint_of_an_earlier_run_still_resumes(tmp_path: Path) -> None:
    actor = _actor("ewma")
    actor.train_step(_batch(actor, 1))
    single_file(actor, str(tmp_path / "old"))
    nxt = _batch(actor, 2)
    expected = actor.train_step(nxt)

    fresh = _actor("ewma")
    load_actor(fresh, str(tmp_path / "old"))
    assert fresh.version == 1
    got = fresh.train_step(nxt)  # moments and theta_prox restored, or the step would differ
    assert (got.version, got.loss, got.grad_norm) == (expected.version, expected.loss, expected.grad_norm)
    assert _same_params(actor, fresh)
    model, meta = model_state(str(tmp_path / "old"), actor.settings.arch)  # the export's reader, both formats
    assert meta["version"] == 1 and set(model) == {k for k in actor._gpt.state_dict() if not k.endswith("_extra_state")}


def test_the_export_reader_gives_the_whole_model_of_a_sharded_folder(tmp_path: Path) -> None:
    actor = _actor("behavior")
    actor.train_step(_batch(actor, 1))
    save_actor(actor, str(tmp_path / "ckpt"))
    model, meta = model_state(str(tmp_path / "ckpt"), actor.settings.arch)
    live = {k: v for k, v in actor._gpt.state_dict().items() if not k.endswith("_extra_state")}
    assert meta["version"] == 1 and set(model) == set(live)
    assert all(torch.equal(model[k], live[k]) for k in live)
    other = dataclasses.replace(actor.settings.arch, num_layers=2)
    with pytest.raises(CheckpointError, match="pass the job it was trained with"):
        model_state(str(tmp_path / "ckpt"), other)


def test_the_warm_start_cache_round_trips_and_a_damaged_one_is_redone(tmp_path: Path) -> None:
    from asyncrl.trainer.driver.hosts.actor_host import ActorHost

    job = {"correction": {"reference": "ewma"}, "task": {"name": "calculator", "groupSize": 2},
           "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
           "train": {"steps": 1, "promptsPerStep": 2, "warmStartSteps": 2}}
    spec_json = AsyncRLJobSpec.model_validate(job).model_dump(mode="json", by_alias=True)
    host = ActorHost(spec_json, threads=1)
    host.warm_start(0, 2, 2, threads=1, batch_size=4)
    cache = tmp_path / "warm"
    host.save_warm_start(str(cache))
    again = ActorHost(spec_json, threads=1)
    assert again.load_warm_start(str(cache))
    assert again.actor.version == 0 and _same_params(host.actor, again.actor)
    distcp = next(p for p in cache.iterdir() if p.name.endswith(".distcp"))
    distcp.write_bytes(b"\0" + distcp.read_bytes()[1:])  # same size, other bytes: the checksum says so
    third = ActorHost(spec_json, threads=1)
    assert not third.load_warm_start(str(cache))
    assert not third.load_warm_start(str(tmp_path / "none"))


@pytest.mark.parametrize("distributed", [False, True])
def test_a_loaded_warm_start_trains_at_the_jobs_own_learning_rate(tmp_path: Path, distributed: bool) -> None:
    """The cache's optimizer state carries the rate of the job that made it; a job with another
    ``train.learningRate`` that loads it trains at its own rate (it trained at the cache's before)."""
    from asyncrl.trainer.driver.hosts.actor_host import ActorHost

    def spec(lr: float) -> dict:
        job = {"correction": {"reference": "current"}, "task": {"name": "calculator", "groupSize": 2},
               "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
               "actor": {"megatron": {"distributedOptimizer": distributed}},
               "train": {"steps": 1, "promptsPerStep": 2, "warmStartSteps": 2, "learningRate": lr}}
        return AsyncRLJobSpec.model_validate(job).model_dump(mode="json", by_alias=True)

    maker = ActorHost(spec(3e-4), threads=1)
    maker.warm_start(0, 2, 2, threads=1, batch_size=4)
    assert maker.actor.optimizer.learning_rate() == pytest.approx(3e-4)
    cache = tmp_path / "warm"
    maker.save_warm_start(str(cache))
    other = ActorHost(spec(1e-5), threads=1)
    assert other.actor.optimizer.learning_rate() == pytest.approx(1e-5)
    assert other.load_warm_start(str(cache))
    assert other.actor.optimizer.learning_rate() == pytest.approx(1e-5)
