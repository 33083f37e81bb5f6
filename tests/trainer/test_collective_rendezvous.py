"""The actor's rendezvous (``init_process_group`` over the authenticated store, what ``compat.init_megatron``
runs for a group of ranks) with real processes: a foreign process that tries to join as rank 1 through torch's
own ``tcp://`` rendezvous is refused and counted while rank 0 waits, and the real rank 1 then joins and the
group all-reduces the right sum.

Before: the rendezvous was ``init_process_group(init_method="tcp://ip:port")``, a ``TCPStore`` on every
interface; whoever connected first as rank 1 took the seat (and could read or overwrite every key)."""

import datetime
from typing import Any

import pytest

from asyncrl.trainer.collective.endpoint import LOOPBACK, Endpoint, new_endpoint
from tests.support.rank_processes import rank_context

TIMEOUT_S = 300.0  # rank 0 waits this long for rank 1 (which starts after the foreign attempt): far above it


def _rank(rank: int, endpoint: Endpoint, ready: Any, results: Any) -> None:
    import torch
    import torch.distributed as dist

    from asyncrl.trainer.collective import groups

    class Ready(groups.StoreServer):  # type: ignore[misc]
        def __init__(self, ep: Endpoint) -> None:
            super().__init__(ep)
            ready.set()  # listening: the test lets the foreign process try now

    groups.StoreServer = Ready  # type: ignore[misc]
    groups.init_default_group(endpoint, "gloo", rank, 2, TIMEOUT_S)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    sub = torch.tensor([float(rank + 1)])  # a subgroup meets through the same store (megatron makes a dozen)
    dist.all_reduce(sub, group=dist.new_group([0, 1]))
    assert float(sub[0]) == float(t[0])
    refused = groups._DEFAULT_GROUP_SERVERS[0].refused if rank == 0 else None
    results.put((rank, float(t[0]), refused))
    dist.destroy_process_group()


def _foreign(endpoint: Endpoint, results: Any) -> None:
    import torch.distributed as dist

    try:  # knows the address (say, from a port scan) but not the token
        dist.init_process_group("gloo", init_method=f"tcp://{endpoint.host}:{endpoint.port}", rank=1, world_size=2,
                                timeout=datetime.timedelta(seconds=3))
        results.put(("foreign", "joined"))
    except Exception as exc:  # noqa: BLE001 -- what the test inspects
        results.put(("foreign", type(exc).__name__))


@pytest.mark.slow  # three spawned processes importing torch: ~1 min on loaded cores
def test_a_foreign_process_cannot_take_a_seat_in_the_actors_rendezvous() -> None:
    ctx = rank_context()
    results, ready = ctx.Queue(), ctx.Event()
    endpoint = new_endpoint(LOOPBACK)
    rank0 = ctx.Process(target=_rank, args=(0, endpoint, ready, results))
    rank0.start()
    assert ready.wait(240), "rank 0's store never listened"
    foreign = ctx.Process(target=_foreign, args=(endpoint, results))
    foreign.start()
    assert results.get(timeout=240) == ("foreign", "DistNetworkError")  # refused until its own 3 s timeout
    foreign.join(timeout=60)
    rank1 = ctx.Process(target=_rank, args=(1, endpoint, ready, results))
    rank1.start()
    got = sorted((results.get(timeout=240) for _ in range(2)), key=lambda r: r[0])
    for p in (rank0, rank1):
        p.join(timeout=60)
    assert [p.exitcode for p in (rank0, rank1, foreign)] == [0, 0, 0]
    (r0, sum0, refused), (r1, sum1, _) = got
    assert (r0, r1) == (0, 1) and sum0 == sum1 == 3.0  # 1 + 2: the real rank 1 is the one in the group
    assert refused >= 1  # every connection of the foreign attempt was refused and counted
