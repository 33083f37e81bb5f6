"""A broadcast group member that dies fails the collective instead of hanging it (three real processes on
gloo): the source's send raises once the dead member's sockets are closed, the source then drops its group
(as ``ActorSync.send`` does), and the surviving receiver's receive raises too -- so the driver can hand the
version over through the object store and form the group again (trainer/driver/loop/weight_sync.py)."""

import gc
import os
from typing import Any

import pytest
import torch

from asyncrl.trainer.collective.endpoint import LOOPBACK, Endpoint, new_endpoint
from asyncrl.trainer.weight_sync.broadcast import open_group, receive_version, send
from asyncrl.trainer.weight_sync.buckets import pack_buckets
from tests.support.rank_processes import rank_context

WORLD = 3
TIMEOUT_S = 240.0  # far above what a failing collective takes; a hang would end in a timeout error instead


def _member(rank: int, endpoint: Endpoint, results: Any) -> None:
    torch.set_num_threads(1)
    group = open_group(endpoint, rank, WORLD, src=0, backend="gloo", timeout_s=TIMEOUT_S)
    if rank == 2:
        os._exit(0)  # dies right after joining: its sockets close, as a killed rollout worker's do
    if rank == 0:
        model = {f"w{i}": torch.randn(256, 256) for i in range(8)}
        try:
            for version in (1, 2, 3):  # the first send may still fit the kernel buffers of the dead peer
                send(group, pack_buckets(model.items(), version=version, bucket_bytes=2**18))
            results.put((rank, "no error"))
        except Exception as exc:  # noqa: BLE001 -- what the test inspects
            results.put((rank, f"{type(exc).__name__}: {exc}"))
        del group  # ActorSync.send drops the broken group: its sockets close, the survivors' receive fails
        gc.collect()
        return
    try:
        for version in (1, 2, 3):
            receive_version(group, version)
        results.put((rank, "no error"))
    except Exception as exc:  # noqa: BLE001
        results.put((rank, f"{type(exc).__name__}: {exc}"))


@pytest.mark.slow  # three processes importing torch: ~40 s on loaded cores
def test_a_dead_member_fails_the_broadcast_for_everyone_without_a_timeout() -> None:
    ctx = rank_context()
    results = ctx.Queue()
    endpoint = new_endpoint(LOOPBACK)
    procs = [ctx.Process(target=_member, args=(r, endpoint, results)) for r in range(WORLD)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=2 * TIMEOUT_S) for _ in range(2))
    for p in procs:
        p.join(timeout=60)
    assert set(got) == {0, 1}, got
    for rank, message in got.items():
        assert message != "no error", (rank, message)
        assert "timeout" not in message.lower() and "timed out" not in message.lower(), (rank, message)
