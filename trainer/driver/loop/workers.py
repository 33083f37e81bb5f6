"""The rollout workers as the loop keeps them: one :class:`WorkerSlot` per worker index, in a :class:`WorkerPool`.

A slot is *idle* (since when: where its share of ``asyncrl_rollout_idle_seconds_total`` starts), *generating*
(its training call: admitted at which actor version, holding how many groups of the staleness buffer) or
*held* (neither: an evaluation runs on it). The transitions are the pool's methods, one per event of the
loop, the evaluation or a stage; every clock reading comes in as ``now`` (monotonic seconds).

A worker replaced while its call is in flight leaves that call *orphaned*: still awaited (when it fails its
groups are counted as aborted, and no second replacement starts), but no longer its slot's, so the
replacement can be admitted meanwhile. That is why the calls are kept beside the slots, in admission order
(the order ``ray.wait`` is given them).
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray import ObjectRef


@dataclass(frozen=True)
class GenerateCall:
    """One training ``generate`` call in flight."""

    ref: "ObjectRef"
    worker: int  # the slot it was admitted at
    groups: int  # groups reserved in the staleness buffer for it
    admitted_at: int  # the actor version when it was admitted (its tokens are of this version or newer)


@dataclass
class WorkerSlot:
    """Rollout worker ``index``: idle since ``idle_since``, or running ``call``, or held (both None)."""

    index: int
    idle_since: float | None  # monotonic seconds; None: not idle
    call: GenerateCall | None = None  # the training call of the process now at this index

    @property
    def idle(self) -> bool:
        return self.idle_since is not None


class WorkerPool:
    """Every rollout worker's slot and every training call in flight (orphans included)."""

    def __init__(self, workers: int, now: float) -> None:
        self.slots = [WorkerSlot(i, now) for i in range(workers)]  # all idle from the start
        self._calls: dict[ObjectRef, GenerateCall] = {}  # in admission order

    # ------------------------------------------------------------------ what is in flight
    def refs(self) -> list["ObjectRef"]:
        """The training calls in flight, orphans included, in admission order."""
        return list(self._calls)

    def __contains__(self, ref: object) -> bool:
        return ref in self._calls

    @property
    def in_flight(self) -> int:
        """Training calls in flight (orphans included)."""
        return len(self._calls)

    def admitted_versions(self) -> list[int]:
        """The actor version each call in flight was admitted at (a call may still produce any later one)."""
        return [c.admitted_at for c in self._calls.values()]

    def generating(self) -> set[int]:
        """The slots whose current process runs a training call (an orphan's slot may be free)."""
        return {s.index for s in self.slots if s.call is not None}

    # ------------------------------------------------------------------ the loop's transitions
    def leave_idle(self, i: int, now: float) -> float:
        """Slot ``i`` stops idling (a call is about to be admitted there); returns the seconds it idled."""
        slot = self.slots[i]
        if slot.idle_since is None:
            raise RuntimeError(f"rollout worker {i} is not idle (running {slot.call})")
        seconds, slot.idle_since = now - slot.idle_since, None
        return seconds

    def admitted(self, call: GenerateCall) -> None:
        """``call`` now runs at its slot."""
        self._calls[call.ref] = call
        self.slots[call.worker].call = call

    def returned(self, ref: "ObjectRef", now: float) -> tuple[GenerateCall, bool]:
        """Call ``ref`` came back (answer or error): it leaves the pool. Returns it, and whether it was its
        slot's own call (then the slot idles from ``now``); False for an orphan, whose slot is left alone."""
        call = self._calls.pop(ref)
        slot = self.slots[call.worker]
        own = slot.call is call
        if own:
            slot.call, slot.idle_since = None, now
        return call, own

    def replaced(self, i: int, now: float) -> None:
        """A new process runs at slot ``i``, idle from ``now``; the old one's call in flight (if any) is orphaned."""
        slot = self.slots[i]
        slot.call, slot.idle_since = None, now

    def abandon(self) -> list[GenerateCall]:
        """The loop stops: every call in flight is given up (returned, in admission order) and forgotten."""
        calls = list(self._calls.values())
        self._calls.clear()
        for slot in self.slots:
            slot.call = None
        return calls

    def restart_idle_clocks(self, now: float) -> list[float]:
        """The idle seconds of every idle slot up to ``now``, whose clocks then restart at ``now``."""
        out = []
        for slot in self.slots:
            if slot.idle_since is not None:
                out.append(now - slot.idle_since)
                slot.idle_since = now
        return out

    # ------------------------------------------------------------------ the evaluation's transitions
    def hold_idle(self, now: float) -> list[float]:
        """An evaluation pauses admission: every idle slot is held; returns the seconds each had idled."""
        out = []
        for slot in self.slots:
            if slot.idle_since is not None:
                out.append(now - slot.idle_since)
                slot.idle_since = None
        return out

    def hold(self, i: int) -> None:
        """Slot ``i`` is held (a replacement that evaluates its share again is not idle)."""
        self.slots[i].idle_since = None

    def end_pause(self, now: float) -> None:
        """The evaluation is over: every slot idles from ``now`` unless its own process still runs a training
        call. The pause was not rollout idle time. An orphan does not keep its slot busy, as in :meth:`replaced`:
        the replacement is free, and the orphan's return leaves the slot alone (were the slot held here, nothing
        would ever idle it again, and with one worker the loop would wait for a call that is never admitted)."""
        for slot in self.slots:
            if slot.call is None:
                slot.idle_since = now
