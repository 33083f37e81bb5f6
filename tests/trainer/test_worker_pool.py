"""``WorkerPool``: the rollout workers' slots and the training calls in flight, one transition at a time.

Clock readings are passed in, so every idle figure below is exact arithmetic on them."""

import pytest

from asyncrl.trainer.driver.loop.workers import GenerateCall, WorkerPool


def _call(ref: str, worker: int, groups: int = 1, admitted_at: int = 0) -> GenerateCall:
    return GenerateCall(ref, worker, groups, admitted_at)  # type: ignore[arg-type]  -- a string stands for a ref


def test_admit_and_return_move_a_slot_between_idle_and_generating() -> None:
    pool = WorkerPool(2, now=10.0)
    assert pool.leave_idle(0, now=13.0) == 3.0  # idle from 10 to 13
    pool.admitted(_call("a", 0, groups=2, admitted_at=5))
    assert pool.generating() == {0} and pool.in_flight == 1 and "a" in pool
    assert pool.admitted_versions() == [5]
    assert pool.restart_idle_clocks(now=20.0) == [10.0]  # only slot 1 idles: 10 -> 20, restarted at 20
    call, own = pool.returned("a", now=25.0)
    assert own and call.groups == 2 and call.admitted_at == 5
    assert pool.slots[0].idle_since == 25.0 and pool.generating() == set() and pool.in_flight == 0
    assert pool.restart_idle_clocks(now=30.0) == [5.0, 10.0]  # slot 0 from 25, slot 1 from 20


def test_a_call_whose_worker_was_replaced_is_an_orphan() -> None:
    pool = WorkerPool(1, now=0.0)
    pool.leave_idle(0, now=0.0)
    pool.admitted(_call("old", 0, admitted_at=1))
    pool.replaced(0, now=4.0)  # the replacement idles from 4; "old" is still awaited
    assert pool.slots[0].idle_since == 4.0 and pool.generating() == set() and pool.refs() == ["old"]
    pool.leave_idle(0, now=6.0)
    pool.admitted(_call("new", 0, admitted_at=2))
    assert pool.refs() == ["old", "new"]  # admission order, the orphan first
    assert pool.admitted_versions() == [1, 2]  # the orphan may still bring tokens of version 1
    call, own = pool.returned("old", now=7.0)
    assert not own and call.ref == "old"
    assert pool.slots[0].call is not None and pool.slots[0].call.ref == "new"  # the slot is left alone
    assert pool.slots[0].idle_since is None


def test_only_an_idle_slot_can_leave_idle() -> None:
    pool = WorkerPool(1, now=0.0)
    pool.leave_idle(0, now=1.0)
    with pytest.raises(RuntimeError, match="rollout worker 0 is not idle"):
        pool.leave_idle(0, now=2.0)


def test_an_evaluation_holds_the_idle_slots_and_releases_all_but_the_busy_ones() -> None:
    pool = WorkerPool(3, now=0.0)
    pool.leave_idle(1, now=2.0)
    pool.admitted(_call("train", 1))  # slot 1 still trains when the evaluation starts
    assert pool.hold_idle(now=5.0) == [5.0, 5.0]  # slots 0 and 2 had idled 0 -> 5
    assert all(s.idle_since is None for s in pool.slots)
    pool.returned("train", now=6.0)  # drained: slot 1 idles from 6 (then evaluates)
    pool.replaced(2, now=7.0)
    pool.hold(2)  # the replacement evaluates its share again: not idle
    pool.end_pause(now=9.0)  # nothing in flight: every slot idles from 9
    assert [s.idle_since for s in pool.slots] == [9.0, 9.0, 9.0]


def test_the_pause_ends_idling_a_replaced_slot_whose_orphan_is_still_in_flight() -> None:
    pool = WorkerPool(2, now=0.0)
    pool.leave_idle(0, now=0.0)
    pool.admitted(_call("orphan", 0))
    pool.replaced(0, now=1.0)
    pool.hold_idle(now=2.0)
    pool.end_pause(now=3.0)
    assert [s.idle_since for s in pool.slots] == [3.0, 3.0]  # the replacement is free, as replaced() left it
    call, own = pool.returned("orphan", now=4.0)
    assert not own and pool.slots[0].idle_since == 3.0  # the orphan's return leaves the idle slot alone
    pool.leave_idle(0, now=5.0)  # so the replacement is admitted again (before: held forever)


def test_the_pause_ends_without_idling_a_slot_whose_own_call_is_in_flight() -> None:
    pool = WorkerPool(2, now=0.0)
    pool.leave_idle(0, now=0.0)
    pool.admitted(_call("train", 0))
    pool.hold_idle(now=2.0)
    pool.end_pause(now=3.0)
    assert [s.idle_since for s in pool.slots] == [None, 3.0]


def test_abandon_gives_up_every_call_in_admission_order() -> None:
    pool = WorkerPool(2, now=0.0)
    for ref, worker, groups in (("b", 1, 3), ("a", 0, 2)):
        pool.leave_idle(worker, now=0.0)
        pool.admitted(_call(ref, worker, groups))
    assert [(c.ref, c.groups) for c in pool.abandon()] == [("b", 3), ("a", 2)]
    assert pool.in_flight == 0 and pool.generating() == set()
    assert all(s.idle_since is None for s in pool.slots)  # the loop stops: nothing starts idling
