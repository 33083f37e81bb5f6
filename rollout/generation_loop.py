"""What both backends share around their token loop: the weight hand-over, interrupt/hold, the frame of
``generate`` and the token boundary (``rollout/engine.py``'s module docstring states the semantics).

A backend (``hf_engine.HFEngine``, ``vllm_engine.VLLMEngine``) subclasses :class:`BoundaryEngine` and
writes only its token loop, over a :class:`TokenBatch`::

    batch = TokenBatch.start(self, episodes, max_new_tokens, partial_rollout)
    while (at := batch.boundary()) is not Boundary.STOP:
        if at is Boundary.SWAPPED:
            ...  # new weights: recompute every row's KV cache from its prefix
        version = self.version
        ...  # one forward / step over batch.rows; a failure raises batch.failure(...)
        ...  # append the tokens (engine.add_sampled_token), drop finished rows from batch.rows

so the order of the checks at a token boundary, what a weight swap mid-trajectory counts and what an
interrupt leaves behind are written once, here.
"""

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Generic, Protocol, TypeVar

import torch

from asyncrl.rollout.engine import RolloutError
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus

W = TypeVar("W")  # a backend's private copy of a weight update (what ``_copy`` makes and ``_apply`` installs)
S = TypeVar("S")  # what a backend's ``_begin`` hands its token loop (model and sampler, a seed source)


class BoundaryCounters(Protocol):
    """The counters of an engine that this module keeps (each backend's counters dataclass has them)."""

    swaps_in_flight: int  # weight updates applied while episodes were in flight
    updates_superseded: int  # pending updates replaced by a newer one before being applied
    interrupts: int


class BoundaryWeightSwap(Generic[W]):
    """The weight hand-over both backends share (``update_weights`` in ``rollout/engine.py``'s docstring).

    ``load_weights`` applies at once and is refused while a generate runs. ``update_weights`` when idle:
    applied now; while generating: it waits in ``_pending`` (a newer one replaces it and is counted in
    ``counters.updates_superseded``) until the engine's loop calls :meth:`_swap_pending` at a token
    boundary. A backend provides ``_lock``, ``_generating``, ``_pending``, ``counters``, ``_copy``
    (a private copy of the caller's tensors, made outside the lock) and ``_apply`` (install them).
    """

    _lock: threading.Lock
    _generating: bool
    _pending: tuple[W, int] | None
    counters: BoundaryCounters
    # Seconds generation stood still installing weights (``_apply`` under the lock): the sync's pause,
    # apart from the transfer and the private copy made while generation still runs.
    apply_seconds: float = 0.0

    def _timed_apply(self, weights: W, version: int) -> None:
        t0 = time.perf_counter()
        self._apply(weights, version)
        self.apply_seconds += time.perf_counter() - t0

    def _copy(self, state_dict: Mapping[str, torch.Tensor]) -> W:
        raise NotImplementedError

    def _apply(self, weights: W, version: int) -> None:
        raise NotImplementedError

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        weights = self._copy(state_dict)
        with self._lock:
            if self._generating:
                raise RuntimeError(
                    f"{type(self).__name__}.load_weights: a generate() is running; use update_weights() to swap "
                    "at a token boundary"
                )
            self._pending = None
            self._timed_apply(weights, version)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        weights = self._copy(state_dict)
        with self._lock:
            if not self._generating:
                self._pending = None
                self._timed_apply(weights, version)
                return
            if self._pending is not None:
                self.counters.updates_superseded += 1
            self._pending = (weights, version)

    def _swap_pending(self) -> bool:
        """Apply a pending update now (the caller is at a token boundary); True when there was one."""
        with self._lock:
            if self._pending is None:
                return False
            weights, version = self._pending
            self._pending = None
            self._timed_apply(weights, version)
            return True


class BoundaryEngine(BoundaryWeightSwap[W], Generic[W, S]):
    """The weight hand-over (above), ``interrupt`` with ``hold``, ``resume`` and the frame of ``generate``
    (one call at a time, the held check, the generating state, the interrupt count, the deferred swap).

    A backend calls :meth:`_init_boundary` in its constructor and provides ``_begin`` (under the lock:
    raise when it cannot generate, else return what its loop needs), ``_loop_rows`` (the token loop, over
    a :class:`TokenBatch`) and optionally ``_end`` (cleanup after the loop, before the state is cleared).
    """

    _version: int  # the loaded weights' version (the backend sets it)
    _released: bool  # the engine's memory is released (the backend sets it)
    _interrupt_req: threading.Event
    _running: threading.Event
    _stopped: threading.Event
    _gen_lock: threading.Lock
    _snapshots: list[Trajectory]

    def _init_boundary(self) -> None:
        self._lock = threading.Lock()  # guards _pending, _generating, _snapshots (and the backend's state)
        self._gen_lock = threading.Lock()  # one generate at a time
        self._pending = None
        self._generating = False
        self._interrupt_req = threading.Event()
        self._running = threading.Event()  # cleared by interrupt(hold=True) until resume()
        self._running.set()
        self._stopped = threading.Event()
        self._snapshots = []

    @property
    def version(self) -> int:
        return self._version

    @property
    def released(self) -> bool:
        return self._released

    def _begin(self, seed: int | None) -> S:
        raise NotImplementedError

    def _loop_rows(self, episodes: list[Episode], max_new_tokens: int, temperature: float,
                   partial_rollout: bool, state: S) -> None:
        raise NotImplementedError

    def _end(self) -> None:
        """After the token loop (also when it raised), before the generating state is cleared."""

    def interrupt(self, timeout_s: float = 30.0, *, hold: bool = False) -> list[Trajectory]:
        with self._lock:
            if hold:
                self._running.clear()
            if not self._generating:
                return []
            self._interrupt_req.set()
        if not self._stopped.wait(timeout_s):
            raise TimeoutError(
                f"{type(self).__name__}.interrupt: generate() did not reach a token boundary within {timeout_s} s"
            )
        with self._lock:
            return list(self._snapshots)

    def resume(self) -> None:
        with self._lock:
            self._running.set()

    @property
    def held(self) -> bool:
        return not self._running.is_set()

    def generate(
        self,
        episodes: Sequence[Episode],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        partial_rollout: bool = True,
        seed: int | None = None,
    ) -> list[Episode]:
        name = type(self).__name__
        if temperature <= 0:
            raise ValueError(f"{name}.generate: temperature must be > 0, got {temperature}")
        if not self._gen_lock.acquire(blocking=False):
            raise RuntimeError(f"{name}.generate: another generate() is running on this engine")
        try:
            with self._lock:
                if not self._running.is_set():
                    # Held (interrupt(hold=True) ... resume()): a generate arriving now samples nothing and
                    # returns at once, its episodes unfinished (resumable), exactly like an interrupted one.
                    # Waiting instead would keep its caller -- and whoever waits for it, e.g. a driver
                    # collecting calls in flight before an interrupt-sync window -- blocked until resume().
                    return list(episodes)
                state = self._begin(seed)  # raises when released / never loaded
                self._generating = True
                self._snapshots = []
                self._interrupt_req.clear()
                self._stopped.clear()
            try:
                self._loop_rows(list(episodes), max_new_tokens, temperature, partial_rollout, state)
            finally:
                try:
                    self._end()
                finally:
                    with self._lock:
                        self._generating = False
                        if self._interrupt_req.is_set():
                            self.counters.interrupts += 1
                        self._interrupt_req.clear()
                    self._stopped.set()
                    self._swap_pending()  # partial_rollout False: the batch finished under the old weights
        finally:
            self._gen_lock.release()
        return list(episodes)


class Boundary(Enum):
    """What the token loop does after :meth:`TokenBatch.boundary`."""

    SAMPLE = "sample"  # go on with the same weights
    SWAPPED = "swapped"  # go on: new weights are loaded, every row's KV cache (old-weight keys/values) is stale
    STOP = "stop"  # return: interrupted (snapshots stored) or no row left


class TokenBatch(Generic[W, S]):
    """The episodes one ``generate`` call advances (``rows``, in flight) and the checks at each of its
    token boundaries. The backend's loop drops finished episodes from ``rows`` itself.

    Args:
        engine: the engine whose loop this is (its pending update, interrupt request and counters).
        rows: the episodes in flight.
        partial_rollout: a pending update applies at the next token boundary (else after the batch).
        before_swap: called right before a pending update is installed (vLLM: abort every request,
            since the prefix cache can only be reset with no request running).
    """

    def __init__(self, engine: BoundaryEngine[W, S], rows: list[Episode], *, partial_rollout: bool,
                 before_swap: Callable[[], None] | None = None) -> None:
        self.engine: BoundaryEngine[W, S] = engine
        self.rows = rows
        self.partial_rollout = partial_rollout
        self.before_swap = before_swap

    @classmethod
    def start(cls, engine: BoundaryEngine[W, S], episodes: Sequence[Episode], max_new_tokens: int, *,
              partial_rollout: bool, before_swap: Callable[[], None] | None = None) -> "TokenBatch[W, S]":
        """The unfinished ``episodes``; one that already holds ``max_new_tokens`` new tokens (a resumed
        one) ends TRUNCATED here, pending environment answer or not."""
        rows = [e for e in episodes if not e.done]
        for e in rows:
            if e.new_tokens >= max_new_tokens:
                e.finish(TrajectoryStatus.TRUNCATED, e.env.truncated_reward, False, "maxNewTokens reached")
        return cls(engine, [e for e in rows if not e.done], partial_rollout=partial_rollout,
                   before_swap=before_swap)

    def boundary(self) -> Boundary:
        """The token boundary, in this order:

        1. weight swap (``partial_rollout`` and an update pending): ``before_swap``, install it, count
           ``swaps_in_flight`` when episodes are in flight; the loop then recomputes their KV caches
           (:attr:`Boundary.SWAPPED`), so every later token is sampled and stamped with the new version
           while the prefix keeps its tokens, versions and ``logp_mu``;
        2. interrupt asked: store snapshots (status INTERRUPTED) of the rows, which stay resumable, and stop;
        3. no row left: stop.
        """
        eng = self.engine
        at = Boundary.SAMPLE
        if self.partial_rollout and eng._pending is not None:  # only this thread takes it while generating
            if self.before_swap is not None:
                self.before_swap()
            if eng._swap_pending() and self.rows:
                eng.counters.swaps_in_flight += 1
            at = Boundary.SWAPPED
        if eng._interrupt_req.is_set():
            with eng._lock:
                eng._snapshots = [e.to_trajectory(TrajectoryStatus.INTERRUPTED) for e in self.rows]
            return Boundary.STOP
        return at if self.rows else Boundary.STOP

    def failure(self, message: str) -> RolloutError:
        """A :class:`RolloutError` naming every task and trajectory in flight (a failed forward or step)."""
        tasks = ",".join(sorted({e.task for e in self.rows}))
        return RolloutError(message, task=tasks, traj_ids=[e.traj_id for e in self.rows])
