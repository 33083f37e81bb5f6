"""What ``asyncrl run`` prints at the end, from the typed summary (or the one read back after a failure)."""

import json
import time
from pathlib import Path
from types import SimpleNamespace

from asyncrl.trainer.cli.console import _summary_from_disk, format_summary
from asyncrl.trainer.driver.loop.accounting import summarise
from asyncrl.trainer.driver.loop.training_loop import RunOptions
from asyncrl.trainer.driver.run.summary import RunSummary, SummaryDraft


def _preempted() -> RunSummary:
    d = SummaryDraft(job="j", run_dir="runs/j", max_staleness=2, reference="ewma")
    d.notes().append("checkpoint step-000004 skipped")
    d.resumed_from = "runs/j/checkpoints/step-000002"
    d.stopped = {"signal": "SIGTERM", "version": 3}
    d.env_errors = {"exception": 2, "timeout": 0}
    d.startup_check = {"engines": [{"engine": "rollout-0", "passed": False, "cause": "a dtype mismatch",
                                    "mean_abs_log_ratio": 0.5, "p99_abs_log_ratio": 2.0, "tokens": 64}]}
    steps = [{"step": v, "version": v, "applied": True, "success_rate": 0.5, "reward_mean": 0.5} for v in (1, 2, 3)]
    return d.finish("preempted", totals=summarise(steps, 7.25), report="runs/j/report.png")


def test_the_printout_says_each_part_of_the_summary() -> None:
    lines = format_summary(_preempted()).splitlines()
    assert lines[0] == "j: preempted after 3 steps in 7.2 s (maxStaleness 2, reference ewma)"  # 7.25 -> 7.2 (even)
    assert lines[1] == "  resumed from runs/j/checkpoints/step-000002"
    assert lines[2] == "  training success (mean of the first / last 10 steps): 50.0% -> 50.0%"
    assert "  note: checkpoint step-000004 skipped" in lines
    assert ("  stopped by SIGTERM at version 3; final checkpoint: none needed (nothing trained since the last one) "
            "(a rerun resumes there)") in lines
    assert ("  start-up probe rollout-0: mean |log r_d| 5.00e-01, p99 2.00e+00 over 64 tokens "
            "(REFUSED, looks like a dtype mismatch)") in lines
    assert lines[-1] == "  environment errors: 2 exception (episodes aborted; docs/runbooks/AsyncRLEnvErrors.md)"


def test_after_a_failure_the_printout_reads_this_attempts_file(tmp_path: Path) -> None:
    job = SimpleNamespace(metadata=SimpleNamespace(name="j"))
    options = RunOptions(run_dir=tmp_path)
    began = time.time()
    written = {**_preempted().to_json(), "status": "failed", "error": "ValueError: boom"}
    (tmp_path / "last-attempt.json").write_text(json.dumps(written))
    back = _summary_from_disk(job, options, began, "ValueError: boom")  # type: ignore[arg-type]
    assert back.to_json() == written and back.totals is not None and back.totals.steps_done == 3
    (tmp_path / "last-attempt.json").unlink()
    none = _summary_from_disk(job, options, began, "OSError: no space left")  # type: ignore[arg-type]
    assert format_summary(none).splitlines() == [
        "j: failed after 0 steps in 0.0 s (maxStaleness None, reference None)",
        "  training success (mean of the first / last 10 steps): n/a -> n/a",
        f"  run directory: {tmp_path}  (report: (not written))",
        "  error: OSError: no space left",
    ]


def test_the_driver_logs_one_progress_line_per_step_and_evaluation() -> None:
    """What ``kubectl logs`` of a driver pod shows while it trains (it had no line between start-up and the end)."""
    from asyncrl.trainer.cli.console import progress_line
    from asyncrl.trainer.driver.loop.evaluation import EvalResult
    from tests.support.step_reports import step_report

    # keep 0.75: 75 of 100 valid tokens kept (correction_counts)
    assert progress_line(step_report(3, keep=0.75, staleness=2), 4) == (
        "step 3/4: version 3, success 0.500, reward 0.500, keep 0.750, staleness max 2, 0.3 s")
    assert progress_line(step_report(3, applied=False), 4).startswith("step 3/4: version - (not applied),")
    ev = EvalResult(version=2, prompts=16, succeeded=5, reward_sum=5.0, sampled_tokens=100, seconds=1.0,
                    drain_seconds=0.0)
    assert progress_line(ev, 4) == f"eval at version 2: held-out success {ev.success:.3f}"
