"""The actor side of weight sync publishes through the transport registry (``weight_sync.transport``): the
configured transport's handle on rank 0, nothing (and no gathers) on the others, a receiver takes a version
through the transport its handle names, and every result that crosses Ray is a typed record that pickles."""

import pickle
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from asyncrl.api.validation import validate_job
from asyncrl.api.weight_sync import WeightTransport
from asyncrl.trainer.megatron.convert import hf_to_megatron, megatron_to_hf
from asyncrl.trainer.megatron.hf_folder import load_hf
from asyncrl.trainer.oldlogits.score_result import ScoreResult
from asyncrl.trainer.weight_sync import actor_side
from asyncrl.trainer.weight_sync.actor_side import ActorSync
from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion
from asyncrl.trainer.weight_sync.disk import DiskVersion
from asyncrl.trainer.weight_sync.outcome import Delivered, Sent, SyncFailed
from asyncrl.trainer.weight_sync.transport import TRANSPORTS, make_transport, receive, transport_of
from tests.support.hf_models import folder_arch, tiny_folder

JOB = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "ws"},
       "spec": {"task": {"name": "calculator"}, "model": {"rolloutDtype": "bfloat16"},
                "actor": {"weightSync": {"bucketMiB": 1}}}}


@pytest.fixture(scope="module")
def actor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """What ActorSync reads of the actor: its megatron parameters, architecture and version."""
    folder = tiny_folder(tmp_path_factory.mktemp("ws"), "llama")
    arch = folder_arch(folder)
    mcore = hf_to_megatron(load_hf(str(folder)), arch)
    return SimpleNamespace(named_weights=lambda: mcore, settings=SimpleNamespace(arch=arch, lora=None), version=5)


def _spec() -> Any:
    return validate_job(JOB).spec


def test_the_registry_has_every_transport_of_the_spec() -> None:
    assert set(TRANSPORTS) == set(WeightTransport)
    for t in WeightTransport:
        assert make_transport(t.value).name is t
    assert {transport_of(h).name for h in (BroadcastVersion(1), DiskVersion(1, "/nowhere"))} == {
        WeightTransport.BROADCAST, WeightTransport.DISK}


def test_disk_publish_on_rank_0_is_received_bit_for_bit(actor: Any, tmp_path: Path) -> None:
    sync = ActorSync(_spec(), rank=0, tp=1, transport=WeightTransport.DISK, disk_root=str(tmp_path), disk_keep=2)
    handle = sync.publish(actor)
    assert handle == DiskVersion(5, str(tmp_path / "v00000005"))
    got = receive(handle)
    expected = {k: v.to(torch.bfloat16) for k, v in megatron_to_hf(actor.named_weights(), actor.settings.arch).items()}
    assert got.version == 5 and set(got.state) == set(expected)
    assert all(torch.equal(got.state[k], v) for k, v in expected.items())
    assert got.nbytes == sum(v.numel() * 2 for v in expected.values())  # bf16 on the wire


def test_disk_without_a_folder_is_refused_on_rank_0_only(actor: Any) -> None:
    with pytest.raises(RuntimeError, match=r"did not configure the folder \(configure_sync\)"):
        ActorSync(_spec(), rank=0, tp=1, transport=WeightTransport.DISK).publish(actor)
    assert ActorSync(_spec(), rank=1, tp=1, transport=WeightTransport.DISK).publish(actor) is None


def test_broadcast_publish_names_the_version_and_reads_no_bucket(actor: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def unread(*_: Any, **__: Any) -> Iterator[Any]:
        raise AssertionError("the buckets were read (a TP gather ran) at publish")
        yield  # a generator, as the real ones: only reading it raises

    monkeypatch.setattr(actor_side, "actor_buckets", unread)
    monkeypatch.setattr(actor_side, "hf_tensors", unread)
    assert ActorSync(_spec(), rank=0, tp=2, transport=WeightTransport.BROADCAST).publish(actor) == BroadcastVersion(5)
    assert ActorSync(_spec(), rank=1, tp=2, transport=WeightTransport.BROADCAST).publish(actor) is None


def test_a_tensor_parallel_rank_joins_the_gathers_of_a_transport_that_reads_at_publish(
        actor: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    joined: list[int] = []
    monkeypatch.setattr(actor_side, "_join_gathers", lambda a: joined.append(int(a.version)))
    assert ActorSync(_spec(), rank=1, tp=2, transport=WeightTransport.DISK, disk_root=str(tmp_path)).publish(actor) is None
    assert joined == [5]
    assert ActorSync(_spec(), rank=1, tp=1, transport=WeightTransport.DISK, disk_root=str(tmp_path)).publish(actor) is None
    assert joined == [5]  # TP = 1: no gather to join


def test_a_handle_of_another_transport_is_refused_with_both_names(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"weight sync \(disk\): cannot receive a BroadcastVersion"):
        make_transport("disk").receive(BroadcastVersion(3))


def test_a_send_without_a_group_is_refused(actor: Any) -> None:
    with pytest.raises(RuntimeError, match="no group formed"):
        ActorSync(_spec(), rank=0, tp=1, transport=WeightTransport.BROADCAST).send(actor, 5)
    with pytest.raises(RuntimeError, match="asked to send version 4, the actor holds 5"):
        ActorSync(_spec(), rank=0, tp=1, transport=WeightTransport.BROADCAST).send(actor, 4)


def test_the_records_that_cross_ray_pickle_and_tell_failure_by_type() -> None:
    records = [Delivered(transfer_seconds=0.5, nbytes=64, handover_seconds=0.1, pause_seconds=0.2), Sent(64, 0.3),
               SyncFailed("RuntimeError: peer gone"),
               ScoreResult(scores=[([1, 2], [-0.5, -1.0])], tokens=2, release_seconds=0.0, score_seconds=0.4,
                           acquire_seconds=0.0, scorer_build_seconds=1.0, scorer_load_seconds=0.2)]
    assert [pickle.loads(pickle.dumps(r)) for r in records] == records
    assert [isinstance(r, SyncFailed) for r in records] == [False, False, True, False]
