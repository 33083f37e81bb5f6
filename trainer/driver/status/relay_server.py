"""The status relay's Unix-socket server (the driver pod's ``status`` sidecar): one process cannot block it.

Before, the relay served one connection at a time with a 5 s timeout per read: a client sending a byte every
4 s held it, so the driver's report failed after its 15 s; the listen backlog was 5, so the 6th queued
connection failed at once; and a client that left before its answer printed a traceback (300 early
disconnects: 5,400 lines on stderr).

Now:

- one thread reads every connection (``selectors``) into a buffer of at most
  :data:`~.relay.MAX_REQUEST_BYTES`; a whole request line must arrive within ``deadline_s`` of the connect, or
  the connection is closed (``cut_off``): a trickle holds nothing but its own connection;
- a complete line is triaged there (:meth:`~.relay.Relay.triage`: size, JSON, token, shape, rate limit, no API
  call); a refusal is answered at once. Only the driver's own reports reach the ``workers`` threads that call the
  API, so nothing another process sends queues in front of them;
- the listen backlog is :data:`BACKLOG`; at most ``max_connections`` wait for their line at once (one more
  closes the oldest of them, counted: ``overflow``);
- a client that leaves early is counted (``disconnected``), and every kind of log line is rate-limited
  (:class:`~.relay.LogLimiter`).

No port listens: the socket lives on an emptyDir that only the pod's two containers mount, and it is the
owner's only (mode 0600; both containers run as the same user).
"""

import json
import logging
import os
import selectors
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.trainer.driver.status.api import Sender
from asyncrl.trainer.driver.status.relay import MAX_REQUEST_BYTES, Relay, TrainingSummary

log = logging.getLogger(__name__)

CONNECTION_DEADLINE_S = 5.0  # a whole request line must arrive within this of the connect
ANSWER_TIMEOUT_S = 5.0  # writing the answer (a client that does not read is dropped)
BACKLOG = 128  # connections the kernel queues before the relay accepts them
MAX_CONNECTIONS = 64  # open at once; more are closed at accept
ACCEPTS_PER_ROUND = 16  # then the connections already there are read again
WORKERS = 2  # API calls at once: the driver's reports only (one per 30 s, a stuck phase, the final flush)


@dataclass
class _Reading:
    conn: socket.socket
    deadline: float
    buffer: bytearray = field(default_factory=bytearray)


@dataclass
class ServerCounts:
    """What the server did with connections (the relay's own counts are on :class:`~.relay.Relay`)."""

    accepted: int = 0
    cut_off: int = 0  # no whole request line within the deadline
    disconnected: int = 0  # left before the answer was written (or sent nothing at all)
    overflow: int = 0  # the oldest one closed at an accept: max_connections were open


class RelayServer:
    """The relay on ``path`` (a stale socket from a restarted sidecar is replaced; the registered driver's token
    digest is kept in ``<path>.driver`` so that a restarted sidecar still knows it)."""

    def __init__(self, path: str | Path, relay: Relay, *, deadline_s: float = CONNECTION_DEADLINE_S,
                 max_connections: int = MAX_CONNECTIONS, workers: int = WORKERS) -> None:
        self.relay, self.deadline_s, self.max_connections = relay, deadline_s, max_connections
        self.counts = ServerCounts()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._driver_file = self.path.with_name(self.path.name + ".driver")
        if relay.driver is None and self._driver_file.is_file():
            try:
                relay.driver = bytes.fromhex(self._driver_file.read_text().strip()) or None
            except (OSError, ValueError, UnicodeDecodeError):  # unreadable: the driver registers again
                log.warning("status relay: %s is unreadable; waiting for the driver to register again",
                            self._driver_file)
        relay.remember = self._remember
        if self.path.is_socket():
            self.path.unlink()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self._sock.listen(BACKLOG)
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._reading: dict[int, _Reading] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="status-relay-send")
        self._stop = threading.Event()
        self._stopped = threading.Event()

    def _remember(self, digest: bytes) -> None:
        tmp = self._driver_file.with_name(self._driver_file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(digest.hex())
        os.replace(tmp, self._driver_file)

    # ------------------------------------------------------------------ the reading thread
    def serve_forever(self) -> None:
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                due = min((r.deadline for r in self._reading.values()), default=now + 1.0)
                events = self._selector.select(timeout=max(0.0, due - now))
                # reads first, then a bounded number of accepts: a connection whose line is there is read in the
                # round after its accept, before a flood of new ones could make it the oldest (the one a full
                # table closes)
                for key, _ in events:
                    if key.data is not None:
                        self._read(key.data)
                    elif key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                if any(key.fileobj is self._sock for key, _ in events):
                    self._accept()
                self._expire(time.monotonic())
        finally:
            for r in list(self._reading.values()):
                self._drop(r)
            self._stopped.set()

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            self.counts.accepted += 1
            if len(self._reading) >= self.max_connections:
                # full: the oldest connection still without a whole line goes, not the new one (the driver's
                # report arrives whole at once, so a flood of idle connections cannot keep it out)
                self.counts.overflow += 1
                self.relay.logs.warning("overflow", f"{self.max_connections} connections open without a whole "
                                        "request: closed the oldest")
                self._drop(min(self._reading.values(), key=lambda r: r.deadline))
            conn.setblocking(False)
            r = _Reading(conn, time.monotonic() + self.deadline_s)
            self._reading[conn.fileno()] = r
            self._selector.register(conn, selectors.EVENT_READ, r)

    def _read(self, r: _Reading) -> None:
        try:
            chunk = r.conn.recv(MAX_REQUEST_BYTES + 1 - len(r.buffer))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.counts.disconnected += 1
            self.relay.logs.warning("disconnected", "a client left before sending a whole request")
            self._drop(r)
            return
        r.buffer += chunk
        end = r.buffer.find(b"\n")
        if end < 0 and len(r.buffer) <= MAX_REQUEST_BYTES:
            return
        line = bytes(r.buffer if end < 0 else r.buffer[: end + 1])
        self._release(r)
        t = self.relay.triage(line)
        if t.answer is not None:
            self._write(r.conn, t.answer, blocking=False)  # a refusal: one small line into an empty buffer
        else:
            assert t.summary is not None
            self._pool.submit(self._deliver, r.conn, t.summary)

    def _expire(self, now: float) -> None:
        for r in [r for r in self._reading.values() if r.deadline <= now]:
            self.counts.cut_off += 1
            self.relay.logs.warning("cut-off", f"closed a connection with no whole request within {self.deadline_s:g} s")
            self._drop(r)

    def _release(self, r: _Reading) -> None:
        self._selector.unregister(r.conn)
        self._reading.pop(r.conn.fileno(), None)

    def _drop(self, r: _Reading) -> None:
        self._release(r)
        r.conn.close()

    # ------------------------------------------------------------------ answers
    def _deliver(self, conn: socket.socket, summary: TrainingSummary) -> None:
        self._write(conn, self.relay.deliver(summary), blocking=True)

    def _write(self, conn: socket.socket, answer: dict[str, object], *, blocking: bool) -> None:
        try:
            if blocking:
                conn.settimeout(ANSWER_TIMEOUT_S)
            conn.sendall(json.dumps(answer).encode() + b"\n")
        except OSError:
            self.counts.disconnected += 1
            self.relay.logs.warning("disconnected", "a client left before its answer was written")
        finally:
            conn.close()

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Stop :meth:`serve_forever` (from another thread) and wait until it has."""
        self._stop.set()
        self._wake_w.send(b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        self._pool.shutdown(wait=True)
        self._selector.close()
        for s in (self._sock, self._wake_r, self._wake_w):
            s.close()


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


def serve_in_thread(path: str | Path, send: Sender, *, deadline_s: float = CONNECTION_DEADLINE_S,
                    max_connections: int = MAX_CONNECTIONS,
                    relay: Relay | None = None) -> tuple[RelayServer, threading.Thread]:
    """The relay in a daemon thread (tests, and a driver that relays for itself)."""
    server = RelayServer(path, relay or Relay(send), deadline_s=deadline_s, max_connections=max_connections)
    thread = threading.Thread(target=server.serve_forever, name="status-relay", daemon=True)
    thread.start()
    return server, thread


__all__ = ["RelayServer", "ServerCounts", "serve", "serve_in_thread"]
