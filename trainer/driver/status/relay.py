"""The status relay's decisions and the driver's side of it; the socket server is :mod:`.relay_server`.

The driver container runs the user's code (the task check at start, the Ray workers the head hosts),
so it holds no ServiceAccount token (``operator/driver_pod.py``). The pod's ``status`` sidecar does, and
runs only the relay: one request per connection, a JSON line of at most :data:`MAX_REQUEST_BYTES`.

**Only the driver's reports.** Every process of the driver container runs as the same user and can reach the
socket, so the relay does not take a summary from whoever connects (another process's valid-looking
``policyVersion: 999`` used to win the shared rate limit). The driver registers first, before it runs any
user code (:func:`register_driver`, from ``asyncrl driver``): ``{"register": <token>}``, a random token it keeps
in its memory only. The relay keeps the token's SHA-256 (in memory, and in a file beside the socket so that a
restarted sidecar still knows it) and refuses a second registration (403). A report is
``{"token": <token>, "status": {"training": {...}}}``; one without the registered token is refused (401) before
its summary is read. So the rate limit (:data:`BURST` at once, one per :data:`REFILL_SECONDS` after: the driver
sends one per 30 s, a stuck-phase report and the final flush) is the driver's alone.

What is checked, in order (:meth:`Relay.triage`): size, JSON, the token, the document's shape (``status.training``
and nothing else), the summary (:class:`~asyncrl.api.status.TrainingSummary`, strict), the rate limit. Then
``training_patch(summary)`` is sent: that field and nothing else. The answer is one JSON line: ``{"ok": true}``,
or ``{"ok": false, "status": <HTTP code or null>, "reason": ...}``.

:func:`relay_sender` is the driver's :data:`~.status_api.Sender`: it raises :class:`RelayError` with the API's
status code and reason, so :class:`~.status_reporter.StatusReporter` counts and explains a failure exactly as with
a direct API call (``describe_failure``).

What this does not do: a process of the driver container could read the driver's memory where the kernel lets
the same user do so (``ptrace``), or register first after a sidecar restart if it deleted the token file; the
boundary is the container's user, as for the rest of its files (``docs/security.md``).
"""

import hashlib
import hmac
import json
import logging
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from asyncrl.api.status import TrainingSummary, training_patch
from asyncrl.trainer.driver.status.api import Sender, describe_failure

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 64 * 1024  # a summary is well under 2 KiB
SEND_TIMEOUT_S = 15.0  # the driver waits this long for the relay's answer (the API call's own is 10 s)
REGISTER_WAIT_S = 60.0  # the driver waits this long for its sidecar to answer the registration
BURST, REFILL_SECONDS = 4, 5.0
TOKEN_MIN, TOKEN_MAX = 32, 256  # characters of a registration token (secrets.token_urlsafe(32) is 43)
NOT_REGISTERED = "no driver has registered with this relay"


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


class LogLimiter:
    """At most one log line per ``every_s`` seconds per kind; the lines left out are counted and the next line
    says how many (a flood of early disconnects once printed about 100K traceback lines in 3 s)."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self._last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}

    def warning(self, kind: str, message: str) -> bool:
        """Log ``message`` unless a line of ``kind`` went out less than ``every_s`` ago; True if it was logged."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last < self.every_s:
            self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
            return False
        self._last[kind] = now
        left_out = self.suppressed.pop(kind, 0)
        log.warning("status relay: %s%s", message,
                    f" ({left_out} more like it in the last {self.every_s:g} s not shown)" if left_out else "")
        return True


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def parse_report(doc: dict[str, Any]) -> TrainingSummary:
    """The summary of a report document (its token already taken out); ValueError naming what is wrong."""
    if not (set(doc) == {"status"} and isinstance(doc["status"], dict) and set(doc["status"]) == {"training"}):
        keys = sorted(doc["status"]) if isinstance(doc.get("status"), dict) else None
        raise ValueError('the relay sends status.training only: the request must be {"token": ..., "status": '
                         '{"training": {...}}}' + (f" (got status keys {keys})" if keys is not None else ""))
    try:
        return TrainingSummary.model_validate(doc["status"]["training"])
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"status.training.{where}: {first['msg']} ({exc.error_count()} problems)") from None


@dataclass(frozen=True)
class Triage:
    """What to do with one request line: ``answer`` it at once, or send ``summary`` (the driver's report)."""

    answer: dict[str, Any] | None = None
    summary: TrainingSummary | None = None


def _no(status: int, reason: str) -> Triage:
    return Triage(answer={"ok": False, "status": status, "reason": reason})


class Relay:
    """The relay's decisions, without the socket: one request line in, one answer out.

    ``driver``: the registered token's SHA-256 (a restarted sidecar's, read back by the server); ``remember``: called
    with it once a driver registers (the server writes it beside the socket)."""

    def __init__(self, send: Sender, limit: RateLimit | None = None, *, driver: bytes | None = None,
                 remember: Callable[[bytes], None] | None = None, logs: LogLimiter | None = None) -> None:
        self.send, self.limit = send, limit or RateLimit()
        self.driver, self.remember = driver, remember
        self.logs = logs or LogLimiter()
        self.sent = self.refused = self.unauthorized = 0

    def triage(self, line: bytes) -> Triage:
        """Everything but the API call (cheap: the server's reading thread runs it for every request)."""
        if len(line) > MAX_REQUEST_BYTES:
            return self._refuse(400, f"request over {MAX_REQUEST_BYTES} bytes; send one status.training summary")
        try:
            doc = json.loads(line)
        except ValueError as exc:
            return self._refuse(400, f"request is not JSON ({exc})")
        if not isinstance(doc, dict):
            return self._refuse(400, 'the request must be a JSON object: {"token": ..., "status": {"training": ...}}')
        if set(doc) == {"register"}:
            return self._register(doc["register"])
        token = doc.pop("token", None)
        if self.driver is None:
            return self._deny(401, f"{NOT_REGISTERED}; the driver registers at start")
        if not isinstance(token, str) or not hmac.compare_digest(token_digest(token), self.driver):
            return self._deny(401, "the report does not carry the registered driver's token; only the driver reports")
        try:
            summary = parse_report(doc)
        except ValueError as exc:
            return self._refuse(400, str(exc))
        if not self.limit.take():
            return self._refuse(429, f"more than {self.limit.burst} reports in {self.limit.burst * self.limit.refill_s:g}"
                                f" s; the relay sends one per {self.limit.refill_s:g} s")
        return Triage(summary=summary)

    def deliver(self, summary: TrainingSummary) -> dict[str, Any]:
        """Send the driver's summary (the API call: a worker thread of the server runs it)."""
        try:
            self.send(training_patch(summary))
        except Exception as exc:  # noqa: BLE001 -- every API failure goes back to the driver, which counts it
            self.logs.warning("api", describe_failure(exc))
            status = getattr(exc, "status", None)
            return {"ok": False, "status": status if isinstance(status, int) else None,
                    "reason": str(getattr(exc, "reason", None) or exc)}
        self.sent += 1
        return {"ok": True}

    def handle(self, line: bytes) -> dict[str, Any]:
        """:meth:`triage`, then :meth:`deliver` when it is the driver's report."""
        t = self.triage(line)
        if t.answer is not None:
            return t.answer
        assert t.summary is not None  # a Triage holds one of the two
        return self.deliver(t.summary)

    def _register(self, token: object) -> Triage:
        if not isinstance(token, str) or not TOKEN_MIN <= len(token) <= TOKEN_MAX:
            return self._refuse(400, f"a registration token is a string of {TOKEN_MIN} to {TOKEN_MAX} characters")
        digest = token_digest(token)
        if self.driver is None:
            self.driver = digest
            if self.remember is not None:
                self.remember(digest)
            log.info("status relay: the driver registered; reports without its token are refused from now on")
        elif not hmac.compare_digest(digest, self.driver):
            return self._deny(403, "a driver has registered with this relay already; a second registration is refused")
        return Triage(answer={"ok": True})  # the same token again: the driver retrying after a lost answer

    def _refuse(self, status: int, reason: str) -> Triage:
        self.refused += 1
        self.logs.warning(f"refused-{status}", f"refused a request: {reason}")
        return _no(status, reason)

    def _deny(self, status: int, reason: str) -> Triage:
        self.unauthorized += 1
        self.logs.warning("unauthorized", f"refused a request ({status}): {reason}")
        return _no(status, reason)


# ---------------------------------------------------------------- the driver's side

def _connect(conn: socket.socket, path: str, deadline: float) -> None:
    """Connect, waiting while the relay's listen backlog is full (a Unix socket then answers EAGAIN at once,
    where a TCP one would wait): a burst of other processes' connections delays the driver, never fails it."""
    while True:
        try:
            conn.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _call(path: str | Path, doc: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One request, one answer; :class:`RelayError` (status None) when the relay does not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout_s)
            _connect(conn, str(path), time.monotonic() + timeout_s)
            conn.sendall(json.dumps(doc).encode() + b"\n")
            with conn.makefile("rb") as reply:
                line = reply.readline(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        raise RelayError(None, f"the status sidecar does not answer on {path} ({type(exc).__name__}: {exc}); "
                         "check the driver pod's status container") from exc
    try:
        answer = json.loads(line)
    except ValueError:
        raise RelayError(None, f"the status sidecar on {path} closed without an answer") from None
    if not isinstance(answer, dict):
        raise RelayError(None, f"the status sidecar on {path} answered {line[:80]!r}")
    return answer


def relay_sender(path: str | Path, token: str, *, timeout_s: float = SEND_TIMEOUT_S) -> Sender:
    """The driver's :data:`Sender` through the relay on ``path``, with the token it registered."""

    def send(body: dict[str, Any]) -> None:
        answer = _call(path, {"token": token, **body}, timeout_s)
        if answer.get("status") == 401 and str(answer.get("reason")).startswith(NOT_REGISTERED):
            # a sidecar restarted without its token file: register again (the same token), then send
            if _call(path, {"register": token}, timeout_s).get("ok"):
                answer = _call(path, {"token": token, **body}, timeout_s)
        if not answer.get("ok"):
            raise RelayError(answer.get("status"), str(answer.get("reason")))

    return send


def register_driver(path: str | Path, *, wait_s: float = REGISTER_WAIT_S,
                    timeout_s: float = SEND_TIMEOUT_S) -> Sender:
    """Register this process as the relay's driver (a fresh random token, kept in memory only) and return its
    sender. Call it before any user code runs. Waits up to ``wait_s`` for a sidecar that is not listening yet;
    :class:`RelayError` when it never answers or refuses (another process registered first: 403)."""
    token = secrets.token_urlsafe(32)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            answer = _call(path, {"register": token}, timeout_s)
            break
        except RelayError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)  # the native sidecar starts first; this covers its own start-up
    if not answer.get("ok"):
        raise RelayError(answer.get("status"), str(answer.get("reason")))
    return relay_sender(path, token, timeout_s=timeout_s)


__all__ = ["LogLimiter", "RateLimit", "Relay", "RelayError", "Triage", "parse_report", "register_driver",
           "relay_sender"]
