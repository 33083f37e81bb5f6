"""The status relay against the other processes of the driver container (issue 35, part C), over a real Unix socket.

Before (measured on main, ``relay.py`` of 2026-12-05): one client sending a byte every 4 s held the
single-threaded relay, so the driver's report failed after its 15 s; with one client trickling, 4 of 10 further
connections were refused at once (listen backlog 5); another process's valid-looking summary
(``policyVersion: 999``) was sent and took the driver's rate limit; 300 early disconnects printed 5,400 lines of
tracebacks.

After, one row each: the trickle is cut off at the relay's deadline and the driver's report goes through while it
is open; idle connections past the old backlog, and past the relay's own cap, do not keep the driver's report
out; reports without the registered driver's token are refused (401) before their summary is read and take none of
its rate limit; a flood of disconnects logs one line per kind. Everything is synchronised on the relay's counts
and on the sockets' own events (a closed connection reads b""), never on elapsed time.
"""

import json
import logging
import select
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.status import TrainingSummary, training_patch
from asyncrl.trainer.driver.status.relay import LogLimiter, Relay, RelayError, register_driver
from asyncrl.trainer.driver.status.relay_server import RelayServer, serve_in_thread

BOUND_S = 60.0  # a safety bound on every wait, never a measured time


def until(pred: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``pred()`` holds: the relay's counts change on its own thread."""
    end = time.monotonic() + BOUND_S
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.01)


class Recorder:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)


@pytest.fixture
def relay_at(tmp_path: Path) -> Iterator[Callable[..., tuple[RelayServer, Recorder, Path]]]:
    started: list[RelayServer] = []

    def start(**options: Any) -> tuple[RelayServer, Recorder, Path]:
        path = tmp_path / f"status-{len(started)}.sock"
        sent = Recorder()
        server, _ = serve_in_thread(path, sent, **options)
        started.append(server)
        return server, sent, path

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def connect(path: Path) -> socket.socket:
    """A client as a plain program writes it: a blocking connect (it waits while the relay's backlog is full)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    s.settimeout(BOUND_S)
    return s


def is_open(s: socket.socket) -> bool:
    """The relay has not closed ``s`` (nothing to read yet, no EOF); looks without waiting."""
    s.setblocking(False)  # with a timeout set, Python's recv would wait for readability first
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    finally:
        s.settimeout(BOUND_S)


def report(version: int) -> dict[str, Any]:
    return training_patch(TrainingSummary(policy_version=version))


# ---------------------------------------------------------------- one slow client

def test_a_trickling_client_does_not_hold_the_drivers_report(relay_at: Any) -> None:
    server, sent, path = relay_at(deadline_s=BOUND_S)
    send = register_driver(path)
    trickler = connect(path)
    trickler.sendall(b'{"status"')  # and nothing more for now
    until(lambda: server.counts.accepted >= 2, "the trickler accepted")
    send(report(5))  # answered while the trickle is open
    assert is_open(trickler) and server.counts.cut_off == 0
    assert [b["status"]["training"]["policyVersion"] for b in sent.bodies] == [5]
    trickler.close()


def test_a_trickle_is_cut_off_at_the_deadline_however_often_it_sends(relay_at: Any) -> None:
    server, _, path = relay_at(deadline_s=0.2)
    trickler = connect(path)
    sent_bytes, closed = 0, False
    for _ in range(10_000):  # one byte, then a short look for the relay's close: a client that never stops
        try:
            trickler.sendall(b" ")
            sent_bytes += 1
        except OSError:
            closed = True
            break
        readable, _, _ = select.select([trickler], [], [], 0.02)
        if readable and trickler.recv(1) == b"":
            closed = True
            break
    assert closed and sent_bytes > 1  # it kept sending, and the relay closed it anyway
    until(lambda: server.counts.cut_off == 1, "the cut-off counted")


# ---------------------------------------------------------------- many connections

@pytest.mark.parametrize("idle, cap, overflow", [(10, 64, 0), (12, 4, 9)], ids=["past-the-old-backlog", "past-the-cap"])
def test_idle_connections_do_not_keep_the_drivers_report_out(relay_at: Any, idle: int, cap: int,
                                                             overflow: int) -> None:
    server, sent, path = relay_at(deadline_s=BOUND_S, max_connections=cap)
    send = register_driver(path)
    held = [connect(path) for _ in range(idle)]  # before: the 6th queued connection was refused at once
    until(lambda: server.counts.accepted == idle + 1, f"{idle} idle connections accepted")
    send(report(3))
    assert len(sent.bodies) == 1
    # with a cap of 4: 12 idle ones and the driver's closed the 9 oldest idle ones (the driver's came whole)
    assert server.counts.overflow == overflow
    for s in held:
        s.close()


# ---------------------------------------------------------------- only the driver's reports

def test_another_process_cannot_report_nor_take_the_drivers_rate_limit(relay_at: Any) -> None:
    server, sent, path = relay_at()
    send = register_driver(path)
    answers = []
    for forged in ({"status": {"training": {"policyVersion": 999}}},
                   {"token": "x" * 43, "status": {"training": {"policyVersion": 999}}},
                   {"register": "y" * 43}):
        for _ in range(5):
            with connect(path) as s:
                s.sendall(json.dumps(forged).encode() + b"\n")
                answers.append(json.loads(s.makefile("rb").readline())["status"])
    assert answers == [401] * 10 + [403] * 5
    for version in (1, 2, 3, 4):  # the whole burst is still the driver's
        send(report(version))
    assert [b["status"]["training"]["policyVersion"] for b in sent.bodies] == [1, 2, 3, 4]
    with pytest.raises(RelayError) as err:
        send(report(5))
    assert err.value.status == 429  # its own limit, reached by its own reports


def test_a_restarted_sidecar_still_knows_the_driver(tmp_path: Path) -> None:
    path = tmp_path / "status.sock"
    sent = Recorder()
    first, _ = serve_in_thread(path, sent)
    send = register_driver(path)
    first.shutdown()
    first.server_close()
    assert (tmp_path / "status.sock.driver").stat().st_mode & 0o777 == 0o600
    for keep_file in (True, False):
        if not keep_file:
            (tmp_path / "status.sock.driver").unlink()
        again, _ = serve_in_thread(path, sent)
        try:
            send(report(7))  # without the file, the sender registers its own token again, then sends
            if keep_file:
                with pytest.raises(RelayError) as err:
                    register_driver(path, wait_s=0.0)
                assert err.value.status == 403
        finally:
            again.shutdown()
            again.server_close()
    assert len(sent.bodies) == 2


# ---------------------------------------------------------------- logs

def test_a_flood_of_early_disconnects_logs_one_line_per_kind(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "status.sock"
    relay = Relay(Recorder(), logs=LogLimiter(every_s=3600.0))
    server, _ = serve_in_thread(path, Recorder(), relay=relay)
    try:
        with caplog.at_level(logging.WARNING, logger="asyncrl.trainer.driver.status"):
            for i in range(300):
                s = connect(path)
                # half leave mid-request, half after a whole (unauthorised) request, before the answer
                s.sendall(b'{"status"' if i % 2 else b'{"status": {"training": {"policyVersion": 999}}}\n')
                s.close()
            until(lambda: server.counts.disconnected + server.counts.overflow + relay.unauthorized >= 300,
                  "300 connections handled")
        lines = [r for r in caplog.records if "status relay" in r.getMessage()]
    finally:
        server.shutdown()
        server.server_close()
    assert 0 < relay.unauthorized <= 150 and relay.sent == 0  # a whole line not read before the cap closed it: none
    # one line per kind: disconnected, unauthorized and (when the flood outran the reading thread) overflow
    assert len(lines) <= 3, [r.getMessage() for r in lines]
    assert sum(relay.logs.suppressed.values()) >= 300 - 3
