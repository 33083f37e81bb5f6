"""What ``run_job`` runs inside, one concern per scope, each with its own cleanup.

``run_job`` enters them in this order and Python leaves them in the reverse one, so the cleanup order on every
exit path (an error, Ctrl-C, SIGTERM, a full disk) is the order they are listed in backwards:

    MetricsEndpoint      the Prometheus endpoint; closed last, after the summary is written
    RunOutcome           the run's status from how it ended; summary.json and report.png on every path
    local_ray            Ray (hosts.ray_env): started here, or a shared one joined
    JobHosts             the job's Ray processes: closed, and killed on a shared Ray
    sigterm_stops        SIGTERM asks the loop to stop (after ray.init: Ray sets its own handler)
    naming_actor_failure an actor-group rank's own failure in place of the error the driver saw

``MetricsEndpoint`` and ``JobHosts`` are entered before what they clean up exists (the endpoint is served
inside ``RunOutcome``, so a port already in use is a failed run with a summary; the hosts start after SIGTERM
is handled), so each holds what was started in it.
"""

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

import yaml
from prometheus_client import CollectorRegistry

from asyncrl.api.job import AsyncRLJob
from asyncrl.trainer.driver.hosts.fleet import HostHandles
from asyncrl.trainer.driver.loop.accounting import set_job_gauges, summarise
from asyncrl.trainer.driver.run import checkpoints, faults
from asyncrl.trainer.driver.run.metrics import DriverMetrics, MetricsServer, create_metrics, serve_metrics
from asyncrl.trainer.driver.run.metrics_log import JSONObject
from asyncrl.trainer.driver.run.rundir import RunDir, sweep_temporaries, write_report
from asyncrl.trainer.driver.run.summary import RunStatus, RunSummary, SummaryDraft
from asyncrl.trainer.driver.run.termination import StopRequest, install_sigterm_handler

log = logging.getLogger(__name__)


def open_run_dir(job: AsyncRLJob, path: Path, *, checkpoint_base: Path | None,
                 warm_start_dir: Path | None) -> RunDir:
    """The run directory at ``path`` with ``job.yaml`` written, and what interrupted writes of an earlier
    attempt left there (in the checkpoints, beside the warm start) removed and said."""
    run = RunDir.create(path, checkpoint_base=checkpoint_base)
    swept = [*run.sweep_temporaries(), *checkpoints.sweep_temporaries(run.checkpoint_dir(job.spec.checkpoint.dir))]
    if warm_start_dir is not None:
        swept += sweep_temporaries(warm_start_dir.parent)
    if swept:  # an earlier attempt died while writing (a full disk, a kill)
        log.warning("removed what interrupted writes left: %s", ", ".join(str(p) for p in swept))
    run.job_yaml.write_text(yaml.safe_dump(job.model_dump(mode="json", by_alias=True), sort_keys=False))
    return run


def job_metrics(job: AsyncRLJob) -> DriverMetrics:
    """The driver's metrics in a registry of this run's own, with the job's info and gauges set."""
    spec = job.spec
    metrics = create_metrics(CollectorRegistry())
    metrics.job.info({
        "name": job.metadata.name, "reference": spec.correction.reference.value,
        "max_staleness": str(spec.async_.max_staleness), "task": spec.task.label,  # what runs, not the ignored name
    })
    set_job_gauges(metrics, spec)
    return metrics


class MetricsEndpoint:
    """The metrics server of the run, once :meth:`serve` started it; closed when the scope ends."""

    def __init__(self) -> None:
        self.server: MetricsServer | None = None

    def serve(self, registry: CollectorRegistry, port: int, host: str) -> str:
        """Serve ``registry`` on ``host:port`` (0: any free port); returns the URL."""
        self.server = serve_metrics(registry, port, host)
        return self.server.url

    def __enter__(self) -> "MetricsEndpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()


class RunOutcome:
    """How the run ended, and a usable run directory whatever it was.

    Leaving the scope normally is ``succeeded`` (``preempted`` after SIGTERM: the loop saved a final
    checkpoint and the operator's rerun resumes there); Ctrl-C is ``interrupted`` and any other exception
    ``failed`` with its one-line description. Either way the summary and the report are written; an error
    while writing them is raised only when the run itself succeeded (never hiding the error that ended it),
    and the run's own exception always goes on."""

    def __init__(self, job: AsyncRLJob, run: RunDir, summary: SummaryDraft, records: Sequence[JSONObject],
                 started: float, stop: StopRequest) -> None:
        self.job, self.run, self.summary, self.records, self.started, self.stop = (
            job, run, summary, records, started, stop)
        self.logged_from = -1  # records[logged_from:] are this attempt's steps (-1: it logged none)
        self._final: RunSummary | None = None

    @property
    def final(self) -> RunSummary:
        """The run's summary as written (once the scope has ended)."""
        if self._final is None:
            raise RuntimeError("the run's summary is made when its RunOutcome scope ends")
        return self._final

    def __enter__(self) -> "RunOutcome":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, failure: BaseException | None,
                 tb: TracebackType | None) -> None:
        error: str | None = None
        status: RunStatus
        if failure is None:
            status = "preempted" if self.stop.requested else "succeeded"
        elif isinstance(failure, KeyboardInterrupt):
            status = "interrupted"
        else:
            status = "failed"
            error = faults.describe(failure)  # errno, path and bytes free for an OSError (a full disk)
            log.error("job %s failed: %s", self.job.metadata.name, error)
        self._write(status, error, failure)

    def _write(self, status: RunStatus, error: str | None, failure: BaseException | None) -> None:
        # An attempt that failed before logging a step keeps what a good run wrote (summary.json,
        # report.png) and says its own word in last-attempt.json.
        run, records = self.run, self.records
        attempt_only = (failure is not None and len(records) <= max(0, self.logged_from)
                        and run.summary_json.exists())
        try:
            self._final = self.summary.finish(status, error=error, report=str(run.report_png),
                                              totals=summarise(records, time.monotonic() - self.started))
            run.write_summary(self._final.to_json(), attempt_only=attempt_only)
            if not attempt_only:
                write_report(records, run.report_png,
                             f"{self.job.metadata.name} (maxStaleness {self.job.spec.async_.max_staleness})")
        except Exception as exc:  # noqa: BLE001 -- never hide the error that ended the run behind this one
            if failure is None:
                raise
            log.error("could not write the run's summary/report (%s); the run's own error: %s",
                      faults.describe(exc), error or status)


class JobHosts:
    """The job's Ray processes, once :meth:`track` was handed them: when the scope ends the actor releases
    its snapshot files, and on a shared Ray (tests, benchmarks), which outlives the job, they are killed."""

    def __init__(self, own_ray: bool) -> None:
        self.own_ray = own_ray
        self.hosts: HostHandles | None = None

    def track(self, hosts: HostHandles) -> HostHandles:
        self.hosts = hosts
        return hosts

    @contextmanager
    def naming_actor_failure(self) -> Iterator[None]:
        """A rank of an actor group died or raised: say which, not rank 0's "killed" (asked while Ray is up)."""
        try:
            yield
        except Exception as exc:
            own = self.hosts.actor_failure(exc) if self.hosts is not None else None
            if own is None or own is exc:
                raise
            raise own from exc

    def __enter__(self) -> "JobHosts":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.hosts is not None:
            self.hosts.close()  # the actor's snapshot files
            if not self.own_ray:
                self.hosts.kill()


@contextmanager
def sigterm_stops(stop: StopRequest) -> Iterator[None]:
    """SIGTERM (preemption, drain) sets ``stop`` while the scope lasts; the previous handler comes back after."""
    restore = install_sigterm_handler(stop)
    try:
        yield
    finally:
        restore()
