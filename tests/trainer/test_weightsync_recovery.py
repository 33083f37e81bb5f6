"""The driver's broadcast recovery reads typed outcomes (``trainer/driver/loop/weight_sync.py``): a member that
answers ``SyncFailed`` gets the version from the object store, the group is formed again before the next
version, a scorer that missed it has its push read the object-store copy, and ``Delivered`` answers pass through.

The Ray calls are replaced by direct calls (``.remote`` runs the method, ``ray.get`` returns its argument), so
what is checked is the driver's decision on each answer, not Ray.
"""

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from asyncrl.trainer.driver.loop import weight_sync
from asyncrl.trainer.driver.loop.weight_sync import Broadcast
from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion
from asyncrl.trainer.weight_sync.outcome import Delivered, Sent, SyncFailed, SyncOutcome

OK = Delivered(transfer_seconds=0.5, nbytes=64, handover_seconds=0.1, pause_seconds=0.2)
FIXED = Delivered(transfer_seconds=2.0, nbytes=64, handover_seconds=0.1, pause_seconds=0.3)
JOINER = "refs of the kept buckets"  # what weights_for_joiner hands out (bucket refs in the object store)


class _Method:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.remote = fn


class _Worker:
    """A rollout worker answering ``outcome`` to a broadcast handle, FIXED to the object-store copy."""

    def __init__(self, outcome: SyncOutcome) -> None:
        self.handles: list[Any] = []

        def update(handle: Any, version: int) -> SyncOutcome:
            self.handles.append(handle)
            return outcome if isinstance(handle, BroadcastVersion) else FIXED

        self.update_weights = _Method(update)


def _hosts(sent: Any, workers: list[_Worker], scorers: list[Any]) -> Any:
    actor = SimpleNamespace(send_weights=_Method(lambda v: sent), weights_for_joiner=_Method(lambda v: JOINER))
    hosts = SimpleNamespace(actor=actor, rollout=workers, weights=BroadcastVersion(4), sync=None)
    group = Broadcast("gloo", extra=scorers, members=(*workers, *scorers), formed=1)  # formed, not stale
    hosts.sync = group
    return hosts


@pytest.fixture(autouse=True)
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: refs)


def _send(hosts: Any) -> list[SyncOutcome | None]:
    return weight_sync.to_every_worker(hosts, lambda call: [call(w) for w in hosts.rollout], hosts.weights, 4)


def test_every_member_took_it_nothing_is_re_sent() -> None:
    workers = [_Worker(OK), _Worker(OK)]
    scorer = SimpleNamespace(receive_broadcast=_Method(lambda v: Delivered(transfer_seconds=0.4, nbytes=64)))
    hosts = _hosts(Sent(64, 0.3), workers, [scorer])
    assert _send(hosts) == [OK, OK]
    assert [w.handles for w in workers] == [[BroadcastVersion(4)], [BroadcastVersion(4)]]
    assert hosts.sync.members != () and hosts.weights == BroadcastVersion(4)  # the group stays as it is


def test_a_worker_that_missed_the_version_takes_it_from_the_object_store() -> None:
    workers = [_Worker(OK), _Worker(SyncFailed("RuntimeError: peer gone"))]
    hosts = _hosts(SyncFailed("RuntimeError: peer gone"), workers, [])
    assert _send(hosts) == [OK, FIXED]  # the second worker's answer is its object-store hand-over's
    assert workers[1].handles == [BroadcastVersion(4), JOINER] and workers[0].handles == [BroadcastVersion(4)]
    assert hosts.sync.members == ()  # formed again before the next version
    assert hosts.weights == BroadcastVersion(4)  # no scorer missed it: their push reads the broadcast handle


def test_a_scorer_that_missed_the_version_reads_the_object_store_copy() -> None:
    scorer = SimpleNamespace(receive_broadcast=_Method(lambda v: SyncFailed("this scorer is in no broadcast group")))
    hosts = _hosts(Sent(64, 0.3), [_Worker(OK)], [scorer])
    assert _send(hosts) == [OK]
    assert hosts.sync.members == () and hosts.weights == JOINER
