"""SIGTERM as a request to stop cleanly: what Kubernetes sends on preemption and drain.

The kubelet sends SIGTERM, waits ``terminationGracePeriodSeconds`` (``spec.runPolicy``; the
operator puts it on the pods) and then kills. The run uses that time as follows: the handler
only records the request (it never raises inside Ray or torch); the loop stops admitting rollout
work, lets the step in progress finish (one actor step: seconds), writes a final checkpoint,
the summary and the report, and the process exits 0 -- a preemption, which the operator answers
by restarting the gang, and the rerun resumes from that checkpoint. A second SIGTERM (or the
kill after the grace period) ends it at once.
"""

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)


class StopRequest:
    """Set once SIGTERM arrived (``requested``, ``at``: monotonic seconds); a second one raises."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.at is not None

    def request(self, signum: int = signal.SIGTERM) -> None:
        if self.at is not None:
            raise SystemExit(128 + signum)  # asked twice: stop now, the cleanup still runs
        self.at, self.signum = time.monotonic(), signum
        log.warning("SIGTERM: no new rollout work is admitted; finishing the current step, then a final "
                    "checkpoint and the summary")

    def seconds_since(self) -> float:
        return 0.0 if self.at is None else time.monotonic() - self.at


def install_sigterm_handler(stop: StopRequest) -> Callable[[], None]:
    """From now on SIGTERM calls ``stop.request``; returns the function that restores the previous handler.

    Only the main thread can set handlers: elsewhere (a test's thread) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.request(signum)

    previous = signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore
