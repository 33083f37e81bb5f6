"""The in-job status reporter: step records -> a throttled ``status.training`` merge patch.

The contract is :mod:`asyncrl.api.status`: the driver writes only ``status.training``, with a JSON
merge patch (so the operator's fields are never touched), at most once every 30 s. Per-step
numbers go to Prometheus; this is the summary a ``kubectl get asyncrljob`` reader sees.

:class:`StatusReporter` is an ``on_step`` callback for :func:`~asyncrl.trainer.driver.loop.run_job`.
Over each *report window* (the steps since the last successful report) it aggregates:

- ``keepRatio`` = kept / valid tokens summed over the window's applied steps (a token-weighted
  ratio, not a mean of per-step ratios: a step with 10 tokens must not weigh like one with 1000);
- ``clipFraction`` = clipped / valid tokens, clipped = low + high + dual clip (the tokens whose
  staleness ratio ``r_s`` the PPO clip stopped);
- ``maxStaleness`` = the largest version gap of a trained token in the window;

and over the run (this driver process): ``ewmaResets`` (total), ``policyVersion``, and the last
checkpoint with its version. Only applied steps count (a non-finite step's update was skipped),
the same steps the Prometheus counters of :func:`~.accounting.count_correction` count.

Failures never stop training: an API error is logged once per report with the likely fix and
counted (``failures``); the window is kept, so the next report covers the steps the failed one
missed. :meth:`StatusReporter.flush` sends the final summary without the throttle.
"""

import datetime as dt
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.api.constants import ENV_JOB_NAME, ENV_JOB_NAMESPACE, GROUP, PLURAL, VERSION
from asyncrl.api.status import (
    MIN_REPORT_INTERVAL_SECONDS,
    ReportThrottle,
    SyncPhase,
    TrainingSummary,
    rfc3339,
    training_patch,
)
from asyncrl.trainer.correction.stats import CorrectionStats

log = logging.getLogger(__name__)

Sender = Callable[[dict[str, Any]], None]  # takes the merge-patch body; raises on failure


@dataclass
class ReportWindow:
    """Token counts of the steps since the last successful report."""

    valid_tokens: float = 0.0
    kept_tokens: float = 0.0
    clipped_tokens: float = 0.0
    max_staleness: int = 0
    steps: int = 0

    def add(self, record: dict[str, Any]) -> None:
        """Add one applied step record (the loop's: the correction counts under ``CorrectionStats``'s names)."""
        stats = CorrectionStats.from_record(record)
        self.valid_tokens += stats.valid_tokens
        self.kept_tokens += stats.kept_tokens
        self.clipped_tokens += stats.clip_low_tokens + stats.clip_high_tokens + stats.dual_clip_tokens
        self.max_staleness = max(self.max_staleness, int(record.get("staleness_max", 0)))
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

    ``clock`` is monotonic seconds (injected by tests); ``wall`` gives ``reportedAt``.
    """

    def __init__(self, send: Sender, *, min_interval: float = MIN_REPORT_INTERVAL_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.send = send
        self.throttle = ReportThrottle(min_interval)
        self.clock, self.wall = clock, wall
        self.window = ReportWindow()
        self.policy_version = 0
        self.ewma_resets = 0
        self.last_checkpoint: str | None = None
        self.last_checkpoint_version: int | None = None
        self.sync_phase: SyncPhase | None = None
        self.sync_phase_since: str | None = None
        self.sent = 0
        self.failures = 0
        self.last_error: str | None = None

    # -- the callback ---------------------------------------------------------------------------
    def __call__(self, record: dict[str, Any]) -> None:
        self.observe(record)
        now = self.clock()
        if self.throttle.ready(now):
            self._report(now)

    def observe(self, record: dict[str, Any]) -> None:
        """Fold one step record into the window and the run totals (no I/O)."""
        if "sync_phase" in record:  # interrupt-sync phase, when the loop reports one
            phase = SyncPhase(record["sync_phase"])
            if phase != self.sync_phase:
                self.sync_phase, self.sync_phase_since = phase, rfc3339(self.wall())
        if "version" not in record:  # a skipped (non-finite) step: no update, not counted
            return
        self.policy_version = int(record["version"])
        self.window.add(record)
        self.ewma_resets += int(bool(record.get("ewma_reset", 0)))
        if record.get("checkpoint"):
            self.last_checkpoint = str(record["checkpoint"])
            self.last_checkpoint_version = self.policy_version

    def summary(self) -> TrainingSummary:
        """The summary a report sent now would carry."""
        return TrainingSummary(
            policy_version=self.policy_version, keep_ratio=self.window.keep_ratio,
            clip_fraction=self.window.clip_fraction, ewma_resets=self.ewma_resets,
            max_staleness=self.window.max_staleness, sync_phase=self.sync_phase,
            sync_phase_since=self.sync_phase_since, last_checkpoint=self.last_checkpoint,
            last_checkpoint_version=self.last_checkpoint_version, reported_at=rfc3339(self.wall()),
        )

    def flush(self) -> bool:
        """Send the final summary now, throttle or not (the contract's last word); True on success."""
        return self._report(self.clock())

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
        return True


def describe_failure(exc: BaseException) -> str:
    """What went wrong and what to do about it, for the common API answers."""
    status = getattr(exc, "status", None)
    hints = {
        401: "the pod's ServiceAccount token was rejected; check that the driver pod mounts the "
             "<job>-status ServiceAccount token",
        403: "RBAC: the Role <job>-status must allow get/patch on asyncrljobs/status for this job "
             "(the operator creates it; check `kubectl get role <job>-status -o yaml`)",
        404: f"the AsyncRLJob is gone, or {ENV_JOB_NAME}/{ENV_JOB_NAMESPACE} name another job",
        422: "the API server rejected status.training: the installed CRD is older than this driver; "
             "apply the CRD from `asyncrl crd`",
    }
    hint = hints.get(status) if isinstance(status, int) else None
    reason = getattr(exc, "reason", None) or str(exc)
    if hint is None:
        hint = "the API server was unreachable or failed; the next report retries in 30 s"
    return f"{type(exc).__name__}{f' {status}' if status else ''}: {reason} -- {hint}"


def kubernetes_sender(name: str, namespace: str, *, timeout_s: float = 10.0) -> Sender:
    """A sender using the official client: in-cluster credentials in a pod, else the default kubeconfig."""
    from kubernetes import client, config

    # A private Configuration/ApiClient: the client's process-wide default is captured once and
    # would keep pointing at the first API server it saw.
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # KUBECONFIG read now: the client reads it once, when kubernetes.config is first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    api = client.CustomObjectsApi(client.ApiClient(configuration))

    def send(body: dict[str, Any]) -> None:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body,
            _content_type="application/merge-patch+json", _request_timeout=timeout_s,
        )

    return send
