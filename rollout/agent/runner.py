"""The agent runner: a child process of the rollout worker that runs every in-process agent function's sessions.

``spec.task.agent: "pkg.mod:fn"`` names an ``async def fn(client, sample)``. The worker keeps the sessions (the
endpoint, the mailboxes, the episodes); the runner, started with the worker (``spawn``), imports ``fn`` by name and
runs each session's coroutine on its own asyncio loop with its own ``AsyncOpenAI`` client to the worker's endpoint.
So the client's CPU (~20 ms per episode, most of an agent request's cost) is spent outside the worker's interpreter,
and user code that calls ``os._exit``, crashes the interpreter or blocks its loop costs the sessions in flight
there, never the worker: their futures fail (``agent_exception``; a loop blocked past ``envTimeoutSeconds``:
``timeout``) and the runner is started again.

The wire (a ``multiprocessing`` pipe, pickled tuples): worker -> runner ``("start", n, base_url, key, sample,
timeout_s)``, ``("cancel", n)``; runner -> worker ``("ready",)`` or ``("load_error", text)`` once, ``("beat",)``
every ``beat_s`` from the loop, ``("cancelled", n)`` once the loop has taken a cancel, and ``("done", n, kind,
payload)`` per session: ``("value", reward)`` (a number, a bool, None), ``("type", type name)`` (anything else the agent returned), ``("raised", "Type: message")``.
"""

import asyncio
import concurrent.futures
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
import time
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.binding import EnvLoadError

READY_TIMEOUT_S = 120.0  # the runner's start: an interpreter, openai and the agent's module


class AgentRaised(Exception):
    """The agent function raised (in the runner): ``str()`` is its ``Type: message`` line."""


class AgentRunnerLost(Exception):
    """The runner process ended or stopped answering while the session's agent ran."""

    def __init__(self, message: str, reason: str = "agent_exception") -> None:
        super().__init__(message)
        self.reason = reason


class AgentLoadError(EnvLoadError):
    """The runner could not import the agent function by its name (``spec.task.agent``)."""


@dataclass(frozen=True)
class Returned:
    """What the agent function returned when it is neither a number nor None (only its type crosses)."""

    type_name: str


# ------------------------------------------------------------------------------------------ the worker's side
class AgentRunner:
    """The worker's handle on its runner process: :meth:`start` a session's agent, a future of its outcome."""

    def __init__(self, path: str, python_path: Sequence[str] = (), *, timeout_s: float = 30.0,
                 beat_s: float | None = None) -> None:
        self.path, self.python_path = path, list(python_path)
        self.timeout_s = timeout_s  # a loop that sends no beat for this long is stuck: the runner is restarted
        self.beat_s = beat_s if beat_s is not None else max(0.05, min(1.0, timeout_s / 8))
        self.restarts = 0
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.RLock()
        self._restarted = threading.Condition(self._lock)
        self._inflight: dict[int, concurrent.futures.Future[Any]] = {}
        # cancelled sessions whose cancel the runner's loop has not acknowledged yet: a loop that blocks while it
        # owes one is stuck too (else a session cancelled by its own timeout first leaves the runner blocked, and
        # no restart, until the block ends by itself; seen under heavy load)
        self._cancelling: set[int] = set()
        self._n = 0
        self._closed = False
        self._broken: str | None = None  # a restart failed to load the agent: every start fails with this
        self._last = time.monotonic()
        self._proc, self._conn = self._spawn()
        self._reader = threading.Thread(target=self._read, name="asyncrl-agent-runner", daemon=True)
        self._reader.start()

    def _spawn(self) -> tuple[Any, multiprocessing.connection.Connection]:
        mine, theirs = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(target=serve, args=(theirs, self.path, self.python_path, self.beat_s),
                                 name="asyncrl-agent-runner", daemon=True)
        with _main_left_out():
            proc.start()
        theirs.close()
        if not mine.poll(READY_TIMEOUT_S):
            proc.kill()
            raise AgentLoadError(f"spec.task.agent: the agent runner did not start within {READY_TIMEOUT_S:g} s")
        try:
            first = mine.recv()
        except (EOFError, OSError):
            proc.join(5)
            raise AgentLoadError(f"spec.task.agent: the agent runner process exited (code {proc.exitcode}) while "
                                 f"importing {self.path!r}") from None
        if first[0] != "ready":
            proc.join(5)
            raise AgentLoadError(f"spec.task.agent: {self.path!r} could not be imported in the agent runner process "
                                 f"(the worker runs agent functions in a child process, importing them by name): "
                                 f"{first[1]}")
        self._last = time.monotonic()
        return proc, mine

    def start(self, base_url: str, key: str, sample: dict[str, Any], timeout_s: float
              ) -> "concurrent.futures.Future[Any]":
        """Run the agent for one session; the future's result is the agent's return value (a :class:`Returned`
        for a non-number), its exception :class:`AgentRaised` or :class:`AgentRunnerLost`. Cancelling it cancels
        the agent's coroutine."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._lock:
            if self._broken is not None:
                fut.set_exception(AgentRunnerLost(self._broken))
                return fut
            self._n += 1
            n = self._n
            self._inflight[n] = fut
            try:
                self._conn.send(("start", n, base_url, key, dict(sample), timeout_s))
            except (OSError, ValueError):
                pass  # the runner is gone: the reader fails this future with the others
        fut.add_done_callback(lambda f: self._cancelled(n, f))
        return fut

    def _cancelled(self, n: int, f: "concurrent.futures.Future[Any]") -> None:
        if not f.cancelled():
            return
        with self._lock:
            if self._inflight.pop(n, None) is None:
                return
            self._cancelling.add(n)
            try:
                self._conn.send(("cancel", n))
            except (OSError, ValueError):
                pass

    @property
    def inflight(self) -> int:
        with self._lock:
            return len(self._inflight)

    def _read(self) -> None:
        while True:
            conn = self._conn
            try:
                ready = conn.poll(self.beat_s * 2)
                msg = conn.recv() if ready else None
            except (EOFError, OSError):
                if self._closed or self._broken is not None:
                    return
                self._lost(f"the agent runner process exited (code {self._exitcode()}) while the session's agent "
                           "ran (an agent that calls os._exit or crashes the interpreter ends every session in "
                           "flight in the runner); the runner was restarted", "agent_exception")
                continue
            if msg is None:
                # no lock here: a start() may hold it, blocked on a pipe the stuck runner no longer drains
                owed = bool(self._inflight) or bool(self._cancelling)
                stuck = owed and time.monotonic() - self._last > self.timeout_s
                if stuck:
                    self._proc.kill()  # that start()'s send then fails, and the lock is free for _lost
                    self._proc.join(5)
                    self._lost(f"the agent runner's event loop was blocked for over {self.timeout_s:g} s "
                               "(spec.task.envTimeoutSeconds; an agent that blocks its loop stalls every session "
                               "in the runner); the runner was restarted", "timeout")
                continue
            self._last = time.monotonic()
            if msg[0] == "cancelled":
                with self._lock:
                    self._cancelling.discard(msg[1])
                continue
            if msg[0] == "done":
                _, n, kind, payload = msg
                with self._lock:
                    fut = self._inflight.pop(n, None)
                if fut is None or fut.done():
                    continue
                try:
                    if kind == "value":
                        fut.set_result(payload)
                    elif kind == "type":
                        fut.set_result(Returned(payload))
                    else:
                        fut.set_exception(AgentRaised(payload))
                except concurrent.futures.InvalidStateError:
                    pass

    def _exitcode(self) -> Any:
        self._proc.join(5)
        return self._proc.exitcode

    def _lost(self, message: str, reason: str) -> None:
        """Fail every session in flight (their episodes end at once), then start a new runner (the worker goes on)."""
        with self._lock:
            if self._closed:
                return
            lost, self._inflight = list(self._inflight.values()), {}
            self._cancelling.clear()
            self._conn.close()
            for fut in lost:
                if not fut.done():
                    try:
                        fut.set_exception(AgentRunnerLost(message, reason))
                    except concurrent.futures.InvalidStateError:
                        pass
            try:  # under the lock: a session started meanwhile waits for the new runner
                self._proc, self._conn = self._spawn()
            except AgentLoadError as exc:
                self._broken = str(exc)
                self._conn = _closed_pipe(self._ctx)
            self.restarts += 1
            self._restarted.notify_all()

    def wait_restarts(self, n: int, timeout: float) -> bool:
        """Wait until the runner has been restarted ``n`` times (True) or ``timeout`` s passed (False)."""
        with self._restarted:
            return self._restarted.wait_for(lambda: self.restarts >= n, timeout)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            try:
                self._conn.close()
            except OSError:
                pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


@contextlib.contextmanager
def _main_left_out() -> Iterator[None]:
    """While a runner starts, ``__main__`` is a bare module: ``spawn`` would run the worker's main script again in
    the child (as ``__mp_main__``: a Ray worker's ``default_worker.py``, a bench importing torch), seconds of start
    and hundreds of MB for nothing: the runner needs only its own module and the agent's, imported by name."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _closed_pipe(ctx: Any) -> multiprocessing.connection.Connection:
    a, b = ctx.Pipe(duplex=True)
    b.close()
    return a


# ------------------------------------------------------------------------------------------ the runner's side
def serve(conn: multiprocessing.connection.Connection, path: str, python_path: Sequence[str], beat_s: float) -> None:
    """The runner process: import the agent by name, then run one coroutine per ``start`` until the pipe closes."""
    try:
        from asyncrl.rollout.envs.reward import import_object

        fn = import_object(path, python_path=python_path, what="spec.task.agent")
        import openai  # noqa: F401  (imported before ready: the first session does not pay for it)
    except BaseException as exc:  # noqa: BLE001  (the module's own error, reported to the worker)
        conn.send(("load_error", f"{type(exc).__name__}: {exc}".strip().splitlines()[-1]))
        return
    conn.send(("ready",))
    asyncio.run(_loop(conn, fn, beat_s))


async def _loop(conn: multiprocessing.connection.Connection, fn: Any, beat_s: float) -> None:
    import ssl

    loop = asyncio.get_running_loop()
    tasks: dict[int, asyncio.Task[Any]] = {}
    ended = loop.create_future()
    tls = ssl.create_default_context()  # one per process: a client's own reads the CA bundle each time (~5 ms)

    def send(msg: tuple[Any, ...]) -> None:
        try:
            conn.send(msg)
        except (OSError, ValueError):
            if not ended.done():
                ended.set_result(None)

    async def run(n: int, base_url: str, key: str, sample: dict[str, Any], timeout_s: float) -> None:
        import openai

        try:
            http = openai.DefaultAsyncHttpxClient(verify=tls, timeout=timeout_s)
            # max_retries 0: a retry is the endpoint's to recognise; the agent's own client gains nothing from one
            async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s,
                                          http_client=http) as client:
                value = await fn(client, sample)
        except asyncio.CancelledError:
            return
        except BaseException as exc:  # noqa: BLE001  (the agent's own bug: its episode's fault)
            text = f"{type(exc).__name__}: {exc}".strip().splitlines()
            send(("done", n, "raised", text[-1] if text else type(exc).__name__))
            return
        finally:
            tasks.pop(n, None)
        if value is None or isinstance(value, bool | int | float):
            send(("done", n, "value", value))
        else:
            send(("done", n, "type", type(value).__name__))

    def readable() -> None:
        try:
            while conn.poll():
                msg = conn.recv()
                if msg[0] == "start":
                    _, n, base_url, key, sample, timeout_s = msg
                    tasks[n] = loop.create_task(run(n, base_url, key, sample, timeout_s))
                elif msg[0] == "cancel":
                    t = tasks.pop(msg[1], None)
                    if t is not None:
                        t.cancel()
                    send(("cancelled", msg[1]))  # the loop runs: the worker stops counting this session as owed
        except (EOFError, OSError):  # the worker closed the pipe or is gone
            if not ended.done():
                ended.set_result(None)

    async def beat() -> None:
        while True:
            send(("beat",))
            await asyncio.sleep(beat_s)

    loop.add_reader(conn.fileno(), readable)
    beats = loop.create_task(beat())
    await ended
    beats.cancel()
    for t in list(tasks.values()):
        t.cancel()
    loop.remove_reader(conn.fileno())
    os._exit(0)  # an agent's leftover threads (executors) never keep the runner alive


__all__ = ["AgentLoadError", "AgentRaised", "AgentRunner", "AgentRunnerLost", "Returned", "serve"]
