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

This module holds the protocol and how one episode takes a token (:func:`add_sampled_token`, the
environment's answers, the budget); ``rollout/generation_loop.py`` the machinery both backends run around
their token loop (weight hand-over, interrupt and hold, the token boundary); ``rollout/engine_registry.py``
the backends by name.
"""

import concurrent.futures
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

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
        e.next_turn()


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
    e.add_sampled(token, version, logp)  # and into the turn's text (incrementally decoded: rollout/detokenize.py)
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
