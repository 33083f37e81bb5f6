"""Broadcast manifests travel as JSON with caps (weight_sync/manifest_wire.py): a real manifest survives bit for
bit, every hostile row is one clear refusal naming the field, and a receiver in a real gloo group checks the
sizes a source announces before it allocates anything.

Before: the manifest was ``pickle.loads``-ed from the wire and a receiver allocated ``torch.empty(n)`` of
whatever length ``n`` the wire said (1 TiB asked = 1 TiB attempted)."""

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from asyncrl.trainer.collective.endpoint import LOOPBACK, new_endpoint
from asyncrl.trainer.weight_sync.broadcast import SyncGroup, open_group, receive_version, send
from asyncrl.trainer.weight_sync.buckets import pack_buckets
from asyncrl.trainer.weight_sync.manifest_wire import (
    MAX_MANIFEST_BYTES,
    ManifestError,
    check_length,
    decode,
    encode,
)
from tests.support.hostile_broadcast import BASE, HOSTILE_MANIFESTS, HostileManifest


def test_a_real_manifest_and_the_end_marker_survive_the_wire() -> None:
    assert decode(encode(BASE)) == BASE
    assert encode(None) == b"null" and decode(b"null") is None
    tensors = {"w": torch.randn(40, 30), "b": torch.randn(7).bfloat16(), "s": torch.tensor(2.0), "e": torch.zeros(0, 3)}
    for bucket in pack_buckets(tensors.items(), version=5, bucket_bytes=256):
        assert decode(encode(bucket.manifest)) == bucket.manifest


@pytest.mark.parametrize("row", HOSTILE_MANIFESTS, ids=lambda r: r.id)
def test_a_hostile_manifest_is_one_clear_refusal(row: HostileManifest) -> None:
    obj = row.mutate(json.loads(encode(BASE)))
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(ManifestError) as err:
        decode(raw)
    message = str(err.value)
    assert "\n" not in message and message.startswith("weight sync (broadcast): "), message
    assert row.field in message and row.message in message, message


@pytest.mark.parametrize("n", [0, -1, MAX_MANIFEST_BYTES + 1, 1 << 40])
def test_a_manifest_length_outside_the_cap_is_refused(n: int) -> None:
    with pytest.raises(ManifestError, match=f"announces a {n}-byte manifest; it must be in \\[1, {MAX_MANIFEST_BYTES}\\]"):
        check_length(n)


def _group_of_two(body: Any) -> list[Any]:
    endpoint = new_endpoint(LOOPBACK)

    def member(rank: int) -> Any:
        group = open_group(endpoint, rank, 2, backend="gloo", timeout_s=60)
        try:
            return body(group)
        except ManifestError as exc:
            return exc

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(member, range(2)))


def _hostile_source(announce: list[bytes | int]) -> Any:
    """Rank 0 broadcasts ``announce`` as a source would (an int: a manifest length; bytes: a manifest)."""

    def body(group: SyncGroup) -> Any:
        if group.rank == 1:
            return receive_version(group, 1)
        for item in announce:
            if isinstance(item, int):
                group._bcast(torch.tensor([item], dtype=torch.int64))
            else:
                group._bcast(torch.frombuffer(bytearray(item), dtype=torch.uint8))
        return None

    return body


@pytest.fixture
def allocations(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes ``torch.empty`` is asked for while the test runs (the receiver's buffers)."""
    asked: list[int] = []
    real = torch.empty

    def spy(*size: Any, **kwargs: Any) -> torch.Tensor:
        asked.append(int(torch.Size(size[0] if len(size) == 1 and not isinstance(size[0], int) else size).numel()))
        return real(*size, **kwargs)

    monkeypatch.setattr(torch, "empty", spy)
    return asked


def test_a_receiver_refuses_a_1tib_manifest_length_before_allocating(allocations: list[int]) -> None:
    _, got = _group_of_two(_hostile_source([1 << 40]))
    assert isinstance(got, ManifestError) and "announces a 1099511627776-byte manifest" in str(got)
    assert max(allocations, default=0) <= 1  # only the 1-element length tensor: nothing of the announced size


def test_a_receiver_refuses_a_1tib_bucket_before_allocating(allocations: list[int]) -> None:
    raw = json.dumps({"version": 1, "index": 0, "nbytes": 1 << 40, "entries": []}).encode()
    _, got = _group_of_two(_hostile_source([len(raw), raw]))
    assert isinstance(got, ManifestError) and "nbytes 1099511627776 is over this receiver's cap" in str(got)
    assert max(allocations) == len(raw)  # the manifest's own buffer, never the bucket's 1 TiB


def test_a_pickled_manifest_is_refused_and_runs_nothing(tmp_path: Any) -> None:
    canary = tmp_path / "ran"

    class Payload:
        def __reduce__(self) -> Any:
            return (open, (str(canary), "w"))

    import pickle

    raw = pickle.dumps(Payload())
    _, got = _group_of_two(_hostile_source([len(raw), raw]))
    assert isinstance(got, ManifestError) and "is not JSON" in str(got)
    assert not canary.exists()  # the old receiver's pickle.loads would have created it


def test_a_real_version_still_crosses_the_group_bit_for_bit() -> None:
    model = {"w": torch.randn(64, 48), "b": torch.randn(5)}

    def body(group: SyncGroup) -> Any:
        if group.rank == 0:
            return send(group, pack_buckets(model.items(), version=1, bucket_bytes=4096, dtype=torch.bfloat16))
        return {k: v.clone() for k, v in receive_version(group, 1).state.items()}

    (nbytes, _), state = _group_of_two(body)
    assert nbytes == (64 * 48 + 5) * 2  # bf16 payload, padding excluded
    assert all(torch.equal(state[k], v.bfloat16()) for k, v in model.items())

