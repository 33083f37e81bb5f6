"""The in-job status reporter: typed step reports -> a throttled ``status.training`` merge patch.

The contract is :mod:`asyncrl.api.status`: the driver writes only ``status.training``, with a JSON
merge patch (so the operator's fields are never touched), at most once every 30 s. Per-step
numbers go to Prometheus; this is the summary a ``kubectl get asyncrljob`` reader sees.

:class:`StatusReporter` is an ``on_step`` callback for :func:`~asyncrl.trainer.driver.loop.training_loop.run_job` (it
reads the :class:`~asyncrl.trainer.driver.run.step_report.StepReport` fields, never a flattened line).
Over each *report window* (the steps since the last successful report) it aggregates:

- ``keepRatio`` = kept / valid tokens summed over the window's applied steps (a token-weighted
  ratio, not a mean of per-step ratios: a step with 10 tokens must not weigh like one with 1000);
- ``clipFraction`` = clipped / valid tokens, clipped = low + high + dual clip (the tokens whose
  staleness ratio ``r_s`` the PPO clip stopped);
- ``stalenessMax`` = the largest version gap of a trained token in the window (the steps'
  ``staleness_max``: observed, never W, which is ``spec.async.maxStaleness``);

and over the run (this driver process): ``ewmaResets`` (total), ``envErrors`` (episodes the environment's code
aborted, total), ``policyVersion``, and the last
checkpoint and the last Hugging Face export (``checkpoint.exportEverySteps``), each with its version. Only applied steps count (a non-finite step's update was skipped),
the same steps the Prometheus counters of :func:`~.accounting.count_correction` count.

Failures never stop training: an API error is logged once per report with the likely fix and
counted (``failures``); the window is kept, so the next report covers the steps the failed one
missed. :meth:`StatusReporter.flush` sends the final summary without the throttle.

Interrupt-sync phases arrive through :meth:`StatusReporter.phase` (``"Score"``; the metric label
``"score"`` is read the same) at each phase change (the loop's ``on_phase``). A phase that hangs is exactly the one no later record will carry, so the throttle alone
could hold it back for good: each change arms a timer of ``phase_report_after`` seconds
(:data:`~asyncrl.api.status.SYNC_PHASE_REPORT_AFTER_SECONDS`); if the phase is still current when
it fires and the API server has not seen it, the summary is sent then, throttle or not (also the
return to ``Idle`` from such a phase, so the operator clears ``SyncStuck``). Phases shorter than
that (the normal case) ride along with the next throttled report: at most one extra patch per
``phase_report_after`` seconds, none while sync phases are short.
"""

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from asyncrl.api.status import (
    MIN_REPORT_INTERVAL_SECONDS,
    SYNC_PHASE_REPORT_AFTER_SECONDS,
    ReportThrottle,
    SyncPhase,
    TrainingSummary,
    rfc3339,
    training_patch,
)
from asyncrl.trainer.driver.run.step_report import StepReport
from asyncrl.trainer.driver.status.api import (  # noqa: F401 -- kubernetes_sender re-exported: callers import it here
    Sender,
    describe_failure,
    kubernetes_sender,
)

log = logging.getLogger(__name__)

Cancel = Callable[[], None]
Scheduler = Callable[[float, Callable[[], None]], Cancel]  # (delay s, callback) -> cancel


def thread_timer(delay: float, callback: Callable[[], None]) -> Cancel:
    """Run ``callback`` in a daemon thread after ``delay`` seconds; returns its cancel."""
    timer = threading.Timer(delay, callback)
    timer.daemon = True  # never keeps a finished driver alive
    timer.start()
    return timer.cancel


@dataclass
class ReportWindow:
    """Token counts of the steps since the last successful report."""

    valid_tokens: float = 0.0
    kept_tokens: float = 0.0
    clipped_tokens: float = 0.0
    staleness_max: int = 0  # the worst version gap of a trained token in the window (observed, not W)
    steps: int = 0

    def add(self, report: StepReport) -> None:
        """Add one applied step (its correction counts and its worst staleness)."""
        stats = report.actor.metrics.correction
        self.valid_tokens += stats.valid_tokens
        self.kept_tokens += stats.kept_tokens
        self.clipped_tokens += stats.clip_low_tokens + stats.clip_high_tokens + stats.dual_clip_tokens
        self.staleness_max = max(self.staleness_max, report.staleness_max)
        self.steps += 1

    @property
    def keep_ratio(self) -> float | None:
        """kept / valid over the window; None without valid tokens (the merge patch then keeps the old value)."""
        return _ratio(self.kept_tokens, self.valid_tokens)

    @property
    def clip_fraction(self) -> float | None:
        return _ratio(self.clipped_tokens, self.valid_tokens)


def _ratio(num: float, den: float) -> float | None:
    if den <= 0:
        return None
    return min(1.0, max(0.0, num / den))


class StatusReporter:
    """``on_step`` callback that sends a throttled :class:`TrainingSummary` through ``send``.

    ``clock`` is monotonic seconds and ``wall`` gives ``reportedAt`` (both injected by tests);
    ``schedule`` arms the sync-phase timer (a daemon thread by default). Thread-safe: the timer's
    report and the loop's calls take one lock.
    """

    def __init__(self, send: Sender, *, min_interval: float = MIN_REPORT_INTERVAL_SECONDS,
                 phase_report_after: float = SYNC_PHASE_REPORT_AFTER_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
                 schedule: Scheduler = thread_timer) -> None:
        if not phase_report_after > 0:
            raise ValueError(f"phase_report_after must be > 0 s, got {phase_report_after}")
        self.send = send
        self.phase_report_after = phase_report_after
        self.schedule = schedule
        self._lock = threading.RLock()
        self._cancel_phase_timer: Cancel | None = None
        self._phase_changes = 0  # which phase change the armed timer belongs to
        self._reported_phase: tuple[SyncPhase | None, str | None] = (None, None)  # last (phase, since) sent
        self.throttle = ReportThrottle(min_interval)
        self.clock, self.wall = clock, wall
        self.window = ReportWindow()
        self.policy_version = 0
        self.ewma_resets = 0
        self.ewma_resets_recovered: int | None = None  # None: not the ewma reference
        self.ewma_resets_unrecovered: int | None = None
        self.env_errors = 0
        self.last_checkpoint: str | None = None
        self.last_checkpoint_version: int | None = None
        self.last_export: str | None = None
        self.last_export_version: int | None = None
        self.sync_phase: SyncPhase | None = None
        self.sync_phase_since: str | None = None
        self.sent = 0
        self.failures = 0
        self.last_error: str | None = None

    # -- the callbacks --------------------------------------------------------------------------
    def __call__(self, event: object) -> None:
        """``on_step``: a :class:`StepReport` (an evaluation's result is not a step: ignored)."""
        with self._lock:
            self.observe(event)
            self._report_if_ready()

    def phase(self, phase: str) -> None:
        """``on_phase``: the interrupt-sync phase changed (``"Score"`` or the metric label ``"score"``)."""
        with self._lock:
            self.observe_phase(phase)
            self._report_if_ready()

    def _report_if_ready(self) -> None:
        now = self.clock()
        if self.throttle.ready(now):
            self._report(now)

    def observe_phase(self, phase: str) -> None:
        """Record a sync-phase change (no I/O; a change arms the timer)."""
        parsed = SyncPhase.parse(phase)
        if parsed != self.sync_phase:
            with self._lock:
                self.sync_phase, self.sync_phase_since = parsed, rfc3339(self.wall())
                self._phase_changes += 1
                self._arm_phase_timer(self.phase_report_after)

    def observe(self, event: object) -> None:
        """Fold one applied step into the window and the run totals (no I/O). A step not applied (its
        updates skipped) and an evaluation are not counted."""
        if not isinstance(event, StepReport) or event.version is None:
            return
        self.policy_version = event.version
        self.window.add(event)
        self.ewma_resets += int(event.actor.metrics.ewma_reset)
        if event.actor.metrics.reference == "ewma":  # the reset outcomes' running totals
            self.ewma_resets_recovered = event.actor.metrics.ewma_resets_recovered_total
            self.ewma_resets_unrecovered = event.actor.metrics.ewma_resets_unrecovered_total
        self.env_errors = event.env_errors  # a running total
        if event.checkpoint:
            self.last_checkpoint = event.checkpoint
            self.last_checkpoint_version = self.policy_version
        if event.export:  # checkpoint.exportEverySteps: an HF folder of this version
            self.last_export = event.export
            self.last_export_version = self.policy_version

    def summary(self) -> TrainingSummary:
        """The summary a report sent now would carry."""
        return TrainingSummary(
            policy_version=self.policy_version, keep_ratio=self.window.keep_ratio,
            clip_fraction=self.window.clip_fraction, ewma_resets=self.ewma_resets,
            ewma_resets_recovered=self.ewma_resets_recovered, ewma_resets_unrecovered=self.ewma_resets_unrecovered,
            env_errors=self.env_errors,
            staleness_max=self.window.staleness_max, sync_phase=self.sync_phase,
            sync_phase_since=self.sync_phase_since, last_checkpoint=self.last_checkpoint,
            last_checkpoint_version=self.last_checkpoint_version, last_export=self.last_export,
            last_export_version=self.last_export_version, reported_at=rfc3339(self.wall()),
        )

    def flush(self) -> bool:
        """Send the final summary now, throttle or not (the contract's last word); True on success."""
        with self._lock:
            self._disarm_phase_timer()
            return self._report(self.clock())

    # -- the sync-phase timer -------------------------------------------------------------------
    def _arm_phase_timer(self, delay: float) -> None:
        self._disarm_phase_timer()
        change = self._phase_changes
        self._cancel_phase_timer = self.schedule(delay, lambda: self._phase_due(change))

    def _disarm_phase_timer(self) -> None:
        if self._cancel_phase_timer is not None:
            self._cancel_phase_timer()
            self._cancel_phase_timer = None

    def _phase_unseen(self) -> bool:
        """Whether the API server lacks the current phase in a way the operator cares about: a phase
        other than Idle it has not seen (with its start), or Idle after a phase other than Idle."""
        seen_phase, seen_since = self._reported_phase
        if self.sync_phase is SyncPhase.IDLE:
            return seen_phase not in (None, SyncPhase.IDLE)
        return (self.sync_phase, self.sync_phase_since) != (seen_phase, seen_since)

    def _phase_due(self, change: int) -> None:
        """Timer callback: the phase of change number ``change`` has lasted its delay."""
        with self._lock:
            if change != self._phase_changes:  # a later change re-armed the timer (this one lost the race)
                return
            self._cancel_phase_timer = None
            if self._phase_unseen() and not self._report(self.clock()):
                self._arm_phase_timer(self.throttle.min_interval)  # API unreachable: try again later

    # -- sending --------------------------------------------------------------------------------
    def _report(self, now: float) -> bool:
        # Every attempt counts for the throttle: an unreachable API is retried every 30 s, not every step.
        self.throttle.sent(now)
        try:
            self.send(training_patch(self.summary()))
        except Exception as exc:  # noqa: BLE001 -- a status report must never end training
            self.failures += 1
            self.last_error = describe_failure(exc)
            log.warning("status report failed (%d so far; training continues): %s", self.failures, self.last_error)
            return False
        self.sent += 1
        self.window = ReportWindow()
        self._reported_phase = (self.sync_phase, self.sync_phase_since)
        return True
