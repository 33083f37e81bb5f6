"""Operator metrics (``asyncrl_operator_*``), defined in one place; the factory takes a registry.

Per-job series (``job_phase``, ``job_restarts_total``, ``sync_stuck_total``) are removed when the job
is deleted, so a dashboard never shows a ghost. Bounded labels only: namespace, asyncrljob, phase, cause, kind.
"""

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from asyncrl.api.status import Phase

PHASES = tuple(p.value for p in Phase)
ERROR_KINDS = ("api", "unexpected")
RESTART_CAUSES = ("failure", "preemption", "spec_change")


@dataclass
class OperatorMetrics:
    reconcile_seconds: Histogram
    reconcile_errors: Counter
    jobs: Gauge
    job_phase: Gauge
    job_restarts: Counter
    sync_stuck: Counter
    _phase_of: dict[tuple[str, str], str] = field(default_factory=dict)

    def observe_phase(self, namespace: str, name: str, phase: str) -> None:
        old = self._phase_of.get((namespace, name))
        if old == phase:
            return
        if old is not None:
            self.job_phase.remove(namespace, name, old)
        else:  # a job seen for the first time: its restart counters exist at 0 (rate() and panels need them)
            for cause in RESTART_CAUSES:
                self.job_restarts.labels(namespace, name, cause)
            self.sync_stuck.labels(namespace, name)
        self._phase_of[(namespace, name)] = phase
        self.job_phase.labels(namespace, name, phase).set(1)
        self._recount()

    def restarted(self, namespace: str, name: str, cause: str, n: int = 1) -> None:
        if n:
            self.job_restarts.labels(namespace, name, cause).inc(n)

    def sync_phases_stuck(self, namespace: str, name: str, n: int = 1) -> None:
        """Count interrupt-sync phases found stuck (``Plan.sync_stuck``)."""
        if n:
            self.sync_stuck.labels(namespace, name).inc(n)

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a deleted job."""
        old = self._phase_of.pop((namespace, name), None)
        if old is not None:
            self.job_phase.remove(namespace, name, old)
        for cause in RESTART_CAUSES:
            try:
                self.job_restarts.remove(namespace, name, cause)
            except KeyError:
                pass
        try:
            self.sync_stuck.remove(namespace, name)
        except KeyError:
            pass
        self._recount()

    def _recount(self) -> None:
        for phase in PHASES:
            self.jobs.labels(phase).set(sum(1 for p in self._phase_of.values() if p == phase))


def create_metrics(registry: CollectorRegistry) -> OperatorMetrics:
    m = OperatorMetrics(
        reconcile_seconds=Histogram(
            "asyncrl_operator_reconcile_duration_seconds",
            "Time to reconcile one AsyncRLJob (read, plan, apply, write status).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        ),
        reconcile_errors=Counter(
            "asyncrl_operator_reconcile_errors_total",
            "Reconciles that failed, by kind: api (an API call failed) or unexpected (a bug).",
            ["kind"], registry=registry,
        ),
        jobs=Gauge("asyncrl_operator_jobs", "AsyncRLJobs known to the operator, by phase.", ["phase"],
                   registry=registry),
        job_phase=Gauge("asyncrl_operator_job_phase", "1 for the current phase of each AsyncRLJob.",
                        ["namespace", "asyncrljob", "phase"], registry=registry),
        job_restarts=Counter(
            "asyncrl_operator_job_restarts_total",
            "Gang restarts, by cause: failure (counted against backoffLimit), preemption (against "
            "preemptionLimit) or spec_change (a pod-shaping spec edit, not counted).",
            ["namespace", "asyncrljob", "cause"], registry=registry,
        ),
        sync_stuck=Counter(
            "asyncrl_operator_sync_stuck_total",
            "Interrupt-sync phases that ran longer than oldLogits.interruptSync.phaseTimeoutSeconds (each sets "
            "the SyncStuck condition once).",
            ["namespace", "asyncrljob"], registry=registry,
        ),
    )
    for kind in ERROR_KINDS:
        m.reconcile_errors.labels(kind)
    for phase in PHASES:
        m.jobs.labels(phase).set(0)
    return m
