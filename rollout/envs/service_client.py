"""One JSON-over-``POST`` call to a service, as hostile answers cannot stretch it: :class:`ServiceClient`.

The settings are ``spec.task.rewardService``'s (:class:`~asyncrl.api.dataset.RewardServiceSpec`);
:mod:`asyncrl.rollout.envs.remote` speaks the reward and environment protocols over it. Each call:

1. **One deadline.** ``timeoutSeconds`` (or ``spec.task.envTimeoutSeconds`` when shorter,
   ``budget_s``) bounds the whole call: the wait for a free slot, every attempt (connect, send,
   every byte of the answer) and every backoff. A watchdog shuts the socket at the deadline, so an
   answer dripped a byte at a time ends there, as ``remote_timeout``. No retry starts past it.
2. **No redirects.** A 3xx is a ``remote_http_error`` that is not followed (a redirect could send the
   request, headers and all, to any host: a metadata endpoint, the API server).
3. **A capped body.** At most ``maxResponseBytes`` are read, incrementally; a longer answer (declared
   or streamed) is ``remote_bad_response`` after at most that many bytes.
4. **Secrets stay secret.** ``headersFrom`` values are read once from the environment
   (:func:`~asyncrl.api.service.header_values`) and only ever written to the socket; messages show
   the URL as :func:`~asyncrl.api.service.redact_url` (no query, no userinfo).

At most ``maxConcurrency`` calls of one client hold a slot at once (:class:`RemoteStats` counts
them where the limit is decided). Connections go straight to the service: no proxy variables.
"""

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

from asyncrl.api.dataset import RewardServiceSpec
from asyncrl.api.service import header_values, redact_url
from asyncrl.rollout.envs.runner import EnvFault

PROTOCOL_VERSION: Final = 1
REMOTE_ERROR_REASONS: Final[tuple[str, ...]] = (
    "remote_unreachable", "remote_timeout", "remote_http_error", "remote_bad_response",
)
MAX_SHOWN: Final = 200  # characters of a bad answer quoted in a fault message
_CHUNK: Final = 64 * 1024  # bytes asked of the socket per read


@dataclass
class RemoteStats:
    """Counters of one client (per worker process): requests sent, retries, faults by reason, and the slots:
    ``waiting`` callers queue for one now, ``in_flight`` hold one, ``most_in_flight`` the most that ever did."""

    requests: int = 0
    retries: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REMOTE_ERROR_REASONS, 0))
    waiting: int = 0
    in_flight: int = 0
    most_in_flight: int = 0


class _Retry(Exception):
    """An attempt that failed in a way another attempt may not."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class _Watchdog:
    """Shuts ``conn``'s socket at the deadline, whatever read it is in (a dripped header line, a TLS record)."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self.fired = threading.Event()
        self._timer = threading.Timer(max(seconds, 0.0), self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        self.fired.set()
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def cancel(self) -> None:
        self._timer.cancel()


class ServiceClient:
    """POSTs JSON to a service under ``spec``'s deadline, retries, backoff, body cap and concurrency limit.

    Thread-safe: one client serves every episode of a worker; ``sleep`` is the backoff's wait; ``what``
    names the service in fault messages, ``field`` its spec path in configuration errors. Raises
    ``ValueError`` (naming the header and its variable, never the value) when a ``headersFrom`` variable
    is missing.
    """

    def __init__(self, spec: RewardServiceSpec, *, what: str = "reward service", field: str = "spec.task.rewardService",
                 budget_s: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.what = what
        self.budget_s = budget_s  # the caller's own deadline (envTimeoutSeconds)
        self._sleep = sleep
        self._headers = header_values(spec.headers_from, field)
        self._slots = threading.BoundedSemaphore(spec.max_concurrency)
        self._lock = threading.Lock()
        self.stats = RemoteStats()

    @property
    def deadline_s(self) -> float:
        """Seconds one call may take, all attempts included."""
        t = self.spec.timeout_seconds
        return t if self.budget_s is None else min(t, self.budget_s)

    def _deadline_rule(self) -> str:
        if self.budget_s is not None and self.budget_s < self.spec.timeout_seconds:
            return f"spec.task.envTimeoutSeconds={self.budget_s:g}"
        return f"timeoutSeconds={self.spec.timeout_seconds:g}"

    def post(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The JSON object ``url`` answers to ``payload``; an :class:`EnvFault` when it cannot be had in time."""
        body = json.dumps(payload, default=str, ensure_ascii=False).encode()
        attempts, tried = self.spec.retries + 1, 0
        deadline = time.monotonic() + self.deadline_s
        for attempt in range(attempts):
            tried += 1
            try:
                return self._attempt(url, body, deadline)
            except _Retry as exc:
                last = exc
            except EnvFault as exc:
                self._count_fault(exc.reason)
                raise
            if attempt + 1 == attempts:
                break
            wait = self.spec.backoff_seconds * 2**attempt
            if time.monotonic() + wait >= deadline:  # no time left for another attempt
                break
            with self._lock:
                self.stats.retries += 1
            self._sleep(wait)
        self._count_fault(last.reason)
        left = "" if tried == attempts else (f" ({attempts - tried} retries left out: they would not start within "
                                              f"the call's deadline, {self._deadline_rule()})")
        raise EnvFault(last.reason, f"{self.what} {redact_url(url)}: {tried} attempt(s) failed{left}; last: {last}")

    def _count_fault(self, reason: str) -> None:
        with self._lock:
            self.stats.faults[reason] = self.stats.faults.get(reason, 0) + 1

    @contextmanager
    def _slot(self, deadline: float) -> Iterator[None]:
        """Hold one of ``maxConcurrency`` slots; the wait for it counts against the deadline."""
        with self._lock:
            self.stats.waiting += 1
        got = self._slots.acquire(timeout=max(deadline - time.monotonic(), 0.0))
        with self._lock:
            self.stats.waiting -= 1
            if got:
                self.stats.in_flight += 1
                self.stats.most_in_flight = max(self.stats.most_in_flight, self.stats.in_flight)
                self.stats.requests += 1
        if not got:
            raise _Retry("remote_timeout", f"no free slot (maxConcurrency={self.spec.max_concurrency}) within the "
                         f"call's deadline ({self._deadline_rule()})")
        try:
            yield
        finally:
            with self._lock:
                self.stats.in_flight -= 1
            self._slots.release()

    def _connection(self, url: str, seconds: float) -> tuple[http.client.HTTPConnection, str]:
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise EnvFault("remote_unreachable", f"{self.what} {redact_url(url)}: the port is not a number") from None
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname or ""
        if parts.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=seconds,
                                               context=ssl.create_default_context()), target
        return http.client.HTTPConnection(host, port, timeout=seconds), target

    def _attempt(self, url: str, body: bytes, deadline: float) -> dict[str, Any]:
        shown = redact_url(url)
        with self._slot(deadline):
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Retry("remote_timeout", f"no time left ({self._deadline_rule()})")
            conn, target = self._connection(url, left)
            watchdog = _Watchdog(conn, left)
            try:
                conn.request("POST", target, body=body, headers={
                    "Content-Type": "application/json", "Accept": "application/json",
                    "X-Asyncrl-Protocol": str(PROTOCOL_VERSION), **self._headers,
                })
                response = conn.getresponse()
                raw = self._answer(url, response)
                if watchdog.fired.is_set():  # the socket was cut under a body that then looked complete
                    raise TimeoutError
            except (EnvFault, _Retry):
                raise
            except Exception as exc:  # noqa: BLE001 - sorted into the protocol's reasons below
                raise self._sorted(exc, shown, watchdog.fired.is_set()) from None
            finally:
                watchdog.cancel()
                conn.close()
        return self._decode(shown, raw)

    def _sorted(self, exc: Exception, shown: str, cut: bool) -> Exception:
        """The fault (or retry) an exception of one attempt stands for."""
        if cut or isinstance(exc, TimeoutError):
            return _Retry("remote_timeout", f"no whole answer within the call's deadline of {self.deadline_s:g} s "
                          f"({self._deadline_rule()}, every attempt and byte included)")
        if isinstance(exc, ConnectionError | http.client.IncompleteRead):  # refused, reset, closed mid-answer
            return _Retry("remote_unreachable", f"cannot connect or connection lost ({type(exc).__name__})")
        if isinstance(exc, http.client.HTTPException):  # not HTTP at all (a garbage status line)
            return EnvFault("remote_bad_response", f"{self.what} {shown} does not speak HTTP ({type(exc).__name__})")
        if isinstance(exc, OSError):  # DNS failure, unreachable network, TLS
            return _Retry("remote_unreachable", f"cannot connect ({type(exc).__name__}: {exc.strerror or exc})")
        raise exc

    def _answer(self, url: str, response: http.client.HTTPResponse) -> bytes:
        """The body of a 2xx answer; a 3xx, 4xx or 5xx as its fault."""
        shown, code = redact_url(url), response.status
        if 300 <= code < 400:
            location = response.getheader("Location")
            to = f" to {redact_url(urljoin(url, location))}" if location else ""
            raise EnvFault("remote_http_error", f"{self.what} {shown} answered HTTP {code}, a redirect{to}: redirects "
                           "are not followed (a redirect could send the request and its headers anywhere); give the "
                           "service's final address as url")
        if code >= 400:
            detail = self._read(response, MAX_SHOWN, cut=True).decode(errors="replace")
            if code >= 500:
                raise _Retry("remote_http_error", f"HTTP {code} {detail!r}")
            raise EnvFault("remote_http_error", f"{self.what} {shown} refused the request with HTTP {code} "
                           f"{detail!r} (not retried: a 4xx says the request is wrong)")
        cap = self.spec.max_response_bytes
        if response.length is not None and response.length > cap:
            raise EnvFault("remote_bad_response", f"{self.what} {shown} announced an answer of {response.length} "
                           f"bytes, more than maxResponseBytes={cap}; refused unread (not retried)")
        return self._read(response, cap, cut=False, shown=shown)

    def _read(self, response: http.client.HTTPResponse, cap: int, *, cut: bool, shown: str = "") -> bytes:
        """At most ``cap`` bytes of the body, one socket read at a time. ``cut``: the first ``cap`` bytes are
        enough (an error's detail); else a longer body is refused after ``cap + 1`` bytes."""
        chunks, got = [], 0
        while True:
            chunk = response.read1(min(_CHUNK, cap + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got > cap:
                if cut:
                    break
                raise EnvFault("remote_bad_response", f"{self.what} {shown} answered more than "
                               f"maxResponseBytes={cap} bytes; refused after reading {got} (not retried)")
        if not cut and response.length:  # the server closed before the length it announced
            raise http.client.IncompleteRead(b"", response.length)
        return b"".join(chunks)[:cap]

    def _decode(self, shown: str, raw: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise EnvFault("remote_bad_response", f"{self.what} {shown} answered {raw[:MAX_SHOWN]!r}, not JSON") \
                from None
        if not isinstance(answer, dict):
            raise EnvFault("remote_bad_response", f"{self.what} {shown} answered "
                           f"{json.dumps(answer)[:MAX_SHOWN]}, not a JSON object")
        return answer
