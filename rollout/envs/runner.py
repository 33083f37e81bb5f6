"""Runs user environment code off the decode loop, each call under a timeout, faults as values.

One asyncio event loop in a daemon thread serves every episode of a rollout worker: an ``async def``
method is awaited on it (thousands of concurrent service calls cost no threads); a plain method runs
in a thread pool and is awaited there. Either way the engine's decode loop only submits and polls, so
a slow environment stalls its own episode, not the batch. A call past ``timeout_s`` resolves to an
:class:`EnvFault` (``timeout``); the thread of a hung plain call cannot be killed, so it is left to
finish on its own (one pool thread per hang, ``max_threads`` in all).
"""

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable
from typing import Any, Literal

EnvErrorReason = Literal[
    "exception", "timeout", "nonfinite_reward", "bad_messages",
    # a reward service (rollout/envs/remote.py): down, no answer in time, HTTP 4xx/5xx, not {"reward": x}
    "remote_unreachable", "remote_timeout", "remote_http_error", "remote_bad_response",
    # an OpenAI-API agent (rollout/agent/): raised, sent a malformed request, never called the model, gave no reward
    "agent_exception", "agent_bad_request", "agent_no_request", "agent_no_reward",
]
ENV_ERROR_REASONS: tuple[str, ...] = (
    "exception", "timeout", "nonfinite_reward", "bad_messages",
    "remote_unreachable", "remote_timeout", "remote_http_error", "remote_bad_response",
    "agent_exception", "agent_bad_request", "agent_no_request", "agent_no_reward",
)


class EnvFault(RuntimeError):
    """A user environment call that failed; ``reason`` is one of :data:`ENV_ERROR_REASONS`."""

    def __init__(self, reason: str, message: str) -> None:
        if reason not in ENV_ERROR_REASONS:
            raise ValueError(f"EnvFault reason {reason!r}; valid: {', '.join(ENV_ERROR_REASONS)}")
        self.reason = reason
        super().__init__(message)


def last_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` on one line (what a traceback's last line says)."""
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[-1] if text else type(exc).__name__


class EnvRunner:
    """Submit environment calls; each future resolves to the call's value or raises :class:`EnvFault`."""

    def __init__(self, timeout_s: float, *, max_threads: int = 64) -> None:
        if not timeout_s > 0:
            raise ValueError(f"EnvRunner: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_threads, thread_name_prefix="asyncrl-env")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="asyncrl-env-loop", daemon=True)
        self._thread.start()

    async def _call(self, fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
        async def run() -> Any:
            if inspect.iscoroutinefunction(fn):
                out = await fn(*args)
            else:
                out = await self._loop.run_in_executor(self._pool, fn, *args)
            if inspect.isawaitable(out):  # a plain def that returned a coroutine
                out = await out
            return out

        try:
            return await asyncio.wait_for(run(), self.timeout_s)
        except TimeoutError:
            raise EnvFault("timeout", f"{what} took longer than {self.timeout_s:g} s (spec.task.envTimeoutSeconds)") \
                from None
        except EnvFault:
            raise
        except Exception as exc:
            raise EnvFault("exception", f"{what} raised {last_line(exc)}") from exc

    def submit(self, fn: Callable[..., Any], *args: Any, what: str = "environment call") -> "concurrent.futures.Future[Any]":
        """Start ``fn(*args)`` off the caller's thread; returns at once."""
        return asyncio.run_coroutine_threadsafe(self._call(fn, args, what), self._loop)

    def call(self, fn: Callable[..., Any], *args: Any, what: str = "environment call") -> Any:
        """``fn(*args)`` under the timeout, waiting for it (reset, the scripted replays)."""
        return self.submit(fn, *args, what=what).result()

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._pool.shutdown(wait=False, cancel_futures=True)


_shared: dict[float, EnvRunner] = {}
_shared_lock = threading.Lock()


def shared_runner(timeout_s: float) -> EnvRunner:
    """One runner per timeout per process (every episode of a worker shares its loop and pool)."""
    with _shared_lock:
        r = _shared.get(timeout_s)
        if r is None:
            r = _shared[timeout_s] = EnvRunner(timeout_s)
        return r
