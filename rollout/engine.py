"""The rollout engine interface: versioned sampling with per-token ``logp_mu``, weight updates at
token boundaries, interrupts, and release/acquire of the engine's memory.

Semantics every backend keeps:

- ``logp_mu`` of a sampled token is ``log softmax(z / T)[token]`` with ``z`` the engine's logits
  upcast to float32 and ``T`` the task temperature: the log-prob under the distribution actually
  sampled from. The actor must apply the same ``T`` when it computes ``logp_theta``/``logp_old``.
- ``versions[t]`` is the weight version loaded when token ``t`` was sampled; prompt and
  environment tokens carry ``-1``.
- ``update_weights`` may be called from another thread while ``generate`` runs. It takes effect at
  the next token boundary when ``partial_rollout`` is True (every in-flight episode continues under
  the new version; its KV cache is recomputed from the whole prefix under the new weights), and
  after the batch has finished under the old weights when it is False.
- ``interrupt`` stops a running ``generate`` at the next token boundary and returns snapshots of
  the unfinished episodes (status ``INTERRUPTED``); ``generate`` then returns with those episodes
  left resumable (``done`` False). Passing them to a later ``generate`` continues them. With
  ``hold=True`` no token is sampled anywhere until ``resume()`` (the interrupt-sync window:
  interrupt+hold, compute old logits with the resident version, update weights, resume); a
  ``generate`` called while held returns at once with its episodes unfinished, never waits.
"""

import concurrent.futures
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from asyncrl.rollout.envs.base import EnvStep
from asyncrl.rollout.envs.runner import EnvFault
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus


class RolloutError(RuntimeError):
    """An environment or engine failure, naming the task and the trajectories it hit."""

    def __init__(self, message: str, *, task: str, traj_ids: Sequence[str]) -> None:
        self.task = task
        self.traj_ids = tuple(traj_ids)
        shown = ", ".join(self.traj_ids[:8]) + (
            f" (+{len(self.traj_ids) - 8} more)" if len(self.traj_ids) > 8 else ""
        )
        super().__init__(f"{message} [task {task}, trajectories {shown}]")


class EngineReleasedError(RuntimeError):
    """The engine's model is released; call ``acquire()`` first."""


@runtime_checkable
class RolloutEngine(Protocol):
    """A sampling backend for multi-turn episodes (transformers today, vLLM later)."""

    @property
    def version(self) -> int:
        """Version of the weights new tokens are sampled with (-1 before any load)."""
        ...

    @property
    def released(self) -> bool: ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load HF-named weights now (the engine must be idle)."""
        ...

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Thread-safe weight update; applied at a token boundary (see the module docstring)."""
        ...

    def generate(
        self,
        episodes: Sequence[Episode],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        partial_rollout: bool = True,
        seed: int | None = None,
    ) -> list[Episode]:
        """Advance ``episodes`` until each is done or an interrupt arrives; returns them (same order)."""
        ...

    def interrupt(self, timeout_s: float = 30.0, *, hold: bool = False) -> list[Trajectory]:
        """Stop a running ``generate`` at the next token boundary; snapshots of its unfinished episodes.

        ``hold``: also keep every ``generate`` from sampling until :meth:`resume` (an idle engine
        returns ``[]``; a ``generate`` that starts later returns at once, its episodes unfinished), so
        no token of the current version is produced after the interrupt: what interrupt-sync needs.
        """
        ...

    def resume(self) -> None:
        """End a hold set by ``interrupt(hold=True)``."""
        ...

    def release(self) -> None:
        """Drop the model and KV memory, keeping a host copy of the last loaded weights."""
        ...

    def acquire(self) -> None:
        """Rebuild the model with the last loaded weights (and apply a weight update that arrived meanwhile)."""
        ...


def end_at_budget(e: Episode, max_new_tokens: int) -> None:
    """Truncate ``e`` once it holds ``max_new_tokens`` new tokens (sampled and forced alike); an
    episode waiting for its environment's answer is judged after the answer (it may end it)."""
    if not e.done and e.pending is None and e.new_tokens >= max_new_tokens:
        e.finish(TrajectoryStatus.TRUNCATED, e.env.truncated_reward, False, "maxNewTokens reached")


def _apply(e: Episode, step: EnvStep) -> None:
    if step.done:
        e.finish(TrajectoryStatus.FINISHED, step.reward, step.success, step.reason)
    elif step.tokens:
        e.forced.extend(step.tokens)
        e.turn += 1
        e.turn_text = ""


def settle(e: Episode, max_new_tokens: int, *, wait: bool) -> bool:
    """Take the environment's answer to ``e``'s pending turn if it is there (``wait``: wait for it).

    Returns True when nothing is pending any more. A fault of user code (exception, timeout, NaN
    reward, garbage messages) aborts ``e`` alone (``e.env_error``); nothing raises.
    """
    if e.pending is None:
        return True
    msg, fut = e.pending
    if not wait and not fut.done():
        return False
    e.pending = None
    env = e.turn_level
    if env is None:  # only a turn-level environment's turn is ever pending (add_sampled_token)
        raise TypeError(f"settle: {type(e.env).__name__} has a pending turn but is no TurnLevelEnvironment")
    try:
        step = env.finish_turn(msg, fut.result())
    except EnvFault as fault:
        e.fail(fault.reason, str(fault))
        return True
    _apply(e, step)
    end_at_budget(e, max_new_tokens)
    return True


def add_sampled_token(e: Episode, token: int, version: int, logp: float, max_new_tokens: int, *,
                      block: bool = True) -> None:
    """Append a sampled token to ``e`` and let its environment answer: the episode ends (reward), or
    the environment's tokens queue in ``e.forced`` for the next turn, or the turn goes on; then the
    token budget. Both backends sample through this, so an episode evolves the same in either.

    A :class:`~asyncrl.rollout.envs.base.TurnLevelEnvironment` (``envs/adapter.py``'s ``TurnAdapter``) is
    asked only when the turn ends, off the decode loop: ``block`` False leaves ``e.pending`` set for the
    engine to :func:`settle` later (the transformers engine keeps decoding the other rows), True
    waits here. Any other environment (``step`` per token) answers inline.
    """
    e.add_sampled(token, version, logp)
    e.turn_text += e.env.tokenizer.decode([token])
    env = e.turn_level
    if env is not None:
        msg = env.end_of_turn(e.turn_text)
        if msg is not None:
            e.pending = (msg, env.submit(msg))
            settle(e, max_new_tokens, wait=block)
        end_at_budget(e, max_new_tokens)
        return
    try:
        step = e.env.step(e.turn_text)
    except Exception as exc:
        raise RolloutError(f"environment step failed: {exc!r}", task=e.task, traj_ids=[e.traj_id]) from exc
    _apply(e, step)
    end_at_budget(e, max_new_tokens)


def wait_any(episodes: Sequence[Episode], timeout_s: float) -> None:
    """Wait until one pending environment answer among ``episodes`` is there (or ``timeout_s``)."""
    futs = [e.pending[1] for e in episodes if e.pending is not None]
    if futs:
        concurrent.futures.wait(futs, timeout=timeout_s, return_when=concurrent.futures.FIRST_COMPLETED)


class BoundaryWeightSwap:
    """The weight hand-over both backends share (``update_weights`` in the module docstring).

    ``load_weights`` applies at once and is refused while a generate runs. ``update_weights`` when idle:
    applied now; while generating: it waits in ``_pending`` (a newer one replaces it and is counted in
    ``counters.updates_superseded``) until the engine's loop calls :meth:`_swap_pending` at a token
    boundary. A backend provides ``_lock``, ``_generating``, ``_pending``, ``counters``, ``_copy``
    (a private copy of the caller's tensors, made outside the lock) and ``_apply`` (install them).
    """

    _lock: threading.Lock
    _generating: bool
    _pending: tuple[Any, int] | None
    counters: Any
    # Seconds generation stood still installing weights (``_apply`` under the lock): the sync's pause,
    # apart from the transfer and the private copy made while generation still runs.
    apply_seconds: float = 0.0

    def _timed_apply(self, weights: Any, version: int) -> None:
        t0 = time.perf_counter()
        self._apply(weights, version)
        self.apply_seconds += time.perf_counter() - t0

    def _copy(self, state_dict: Mapping[str, torch.Tensor]) -> Any:
        raise NotImplementedError

    def _apply(self, weights: Any, version: int) -> None:
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


class BoundaryEngine(BoundaryWeightSwap):
    """What both backends share around their token loop: the weight hand-over (above), ``interrupt``
    with ``hold``, ``resume`` and the frame of ``generate`` (one call at a time, the held check, the
    generating state, the interrupt count, the deferred swap).

    A backend calls :meth:`_init_boundary` in its constructor and provides ``_begin`` (under the lock:
    raise when it cannot generate, else return what its loop needs), ``_loop_rows`` (the token loop; at
    each boundary it checks ``_interrupt_req`` and stores ``_snapshots``) and optionally ``_end`` (cleanup
    after the loop, before the state is cleared).
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

    def _begin(self, seed: int | None) -> Any:
        raise NotImplementedError

    def _loop_rows(self, episodes: list[Episode], max_new_tokens: int, temperature: float,
                   partial_rollout: bool, state: Any) -> None:
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
