"""The status relay: the driver pod's ``status`` sidecar, the only process that holds the status token.

The driver container runs the user's code (the task check at start, the Ray workers the head hosts),
so it holds no ServiceAccount token (``operator/driver_pod.py``). The sidecar does, and runs only
this: a Unix-socket server (:func:`serve`) that takes one request per connection, a JSON line
``{"status": {"training": {...}}}`` of at most :data:`MAX_REQUEST_BYTES`, and

1. validates ``training`` as :class:`~asyncrl.api.status.TrainingSummary` (strict, extra fields refused);
2. sends ``training_patch(summary)``: that field and nothing else, whatever else the request held;
3. at most :data:`BURST` patches at once and one per :data:`REFILL_SECONDS` after that (the driver
   sends one per 30 s, plus a stuck-phase report and the final flush);
4. answers one JSON line: ``{"ok": true}``, or ``{"ok": false, "status": <HTTP code or null>, "reason": ...}``.

:func:`relay_sender` is the driver's side: a :data:`~.status_api.Sender` that raises :class:`RelayError`
with the API's status code and reason, so :class:`~.status_reporter.StatusReporter` counts and
explains a failure exactly as with a direct API call (``describe_failure``).

No port listens: the socket lives on an emptyDir that only the pod's two containers mount, and it is
the owner's only (mode 0600; both containers run as the same user).
"""

import json
import logging
import os
import signal
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asyncrl.api.status import TrainingSummary, training_patch
from asyncrl.trainer.driver.status.api import Sender, describe_failure

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024  # a summary is well under 2 KiB
CONNECTION_TIMEOUT_S = 5.0  # a client that sends nothing is dropped (the relay serves one at a time)
SEND_TIMEOUT_S = 15.0  # the driver waits this long for the relay's answer (the API call's own is 10 s)
BURST, REFILL_SECONDS = 4, 5.0


class RelayError(RuntimeError):
    """A report the relay could not deliver: ``status`` the API's HTTP code (None: no answer), ``reason``."""

    def __init__(self, status: int | None, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class RateLimit:
    """A token bucket: ``burst`` sends, then one per ``refill_s`` (``clock``: monotonic seconds)."""

    def __init__(self, burst: int = BURST, refill_s: float = REFILL_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.refill_s, self.clock = burst, refill_s, clock
        self.tokens, self.at = float(burst), clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.at) / self.refill_s)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def parse_request(line: bytes) -> TrainingSummary:
    """The summary of one request line; ValueError naming what is wrong."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ValueError(f"request over {MAX_REQUEST_BYTES} bytes; send one status.training summary")
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"request is not JSON ({exc})") from None
    if not (isinstance(doc, dict) and set(doc) == {"status"} and isinstance(doc["status"], dict)
            and set(doc["status"]) == {"training"}):
        keys = sorted(doc["status"]) if isinstance(doc, dict) and isinstance(doc.get("status"), dict) else None
        raise ValueError('the relay sends status.training only: the request must be {"status": {"training": {...}}}'
                         + (f" (got status keys {keys})" if keys is not None else ""))
    try:
        return TrainingSummary.model_validate(doc["status"]["training"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"status.training.{where}: {first['msg']} ({exc.error_count()} problems)") from None


class Relay:
    """The relay's decisions, without the socket: one request line in, one answer out."""

    def __init__(self, send: Sender, limit: RateLimit | None = None) -> None:
        self.send, self.limit = send, limit or RateLimit()
        self.sent = self.refused = 0

    def handle(self, line: bytes) -> dict[str, Any]:
        try:
            summary = parse_request(line)
        except ValueError as exc:
            self.refused += 1
            log.warning("status relay: refused a request: %s", exc)
            return {"ok": False, "status": 400, "reason": str(exc)}
        if not self.limit.take():
            self.refused += 1
            return {"ok": False, "status": 429, "reason": f"more than {self.limit.burst} reports in "
                    f"{self.limit.burst * self.limit.refill_s:g} s; the relay sends one per {self.limit.refill_s:g} s"}
        try:
            self.send(training_patch(summary))
        except Exception as exc:  # noqa: BLE001 -- every API failure goes back to the driver, which counts it
            log.warning("status relay: %s", describe_failure(exc))
            status = getattr(exc, "status", None)
            return {"ok": False, "status": status if isinstance(status, int) else None,
                    "reason": str(getattr(exc, "reason", None) or exc)}
        self.sent += 1
        return {"ok": True}


class _Handler(socketserver.StreamRequestHandler):
    timeout = CONNECTION_TIMEOUT_S
    server: "RelayServer"

    def handle(self) -> None:
        try:
            line = self.rfile.readline(MAX_REQUEST_BYTES + 1)
        except OSError:  # the client went silent past the timeout
            return
        answer = self.server.relay.handle(line)
        self.wfile.write(json.dumps(answer).encode() + b"\n")


class RelayServer(socketserver.UnixStreamServer):
    """The relay on ``path`` (a stale socket from a restarted sidecar is replaced)."""

    def __init__(self, path: str | Path, relay: Relay) -> None:
        self.relay = relay
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_socket():
            path.unlink()
        super().__init__(str(path), _Handler)
        os.chmod(path, 0o600)


def serve(path: str | Path, send: Sender) -> None:
    """Run the relay on ``path`` until SIGTERM or SIGINT (the sidecar's command), then exit cleanly.

    The handler is needed, not a nicety: the relay is PID 1 of its container, and the kernel drops a signal
    that PID 1 leaves at its default action. Without it the kubelet's SIGTERM (sent to a native sidecar once
    the driver has exited) did nothing, and the finished driver pod stayed Running for the whole grace
    period (``runPolicy.terminationGracePeriodSeconds``, 300 s by default) until SIGKILL (found on a real
    kubelet: the sidecar ended with exit code 137, tests/cluster/test_training.py)."""
    server = RelayServer(path, Relay(send))

    def stop(signum: int, _frame: object) -> None:
        log.info("status relay stopping (signal %d)", signum)
        # shutdown() waits for serve_forever() to return: call it from another thread than the serving one
        threading.Thread(target=server.shutdown, name="status-relay-stop", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    log.info("status relay listening on %s", path)
    server.serve_forever()
    server.server_close()


def serve_in_thread(path: str | Path, send: Sender) -> tuple[RelayServer, threading.Thread]:
    """The relay in a daemon thread (tests, and a driver that relays for itself)."""
    server = RelayServer(path, Relay(send))
    thread = threading.Thread(target=server.serve_forever, name="status-relay", daemon=True)
    thread.start()
    return server, thread


def relay_sender(path: str | Path, *, timeout_s: float = SEND_TIMEOUT_S) -> Sender:
    """The driver's :data:`Sender` through the relay on ``path``."""

    def send(body: dict[str, Any]) -> None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(timeout_s)
                conn.connect(str(path))
                conn.sendall(json.dumps(body).encode() + b"\n")
                with conn.makefile("rb") as reply:
                    line = reply.readline(MAX_REQUEST_BYTES + 1)
        except OSError as exc:
            raise RelayError(None, f"the status sidecar does not answer on {path} ({type(exc).__name__}: {exc}); "
                             "check the driver pod's status container") from exc
        try:
            answer = json.loads(line)
        except ValueError:
            raise RelayError(None, f"the status sidecar on {path} closed without an answer") from None
        if not answer.get("ok"):
            raise RelayError(answer.get("status"), str(answer.get("reason")))

    return send
