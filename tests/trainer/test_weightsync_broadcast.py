"""The broadcast transport on gloo with three real processes: the source packs a model's HF tensors in
buckets, both receivers reassemble them bit for bit, two versions in a row (the protocol's end marker
keeps versions apart); through the transport registry, as the actor and the receivers use it."""

from typing import Any

import numpy as np
import pytest
import torch

from asyncrl.trainer.collective.endpoint import LOOPBACK, Endpoint, new_endpoint
from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion, open_group
from asyncrl.trainer.weight_sync.buckets import pack_buckets
from asyncrl.trainer.weight_sync.transport import make_transport
from tests.support.rank_processes import rank_context

WORLD = 3


def _model(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    # Mixed sizes: 40 KB tensors over 16 KiB buckets (each alone), small ones sharing buckets.
    return {"big.weight": torch.randn(100, 100, generator=g), "small.bias": torch.randn(7, generator=g),
            "norm.weight": torch.randn(33, generator=g), "other.weight": torch.randn(3, 5, generator=g)}


def _member(rank: int, endpoint: Endpoint, results: Any) -> None:
    torch.set_num_threads(1)
    group = open_group(endpoint, rank, WORLD, src=0, backend="gloo", timeout_s=60)
    t = make_transport("broadcast", group=group)
    for version in (1, 2):
        if rank == 0:
            buckets = pack_buckets(_model(version).items(), version=version, bucket_bytes=16384, dtype=torch.bfloat16)
            assert t.publish(buckets, version) == BroadcastVersion(version)  # the handle; the bytes leave in send
            t.send(buckets)
        else:
            got = t.receive(BroadcastVersion(version)).state
            # Plain bytes through the queue (a shared tensor would die with this process): bf16 -> fp32 is exact.
            results.put((rank, version, {k: (str(v.dtype), v.float().numpy().tobytes(), tuple(v.shape))
                                         for k, v in got.items()}))


@pytest.mark.slow  # three processes importing torch: 40-75 s on loaded cores
def test_broadcast_on_gloo_reaches_every_receiver_bit_exactly() -> None:
    ctx = rank_context()
    results = ctx.Queue()
    endpoint = new_endpoint(LOOPBACK)
    procs = [ctx.Process(target=_member, args=(r, endpoint, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range((WORLD - 1) * 2)]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * WORLD
    assert sorted((r, v) for r, v, _ in got) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for _, version, state in got:
        expected = {k: v.to(torch.bfloat16) for k, v in _model(version).items()}
        assert list(state) == list(expected)
        for k, v in expected.items():
            dtype, raw, shape = state[k]
            assert dtype == "torch.bfloat16" and shape == tuple(v.shape), k
            assert torch.equal(torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).view(shape), v.float()), k
