"""Stop a pure-Python call that runs past a time limit, in whatever thread it runs.

A model folder's chat template is a program (Jinja): two nested loops over ``range(100000)`` render
nothing for hours. transformers renders it in jinja2's sandbox, which stops attribute tricks but not
time. :func:`call_within` bounds such a call without a child process (whose start would cost more
than thousands of renders) and without ``signal.alarm`` (only the main thread receives signals: a Ray
actor's method, a rollout worker's thread, would not be stopped):

1. a timer thread, started for the call, raises an exception *in the calling thread* when the limit
   passes (``PyThreadState_SetAsyncExc``: CPython delivers it between two bytecodes, so a Jinja loop,
   compiled to Python, stops at its next iteration);
2. the exception derives from ``BaseException``, so the ``except Exception`` blocks of the code being
   stopped (jinja2's, transformers') do not swallow it; it leaves as :class:`TimeLimitError`
   (a ``ValueError``) with one line;
3. when the call returns first, the timer is disarmed under a lock and any exception it had just
   posted is withdrawn before the caller runs on, so nothing fires later in unrelated code.

Not bounded: time spent inside one C call (a regex, a huge ``str.join``), which returns before the
exception can be delivered, and memory.
"""

import ctypes
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class TimeLimitError(ValueError):
    """A call stopped at its time limit; the message is one line naming what was stopped."""


class _Expired(BaseException):
    """Raised asynchronously in the calling thread (never seen by callers of :func:`call_within`)."""


def _post(thread_id: int, exc: type[BaseException] | None) -> None:
    """Post ``exc`` to run in thread ``thread_id`` at its next bytecode (``None`` withdraws a posted one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class _Watch:
    """The timer's side: fire once, unless the call disarmed it first."""

    def __init__(self, thread_id: int) -> None:
        self.thread_id = thread_id
        self.lock = threading.Lock()
        self.armed = True
        self.fired = False

    def fire(self) -> None:
        with self.lock:
            if self.armed:
                self.fired = True
                _post(self.thread_id, _Expired)

    def disarm(self) -> None:
        with self.lock:
            self.armed = False
            if self.fired:
                _post(self.thread_id, None)  # withdraw it if it has not been delivered yet


def call_within(seconds: float, what: str, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
    """``fn(*args, **kwargs)``, or :class:`TimeLimitError` (``"<what> ran past its <seconds> s limit..."``)
    once ``seconds`` pass. ``what`` names the work in that message."""
    watch = _Watch(threading.get_ident())
    timer = threading.Timer(seconds, watch.fire)
    timer.daemon = True
    try:
        timer.start()
        try:
            return fn(*args, **kwargs)
        finally:
            watch.disarm()
            timer.cancel()
    except _Expired:
        raise TimeLimitError(f"{what} ran past its {seconds:g} s limit and was stopped") from None


__all__ = ["TimeLimitError", "call_within"]
