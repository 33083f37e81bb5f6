"""The in-job status reporter: throttling, window aggregation, final flush, failure tolerance,
and round trips with the real ``kubernetes`` client against the real API server (no operator in that namespace)."""

import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.status import SYNC_PHASE_REPORT_AFTER_SECONDS, JobStatus, SyncPhase
from asyncrl.trainer.driver.run.metrics import SYNC_STATES
from asyncrl.trainer.driver.run.step_report import StepReport
from asyncrl.trainer.driver.status.reporter import StatusReporter, describe_failure, kubernetes_sender

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))

from tests.support.step_reports import step_report  # noqa: E402

WALL = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def step(version: int, valid: float = 100, keep: float = 1.0, clip_low: float = 0.0, clip_high: float = 0.0,
         staleness: int = 0, **extra: Any) -> StepReport:
    """An applied step's report as the loop hands it to ``on_step`` (``checkpoint=``, ``ewma_reset=``, ...)."""
    if "ewma_reset" in extra:
        extra["ewma_reset"] = bool(extra["ewma_reset"])
    return step_report(version, valid, keep, clip_low, clip_high, staleness, **extra)


class Timers:
    """The reporter's scheduler under test control: armed timers wait until the test fires them."""

    def __init__(self) -> None:
        self.armed: list[tuple[float, Callable[[], None], list[bool]]] = []

    def __call__(self, delay: float, callback: Callable[[], None]) -> Callable[[], None]:
        cancelled = [False]
        self.armed.append((delay, callback, cancelled))
        return lambda: cancelled.__setitem__(0, True)

    def live(self) -> list[float]:
        return [d for d, _, c in self.armed if not c[0]]

    def fire(self) -> None:
        """Run the timers that were not cancelled (as their threads would)."""
        due, self.armed = [(cb, c) for _, cb, c in self.armed if not c[0]], []
        for callback, _ in due:
            callback()


def make(fail: bool = False, timers: Timers | None = None) -> tuple[StatusReporter, FakeClock, list[dict[str, Any]]]:
    clock, sent = FakeClock(), []

    def send(body: dict[str, Any]) -> None:
        if fail:
            raise ConnectionError("connection refused")
        sent.append(body)

    return StatusReporter(send, clock=clock, wall=lambda: WALL, schedule=timers or Timers()), clock, sent


def test_at_most_one_patch_per_30_seconds() -> None:
    reporter, clock, sent = make()
    reporter(step(1))  # the first step reports at once
    for v, t in ((2, 10.0), (3, 29.9)):
        clock.t = 1000.0 + t
        reporter(step(v))
    assert len(sent) == 1
    clock.t = 1030.0
    reporter(step(4))
    assert len(sent) == 2 and sent[1]["status"]["training"]["policyVersion"] == 4


def test_window_aggregates_tokens_not_ratios() -> None:
    reporter, clock, sent = make()
    reporter(step(1))  # opens a window: the next report covers steps 2 and 3 only
    clock.t += 5
    reporter(step(2, valid=100, keep=0.5, clip_low=0.1, staleness=1, checkpoint="/ckpt/step-000002"))
    clock.t += 5
    reporter(step(3, valid=300, keep=0.9, clip_high=0.2, staleness=2, ewma_reset=1))
    reporter(step_report(4, valid=1000, keep=0.0, staleness=9, applied=False))  # not applied: not counted
    clock.t += 30
    reporter(step(5, valid=0))  # no valid tokens: adds nothing to the ratios
    training = sent[-1]["status"]["training"]
    # kept = 100*0.5 + 300*0.9 = 50 + 270 = 320 of 400 valid -> 0.8 (the mean of ratios would say 0.7)
    assert training["keepRatio"] == pytest.approx(0.8, abs=1e-12)
    assert training["keepPercent"] == 80.0
    # clipped = 100*0.1 + 300*0.2 = 10 + 60 = 70 of 400 -> 0.175
    assert training["clipFraction"] == pytest.approx(0.175, abs=1e-12)
    assert training["stalenessMax"] == 2  # the skipped step's 9 does not count
    assert training["ewmaResets"] == 1
    assert training["policyVersion"] == 5
    assert training["lastCheckpoint"] == "/ckpt/step-000002" and training["lastCheckpointVersion"] == 2
    assert training["reportedAt"] == "2026-01-01T12:00:00Z"
    JobStatus.model_validate({"training": training})  # the shape the CRD's status schema comes from


def test_window_resets_after_a_report_and_an_empty_window_omits_the_ratios() -> None:
    reporter, clock, sent = make()
    reporter(step(1, keep=0.5, staleness=3))
    reporter.observe({"step": 2, "applied": False})  # nothing applied since
    assert reporter.flush()
    training = sent[-1]["status"]["training"]
    assert "keepRatio" not in training and "clipFraction" not in training  # merge patch keeps the old values
    assert training["stalenessMax"] == 0 and training["policyVersion"] == 1


def test_final_flush_ignores_the_throttle() -> None:
    reporter, clock, sent = make()
    reporter(step(1))
    clock.t += 1
    reporter(step(2, checkpoint="/c/step-000002"))
    assert len(sent) == 1
    assert reporter.flush()
    assert len(sent) == 2
    assert sent[-1]["status"]["training"]["lastCheckpointVersion"] == 2


def test_failures_are_counted_and_never_raise(caplog: pytest.LogCaptureFixture) -> None:
    reporter, clock, _ = make(fail=True)
    reporter(step(1, valid=10, keep=0.5))
    clock.t += 1
    reporter(step(2, valid=30, keep=1.0))  # throttled: no second attempt within 30 s
    assert reporter.failures == 1 and reporter.sent == 0
    assert "training continues" in caplog.text and "retries in 30 s" in caplog.text
    assert reporter.flush() is False and reporter.failures == 2
    # the window was kept across the failures: (10*0.5 + 30*1.0) / 40 = 35/40
    assert reporter.summary().keep_ratio == pytest.approx(0.875)


def test_sync_phase_labels_are_the_driver_metric_labels() -> None:
    # one set of phases: the status enum (capitalised) and the driver's asyncrl_sync_phase{phase} labels
    assert [p.metric_label for p in SyncPhase] == list(SYNC_STATES)
    assert [SyncPhase.parse(label) for label in SYNC_STATES] == list(SyncPhase)
    with pytest.raises(ValueError, match="unknown sync phase 'OldLogits'; valid: Idle, Interrupt, Score"):
        SyncPhase.parse("OldLogits")


def test_a_phase_that_lasts_is_reported_although_the_throttle_is_closed() -> None:
    timers = Timers()
    reporter, clock, sent = make(timers=timers)
    reporter(step(1))  # a report at once: the throttle is closed for 30 s
    clock.t += 2
    reporter.phase("Interrupt")  # the loop's record at a phase change: no "version"
    assert len(sent) == 1 and timers.live() == [SYNC_PHASE_REPORT_AFTER_SECONDS]
    reporter.phase("score")  # the metric label reads the same; Interrupt was short: its timer is
    # cancelled, Score's is armed
    assert timers.live() == [SYNC_PHASE_REPORT_AFTER_SECONDS]
    clock.t += SYNC_PHASE_REPORT_AFTER_SECONDS
    timers.fire()  # Score still current after 5 s (it may hang: no later record would carry it)
    assert len(sent) == 2
    training = sent[-1]["status"]["training"]
    assert training["syncPhase"] == "Score" and training["syncPhaseSince"] == "2026-01-01T12:00:00Z"
    assert training["policyVersion"] == 1
    JobStatus.model_validate({"training": training})
    # the return to Idle from a phase the server has seen is reported the same way (SyncStuck clears)
    for phase in ("Update", "Resume", "Idle"):
        reporter.phase(phase)
    assert len(timers.live()) == 1
    timers.fire()
    assert len(sent) == 3 and sent[-1]["status"]["training"]["syncPhase"] == "Idle"


def test_short_phases_ride_along_with_the_throttled_report() -> None:
    timers = Timers()
    reporter, clock, sent = make(timers=timers)
    reporter(step(1))
    for v in (2, 3):  # two interrupt-sync updates, every phase shorter than 5 s
        for phase in ("Interrupt", "Score", "Update", "Resume", "Idle"):
            clock.t += 1
            reporter.phase(phase)
        timers.fire()  # only Idle's timer is live; the server never saw a phase other than Idle: nothing to send
        reporter(step(v))
    assert len(sent) == 1
    clock.t += 30
    reporter(step(4))
    assert len(sent) == 2 and sent[-1]["status"]["training"]["syncPhase"] == "Idle"
    # a phase whose start the server has seen is not sent twice
    reporter.phase("Score")
    clock.t += 30
    reporter(step(5))  # the throttled report carries Score
    timers.fire()
    assert len(sent) == 3 and sent[-1]["status"]["training"]["syncPhase"] == "Score"


def test_a_failed_phase_report_is_retried_after_the_throttle_interval() -> None:
    timers = Timers()
    reporter, clock, _ = make(fail=True, timers=timers)
    reporter.phase("Score")  # first call: an immediate (failing) report, then the timer
    assert reporter.failures == 1
    timers.fire()
    assert reporter.failures == 2 and timers.live() == [30.0]  # the API is down: again in 30 s, not in a loop
    assert reporter.flush() is False and timers.live() == []  # the final flush disarms the timer


def test_the_default_timer_thread_reports_a_hanging_phase() -> None:
    sent: list[dict[str, Any]] = []
    reporter = StatusReporter(sent.append, phase_report_after=0.05)
    reporter(step(1))
    reporter.phase("Score")  # then the loop hangs: nothing else calls the reporter
    deadline = time.monotonic() + 10.0
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sent) == 2 and sent[-1]["status"]["training"]["syncPhase"] == "Score"
    with pytest.raises(ValueError, match="phase_report_after must be > 0"):
        StatusReporter(sent.append, phase_report_after=0)


def test_failure_hints_name_the_fix() -> None:
    class ApiException(Exception):
        status, reason = 403, "Forbidden"

    assert "asyncrljobs/status" in describe_failure(ApiException())


# -------------------------------------------------------------------- the real client, the real API server

def test_report_reaches_the_api_server_and_leaves_operator_fields(apiserver: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.support.jobs import Jobs

    ns = apiserver.namespace("reporter-1")  # not an e2e-* namespace: no operator writes here
    monkeypatch.setenv("KUBECONFIG", str(apiserver.kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    kube = apiserver.api_client()
    jobs = Jobs(kube, ns)
    jobs.create("job1")
    operator_status = {"phase": "Running", "reason": "AllReady", "restarts": 1,
                       "replicas": {"rollout": "2/2", "rolloutReady": 2, "rolloutDesired": 2}}
    jobs.patch_status({"status": operator_status})

    clock = FakeClock()
    reporter = StatusReporter(kubernetes_sender("job1", ns), clock=clock, wall=lambda: WALL)
    reporter(step(1, valid=100, keep=0.5, checkpoint="/checkpoints/step-000001"))
    assert reporter.sent == 1, reporter.last_error
    status = jobs.status()
    assert status["training"]["keepRatio"] == 0.5 and status["training"]["lastCheckpointVersion"] == 1
    assert {k: status[k] for k in ("phase", "reason", "restarts")} == \
        {"phase": "Running", "reason": "AllReady", "restarts": 1}
    assert status["replicas"]["rollout"] == "2/2"

    clock.t += 31
    reporter(step(2, valid=100, keep=1.0))
    assert reporter.flush() and reporter.failures == 0
    training = jobs.status()["training"]
    assert training["policyVersion"] == 2 and training["keepRatio"] == 1.0
    assert training["lastCheckpoint"] == "/checkpoints/step-000001"  # carried over the run

    # a job that does not exist: counted, explained, training goes on
    missing = StatusReporter(kubernetes_sender("nope", ns), clock=clock, wall=lambda: WALL)
    missing(step(1))
    assert missing.failures == 1 and "404" in (missing.last_error or "")
    kube.close()
