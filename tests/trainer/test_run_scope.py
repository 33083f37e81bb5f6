"""``run_job``'s scopes (loop/run_scope.py), one at a time and nested as ``run_job`` nests them: each one's
cleanup, the run's status from how it ended, and the order everything is undone in on every exit path."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop import run_scope
from asyncrl.trainer.driver.loop.run_scope import JobHosts, MetricsEndpoint, RunOutcome, sigterm_stops
from asyncrl.trainer.driver.run.rundir import RunDir
from asyncrl.trainer.driver.run.summary import SummaryDraft
from asyncrl.trainer.driver.run.termination import StopRequest

JOB = validate_job({"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "scope"},
                    "spec": {"task": {"name": "calculator"}}})


class _Hosts:
    """What JobHosts calls on the job's hosts, written down in ``said``."""

    def __init__(self, said: list[str], own: BaseException | None = None) -> None:
        self.said, self.own = said, own

    def actor_failure(self, exc: BaseException) -> BaseException | None:
        self.said.append(f"actor_failure({exc})")
        return self.own

    def close(self) -> None:
        self.said.append("close")

    def kill(self) -> None:
        self.said.append("kill")


def _outcome(tmp_path: Path, stop: StopRequest | None = None) -> RunOutcome:
    run = RunDir.create(tmp_path / "run")
    draft = SummaryDraft(job="scope", run_dir=str(run.path), max_staleness=2, reference="behavior")
    return RunOutcome(JOB, run, draft, [], started=0.0, stop=stop or StopRequest())


def test_a_run_that_ends_normally_succeeded_and_wrote_its_summary(tmp_path: Path) -> None:
    with _outcome(tmp_path) as outcome:
        pass
    assert outcome.final.status == "succeeded" and outcome.final.error is None
    assert json.loads(outcome.run.summary_json.read_text())["status"] == "succeeded"
    assert outcome.run.report_png.exists()


def test_sigterm_makes_it_preempted(tmp_path: Path) -> None:
    stop = StopRequest()
    with _outcome(tmp_path, stop) as outcome:
        stop.request()
    assert outcome.final.status == "preempted"


def test_an_error_is_a_failed_run_with_its_line_and_goes_on(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="disk full"), _outcome(tmp_path) as outcome:
        raise OSError(28, "disk full")
    assert outcome.final.status == "failed" and "disk full" in (outcome.final.error or "")
    assert json.loads(outcome.run.summary_json.read_text())["status"] == "failed"


def test_ctrl_c_is_interrupted(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), _outcome(tmp_path) as outcome:
        raise KeyboardInterrupt
    assert outcome.final.status == "interrupted" and outcome.final.error is None


def test_a_failed_write_is_raised_only_when_the_run_itself_succeeded(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run_scope, "write_report", full)
    with pytest.raises(OSError, match="No space left"), _outcome(tmp_path):
        pass
    with pytest.raises(ValueError, match="the run's own"), _outcome(tmp_path / "b"):  # not hidden by the write's
        raise ValueError("the run's own")


def test_an_attempt_that_failed_before_a_step_keeps_the_good_summary(tmp_path: Path) -> None:
    with _outcome(tmp_path):
        pass
    good = (tmp_path / "run" / "summary.json").read_text()
    with pytest.raises(RuntimeError), _outcome(tmp_path) as outcome:
        outcome.logged_from = 0  # the resumed log was read back, then no step was logged
        raise RuntimeError("actor died")
    assert (tmp_path / "run" / "summary.json").read_text() == good
    assert json.loads(outcome.run.last_attempt_json.read_text())["status"] == "failed"


def test_the_summary_exists_only_once_the_scope_ended(tmp_path: Path) -> None:
    with _outcome(tmp_path) as outcome, pytest.raises(RuntimeError, match="made when its RunOutcome scope ends"):
        outcome.final  # noqa: B018 -- the property is the test


@pytest.mark.parametrize(("own_ray", "said"), [(True, ["close"]), (False, ["close", "kill"])])
def test_job_hosts_close_and_on_a_shared_ray_are_killed(own_ray: bool, said: list[str]) -> None:
    got: list[str] = []
    with JobHosts(own_ray) as held:
        held.track(_Hosts(got))  # type: ignore[arg-type]
    assert got == said
    with JobHosts(own_ray):  # nothing started: nothing to undo
        pass


def test_an_actor_rank_s_own_failure_replaces_the_error_seen() -> None:
    said: list[str] = []
    rank = RuntimeError("rank 1 on host-b: CUDA error")
    with pytest.raises(RuntimeError, match="rank 1 on host-b") as caught, JobHosts(True) as held, \
            held.naming_actor_failure():
        held.track(_Hosts(said, own=rank))  # type: ignore[arg-type]
        raise RuntimeError("killed")
    assert isinstance(caught.value.__cause__, RuntimeError) and str(caught.value.__cause__) == "killed"
    assert said == ["actor_failure(killed)", "close"]  # asked before the hosts close
    with pytest.raises(ValueError, match="no rank"), JobHosts(True) as held, held.naming_actor_failure():
        held.track(_Hosts([], own=None))  # type: ignore[arg-type]
        raise ValueError("no rank failed")


def test_sigterm_stops_restores_the_handler_it_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[str] = []

    def install(stop: StopRequest) -> object:
        said.append("install")
        return lambda: said.append("restore")

    monkeypatch.setattr(run_scope, "install_sigterm_handler", install)
    with pytest.raises(KeyError), sigterm_stops(StopRequest()):
        said.append("body")
        raise KeyError("x")
    assert said == ["install", "body", "restore"]


def test_run_job_s_nesting_undoes_everything_in_reverse_on_an_error(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The nesting run_job uses, with every scope's cleanup written down: the actor's failure is named while
    # SIGTERM is still handled and the hosts are up, then SIGTERM is restored, the hosts close, Ray goes, the
    # summary is written and the endpoint closes last.
    said: list[str] = []

    class _Server:
        url = "http://127.0.0.1:1/metrics"

        def close(self) -> None:
            said.append("endpoint closed")

    @contextmanager
    def ray() -> Iterator[bool]:
        said.append("ray up")
        try:
            yield False  # a shared Ray: the hosts are killed too
        finally:
            said.append("ray down")

    def install(stop: StopRequest) -> object:
        said.append("sigterm handled")
        return lambda: said.append("sigterm restored")

    monkeypatch.setattr(run_scope, "serve_metrics", lambda *a: _Server())
    monkeypatch.setattr(run_scope, "install_sigterm_handler", install)
    real_write = RunOutcome._write

    def write(self: RunOutcome, *args: object) -> None:
        said.append("summary written")
        real_write(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(RunOutcome, "_write", write)
    with pytest.raises(RuntimeError, match="boom"):
        with MetricsEndpoint() as endpoint, _outcome(tmp_path) as outcome:
            endpoint.serve(None, 0, "127.0.0.1")  # type: ignore[arg-type]
            with ray() as own_ray, JobHosts(own_ray) as held, sigterm_stops(outcome.stop), \
                    held.naming_actor_failure():
                held.track(_Hosts(said))  # type: ignore[arg-type]
                raise RuntimeError("boom")
    assert said == ["ray up", "sigterm handled", "actor_failure(boom)", "sigterm restored", "close", "kill",
                    "ray down", "summary written", "endpoint closed"]
    assert outcome.final.status == "failed"
