"""Hostile reward services on loopback, and the table of their answers (``HOSTILE_ANSWERS``).

:class:`HostileServer` speaks raw HTTP over a socket so that it can do what no well-behaved
framework would: drip its answer a byte at a time, announce or stream 300 MiB, redirect elsewhere,
or hold its answer until the test opens a gate. It records what it received (``heads``: the request
head of each connection, as text) and how much it managed to send (``sent``) before the client went.

Each row of :data:`HOSTILE_ANSWERS` is refused with the reason in ``reason`` and a message that holds
every string of ``says``; the client's cap or deadline is what ends it (``tests/rollout/test_hostile_services.py``).
"""

import socket
import threading
from dataclasses import dataclass
from typing import Any

MIB = 2**20
DRIP_GAP_S = 0.05  # between two dripped bytes: far below any timeoutSeconds the tests set
DRIP_FOR_S = 30.0  # a drip gives up after this (a client without a total deadline would wait this long)


@dataclass(frozen=True)
class HostileAnswer:
    """One way to answer: ``mode`` of :class:`HostileServer`; the fault it must end in."""

    mode: str
    reason: str
    says: tuple[str, ...]
    before: str  # what the client of main did (measured), for the report


HOSTILE_ANSWERS: tuple[HostileAnswer, ...] = (
    HostileAnswer("redirect", "remote_http_error", ("HTTP 302", "redirects are not followed"),
                  "followed the 302 to the other host and used its reward"),
    HostileAnswer("drip-body", "remote_timeout", ("deadline",),
                  "one byte every 50 ms never tripped the per-read timeout: the call took as long as the drip"),
    HostileAnswer("drip-head", "remote_timeout", ("deadline",),
                  "header lines dripped a byte at a time: the same"),
    HostileAnswer("huge-declared", "remote_bad_response", ("announced an answer of 314572800 bytes",),
                  "read all 300 MiB into memory, then failed to parse them"),
    HostileAnswer("huge-streamed", "remote_bad_response", ("more than maxResponseBytes=65536",),
                  "read until the server closed: 300 MiB"),
    HostileAnswer("huge-chunked", "remote_bad_response", ("more than maxResponseBytes=65536",),
                  "read every chunk: 300 MiB"),
    HostileAnswer("deep-json", "remote_bad_response", ("not JSON",),
                  "RecursionError out of json.loads (a traceback, reason exception)"),
)


class HostileServer:
    """A loopback HTTP server with one hostile ``mode`` (see :data:`HOSTILE_ANSWERS`), plus:

    - ``"ok"``: ``{"reward": 1.0}``;
    - ``"gate"``: ``{"reward": 1.0}`` once :meth:`open_gate` is called (``waiting`` counts held requests);
    - ``"redirect"`` sends ``Location: <redirect_to>``.
    """

    def __init__(self, mode: str, *, redirect_to: str = "", size: int = 300 * MIB) -> None:
        self.mode, self.redirect_to, self.size = mode, redirect_to, size
        self.heads: list[str] = []
        self.sent = 0
        self.waiting = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._gate = threading.Event()
        self._stop = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/score"
        self._thread = threading.Thread(target=self._serve, name="hostile-server", daemon=True)
        self._thread.start()

    # --------------------------------------------------------------------------------- control
    def open_gate(self) -> None:
        self._gate.set()

    def wait_for(self, predicate: Any, timeout_s: float = 30.0) -> bool:
        """Block until ``predicate(self)`` holds (re-checked whenever a request arrives or leaves)."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout=timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self._gate.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() that close() alone leaves blocked
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "HostileServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # --------------------------------------------------------------------------------- serving
    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _read_request(self, conn: socket.socket) -> str:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        text = head.decode("latin-1")
        length = next((int(line.split(":", 1)[1]) for line in text.split("\r\n")
                       if line.lower().startswith("content-length:")), 0)
        while len(rest) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            rest += chunk
        return text

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        with self._lock:
            self.sent += len(data)

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                head = self._read_request(conn)
                with self._changed:
                    self.heads.append(head)
                    self._changed.notify_all()
                answer = {"ok": self._ok, "gate": self._held, "redirect": self._redirect, "drip-body": self._drip_body,
                          "drip-head": self._drip_head, "huge-declared": self._huge_declared,
                          "huge-streamed": self._huge_streamed, "huge-chunked": self._huge_chunked,
                          "deep-json": self._deep_json}[self.mode]
                answer(conn)
        except OSError:
            pass  # the client gave up (cap or deadline): a reset or a broken pipe here is the point

    def _ok(self, conn: socket.socket) -> None:
        body = b'{"reward": 1.0}'
        self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                   b"Connection: close\r\n\r\n%s" % (len(body), body))

    def _held(self, conn: socket.socket) -> None:  # "gate": hold until open_gate()
        with self._changed:
            self.waiting += 1
            self._changed.notify_all()
        self._gate.wait()
        with self._changed:
            self.waiting -= 1
            self._changed.notify_all()
        self._ok(conn)

    def _redirect(self, conn: socket.socket) -> None:
        self._send(conn, f"HTTP/1.1 302 Found\r\nLocation: {self.redirect_to}\r\nContent-Length: 0\r\n"
                   "Connection: close\r\n\r\n".encode())

    def _drip(self, conn: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self._stop.wait(DRIP_GAP_S) or i * DRIP_GAP_S > DRIP_FOR_S:
                return
            self._send(conn, data[i:i + 1])

    def _drip_body(self, conn: socket.socket) -> None:
        body = b'{"reward": 1.0, "pad": "' + b"x" * 4096 + b'"}'
        self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % len(body))
        self._drip(conn, body)

    def _drip_head(self, conn: socket.socket) -> None:
        self._drip(conn, b"HTTP/1.1 200 OK\r\nX-Pad: " + b"y" * 4096 + b"\r\n\r\n")

    def _huge_declared(self, conn: socket.socket) -> None:
        self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % self.size)
        self._stream(conn, self.size)

    def _huge_streamed(self, conn: socket.socket) -> None:  # no length: the body ends when the server closes
        self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n")
        self._stream(conn, self.size)

    def _huge_chunked(self, conn: socket.socket) -> None:
        self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b" " * MIB
        for _ in range(self.size // MIB):
            if self._stop.is_set():
                return
            self._send(conn, b"%x\r\n%s\r\n" % (len(piece), piece))
        self._send(conn, b"0\r\n\r\n")

    def _stream(self, conn: socket.socket, size: int) -> None:
        piece = b" " * MIB  # JSON whitespace: a client that read it all would parse 300 MiB of it
        for _ in range(size // MIB):
            if self._stop.is_set():
                return
            self._send(conn, piece)

    def _deep_json(self, conn: socket.socket) -> None:
        body = b"[" * 30_000 + b"]" * 30_000  # 60 kB, below the tests' cap; far past json's recursion limit
        self._send(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                   % (len(body), body))
