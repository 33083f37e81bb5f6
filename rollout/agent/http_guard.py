"""The agent endpoint's HTTP connections, bounded below the ASGI app: uvicorn's httptools protocol with a guard.

uvicorn has no option for most of these with its ``httptools`` parser (measured on uvicorn 0.3x, httptools 0.6+):
``h11_max_incomplete_event_size`` bounds only the h11 parser's buffer, httptools takes a 16 MiB header and parses a
64 MiB one for a minute (its header values grow by concatenation); ``limit_concurrency`` answers 503 only once a
connection has sent its headers, so half-open connections still hold the worker's descriptors; ``timeout_keep_alive``
starts only after a response, so a client that never finishes its headers (slowloris) is held forever. So
:class:`GuardedProtocol` checks, before a byte reaches the parser or the app:

1. the connection count: connection ``maxConnections + 1`` is answered 503 and closed at once;
2. the header block's size: counted as it arrives and refused with 431 once over ``maxHeaderBytes`` (at most one
   socket read past the cap is held), the connection closed;
3. the header block's time: a connection that has not completed its headers within ``headerTimeoutSeconds`` of its
   first byte (or of connecting) is closed;
4. the key, once the headers are parsed and before the body is read: a request for a session route with no key or a
   key no session has is answered 401 from here (an aborted session's key 409) (no ASGI task, no Starlette routing: a 401 flood costs the decode
   loop's GIL a few microseconds a request) and its connection closed, so its body is never read.

Every refusal is answered in OpenAI's error shape and counted (:class:`~asyncrl.rollout.agent.limits.Refusals`).
"""

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from asyncrl.rollout.agent.limits import EndpointLimits, RefusalReason
from asyncrl.rollout.agent.protocol import RequestError

_END = b"\r\n\r\n"
_LINGER_S = 0.5  # between a refusal's answer and the close
_REASON_PHRASES = {401: b"Unauthorized", 408: b"Request Timeout", 409: b"Conflict",
                   431: b"Request Header Fields Too Large",
                   503: b"Service Unavailable"}


@dataclass(frozen=True)
class Guard:
    """What the protocol needs of its endpoint: the bounds, where refusals are counted, and the key check
    (``check_key(method, path, authorization header)``: the 401 to answer, or None to let the request through)."""

    limits: EndpointLimits
    refused: Callable[[RefusalReason], None]
    check_key: Callable[[str, str, str], RequestError | None]


def canned(exc: RequestError, *, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 response of ``exc`` in OpenAI's error shape that closes its connection."""
    body = json.dumps(exc.body()).encode()
    phrase = _REASON_PHRASES.get(exc.status, b"Error")
    head = [b"HTTP/1.1 %d %s" % (exc.status, phrase), b"content-type: application/json",
            b"content-length: %d" % len(body), b"connection: close"]
    head += [f"{k}: {v}".encode("latin-1") for k, v in (headers or {}).items()]
    return b"\r\n".join(head) + _END + body


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guard of the module docstring (one subclass per endpoint:
    :func:`guarded_protocol`)."""

    guard: ClassVar[Guard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = True  # the bytes arriving now belong to a header block
        self._header_bytes = 0  # of the header block so far
        self._tail = b""  # the last 3 bytes seen, for an end marker split across reads
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    # ------------------------------------------------------------------ bounds
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # refused connections lingering before their close do not count: a flood of 401s must not fill the cap
        live = sum(not (isinstance(c, GuardedProtocol) and c._refused) for c in self.connections)
        if live > self.guard.limits.max_connections:
            self._refuse("too_many_connections", RequestError(
                503, f"this rollout worker holds spec.task.endpoint.maxConnections="
                f"{self.guard.limits.max_connections} connections; retry shortly", type_="server_error",
                code="too_many_connections"), {"retry-after": "1"})
            return
        self._arm()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = self.loop.call_later(self.guard.limits.header_timeout_s, self._header_timeout)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _header_timeout(self) -> None:
        self._timer = None
        if self._in_headers and not self._refused and not self.transport.is_closing():
            self._refuse("header_timeout", RequestError(
                408, f"the header block was not complete within spec.task.endpoint.headerTimeoutSeconds="
                f"{self.guard.limits.header_timeout_s:g}", code="header_timeout"))

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_headers:
            self._arm()  # the deadline runs from a message's first byte (a keep-alive idle is uvicorn's own timeout)
            cap = self.guard.limits.max_header_bytes
            end = (self._tail + data).find(_END)
            size = self._header_bytes - len(self._tail) + end + len(_END) if end >= 0 else self._header_bytes + len(data)
            if size > cap:
                self._refuse("header_too_large", RequestError(
                    431, f"the header block is over spec.task.endpoint.maxHeaderBytes={cap}",
                    code="header_too_large"))
                return
            self._header_bytes = size
            self._tail = (self._tail + data)[-3:]
        super().data_received(data)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_headers = False
        self._disarm()
        auth = next((v for k, v in self.headers if k == b"authorization"), b"").decode("latin-1")
        path = self.url.split(b"?", 1)[0].decode("latin-1")
        refusal = self.guard.check_key(self.parser.get_method().decode("ascii", "replace"), path, auth)
        if refusal is not None:
            self._refuse("unauthorized" if refusal.status == 401 else "session_aborted", refusal)
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._in_headers, self._header_bytes, self._tail = True, 0, b""  # the next message's header block

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _refuse(self, reason: RefusalReason, exc: RequestError, headers: dict[str, str] | None = None) -> None:
        """Answer ``exc`` and close: nothing more of this connection is read."""
        self._refused = True
        self._disarm()
        self.guard.refused(reason)
        if not self.transport.is_closing():
            # stop reading, answer, and close a moment later: closing at once with unread bytes in the socket would
            # reset the connection and could drop the answer before the client reads it
            self.transport.pause_reading()
            self.transport.write(canned(exc, headers=headers))
            self.loop.call_later(_LINGER_S, self.transport.close)


def guarded_protocol(guard: Guard) -> type[GuardedProtocol]:
    """The protocol class of one endpoint (uvicorn's ``Config(http=...)`` takes a class)."""
    return type("GuardedProtocol", (GuardedProtocol,), {"guard": guard})


__all__ = ["Guard", "GuardedProtocol", "canned", "guarded_protocol"]
