"""The status relay (the driver pod's ``status`` sidecar): it sends ``status.training`` and nothing else.

Before: the driver patched the job's status itself, with a token that also let it read the job and
patch every status field. Now the token is in the sidecar, which takes a validated summary over a Unix
socket and sends only ``{"status": {"training": ...}}``. On the real API server, with the
``<job>-status`` token: ``tests/operator/test_server_dataset_volume.py``. That the relay takes the registered
driver's reports only, and that one process cannot block it: ``tests/trainer/test_status_relay_hostile.py``.
"""

import json
import socket
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiException

from asyncrl.api.status import TrainingSummary, training_patch
from asyncrl.trainer.driver.status.relay import (
    MAX_REQUEST_BYTES,
    RateLimit,
    Relay,
    RelayError,
    register_driver,
    token_digest,
)
from asyncrl.trainer.driver.status.relay_server import serve_in_thread
from asyncrl.trainer.driver.status.reporter import StatusReporter

SUMMARY = TrainingSummary(policy_version=7, keep_ratio=0.25, reported_at="2026-12-01T00:00:00Z")
TOKEN = "t" * 43  # the driver's registration token (secrets.token_urlsafe(32) is 43 characters)


class Recorder:
    """A sender that keeps what it was given (or raises ``error``)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.error = error

    def __call__(self, body: dict[str, Any]) -> None:
        if self.error is not None:
            raise self.error
        self.bodies.append(body)


def line(doc: Any) -> bytes:
    """A request line of the registered driver (its token added to an object)."""
    return json.dumps({"token": TOKEN, **doc} if isinstance(doc, dict) else doc).encode() + b"\n"


def registered(send: Any, limit: RateLimit | None = None) -> Relay:
    return Relay(send, limit, driver=token_digest(TOKEN))


def test_a_summary_is_sent_as_the_training_patch_only() -> None:
    sent = Recorder()
    relay = registered(sent)
    assert relay.handle(line(training_patch(SUMMARY))) == {"ok": True}
    # keepPercent derived (25.0) as the driver's own patch would carry it
    assert sent.bodies == [{"status": {"training": {"policyVersion": 7, "keepRatio": 0.25, "keepPercent": 25.0,
                                                    "ewmaResets": 0, "envErrors": 0, "stalenessMax": 0,
                                                    "reportedAt": "2026-12-01T00:00:00Z"}}}]


@pytest.mark.parametrize("doc, says", [
    ({"status": {"training": {"policyVersion": 1}, "phase": "Succeeded"}}, "got status keys ['phase', 'training']"),
    ({"status": {"phase": "Succeeded"}}, "got status keys ['phase']"),
    ({"metadata": {"labels": {"a": "b"}}, "status": {"training": {"policyVersion": 1}}}, "status.training only"),
    ({"status": {"training": {"policyVersion": 1, "restarts": 0}}}, "status.training.restarts: Extra inputs"),
    ({"status": {"training": {"policyVersion": -1}}}, "status.training.policyVersion: Input should be greater"),
    ({"status": {"training": {"policyVersion": 1, "keepRatio": 3.0}}}, "status.training.keepRatio"),
    ([1, 2], "must be a JSON object"),
], ids=["other-status-field", "phase-only", "metadata", "unknown-training-field", "negative", "ratio-above-1",
        "not-an-object"])
def test_anything_but_a_valid_summary_is_refused_and_nothing_is_sent(doc: Any, says: str) -> None:
    sent = Recorder()
    answer = registered(sent).handle(line(doc))
    assert answer["ok"] is False and answer["status"] == 400 and says in answer["reason"], answer
    assert sent.bodies == []


def test_not_json_and_oversize_requests_are_refused() -> None:
    relay = registered(Recorder())
    assert "not JSON" in relay.handle(b"{nope\n")["reason"]
    big = b'{"status": {"training": {"policyVersion": 1, "lastCheckpoint": "' + b"x" * MAX_REQUEST_BYTES + b'"}}}\n'
    assert f"over {MAX_REQUEST_BYTES} bytes" in relay.handle(big)["reason"]
    assert relay.refused == 2 and relay.sent == 0


def test_the_rate_limit_allows_a_burst_then_one_per_refill() -> None:
    now = [0.0]
    sent = Recorder()
    relay = registered(sent, RateLimit(burst=4, refill_s=5.0, clock=lambda: now[0]))
    answers = [relay.handle(line(training_patch(SUMMARY)))["ok"] for _ in range(5)]
    assert answers == [True, True, True, True, False] and len(sent.bodies) == 4
    now[0] = 4.9  # 0.98 of a token back: still none
    assert relay.handle(line(training_patch(SUMMARY)))["status"] == 429
    now[0] = 10.0  # 10 s / 5 s = 2 tokens since the burst (the refused calls take none)
    assert [relay.handle(line(training_patch(SUMMARY)))["ok"] for _ in range(3)] == [True, True, False]


def test_over_the_socket_a_report_arrives_and_an_api_error_comes_back_with_its_code(tmp_path: Path) -> None:
    path = tmp_path / "status.sock"
    sent = Recorder()
    server, thread = serve_in_thread(path, sent)
    try:
        assert path.stat().st_mode & 0o777 == 0o600  # the owner's only
        reporter = StatusReporter(register_driver(path))
        assert reporter.flush() and reporter.sent == 1 and sent.bodies[0]["status"]["training"]["policyVersion"] == 0
        sent.error = ApiException(status=403, reason="Forbidden")
        assert not reporter.flush()
        # the reporter counts and explains it as it would a direct API call (describe_failure's RBAC hint)
        assert reporter.failures == 1 and reporter.last_error is not None
        assert reporter.last_error.startswith("RelayError 403: Forbidden -- RBAC: the Role <job>-status"), \
            reporter.last_error
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_missing_sidecar_is_a_counted_failure_that_names_it(tmp_path: Path) -> None:
    from asyncrl.trainer.driver.status.relay import relay_sender

    with pytest.raises(RelayError) as err:
        register_driver(tmp_path / "absent.sock", wait_s=0.0)
    assert err.value.status is None and "the status sidecar does not answer on" in err.value.reason
    send = relay_sender(tmp_path / "absent.sock", TOKEN)
    reporter = StatusReporter(send)
    assert not reporter.flush() and reporter.failures == 1


def test_a_restarted_sidecar_replaces_its_stale_socket(tmp_path: Path) -> None:
    path = tmp_path / "status.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))  # what a killed sidecar leaves behind
    stale.close()
    sent = Recorder()
    server, thread = serve_in_thread(path, sent)
    try:
        register_driver(path)(training_patch(SUMMARY))
        assert len(sent.bodies) == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_sigterm_stops_the_relay_cleanly(tmp_path: Path) -> None:
    """The sidecar is PID 1 of its container, where a signal left at its default action is dropped: the relay
    must handle SIGTERM itself (exit 0 here; -15 would mean the default action, which PID 1 never takes)."""
    import signal
    import subprocess
    import sys

    sock = tmp_path / "s.sock"
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
            "from asyncrl.trainer.driver.status.relay_server import serve; "
            f"serve({str(sock)!r}, lambda body: None)")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        assert "listening" in proc.stderr.readline()  # the server is up (an event, not a sleep)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
