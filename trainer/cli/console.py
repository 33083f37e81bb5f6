"""What ``asyncrl run`` shows: a tqdm bar while the job runs, then a short summary."""

import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.api.job import AsyncRLJob
from asyncrl.trainer.driver.loop.evaluation import EvalResult
from asyncrl.trainer.driver.loop.gang_restart import run_with_restarts
from asyncrl.trainer.driver.loop.startup_probe import StartupCheckError
from asyncrl.trainer.driver.loop.training_loop import (
    LoopEvent,
    RunOptions,
    RunResult,
    default_run_dir,
)
from asyncrl.trainer.driver.run.faults import describe
from asyncrl.trainer.driver.run.metrics_log import JSON, JSONObject
from asyncrl.trainer.driver.run.summary import RunSummary


def format_summary(summary: RunSummary) -> str:
    """The final lines printed after a run (also after Ctrl-C or a failure)."""

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    t = summary.totals  # None: the run ended before its totals (a summary read back, or none at all)
    lines = [
        f"{summary.job}: {summary.status} after {t.steps_done if t else 0} steps "
        f"in {t.wall_s if t else 0:.1f} s (maxStaleness {summary.max_staleness}, "
        f"reference {summary.reference})",
        f"  training success (mean of the first / last 10 steps): {pct(t.start_success if t else None)} -> "
        f"{pct(t.final_success if t else None)}",
        f"  run directory: {summary.run_dir}  (report: {summary.report})",
    ]
    if t is not None and t.eval_first is not None:
        # The held-out evaluation is the honest learning signal: the current version, on prompts never trained on.
        lines.insert(1, f"  success went from {pct(t.eval_first)} to {pct(t.eval_last)} "
                        f"(held-out evaluation, version {t.eval_first_version} -> "
                        f"{t.eval_last_version}, {len(t.eval_curve)} evaluations)")
    warm = summary.warm_start
    if warm:
        how = ("reused from the run directory" if warm.get("cached") else
               "stopped by SIGTERM, not cached" if warm.get("interrupted") else f"{warm.get('seconds')} s")
        lines.insert(1, f"  warm start: {warm.get('steps')} supervised steps ({how})")
    elif summary.resumed_from:
        lines.insert(1, f"  resumed from {summary.resumed_from}")
    for notice in summary.notices or ():  # a checkpoint skipped, a torn log line repaired
        lines.append(f"  note: {notice}")
    if summary.status == "preempted":
        version = (summary.stopped or {}).get("version", t.final_version if t else None)
        saved = summary.final_checkpoint or "none needed (nothing trained since the last one)"
        lines.append(f"  stopped by SIGTERM at version {version}; final checkpoint: {saved} (a rerun resumes there)")
    probe = summary.startup_check
    if probe:  # the start-up discrepancy probe, one engine per line
        for e in _objects(probe.get("engines")):
            verdict = "ok" if e["passed"] else f"REFUSED, looks like {e['cause']}"
            lines.append(f"  start-up probe {e['engine']}: mean |log r_d| {e['mean_abs_log_ratio']:.2e}, p99 "
                         f"{e['p99_abs_log_ratio']:.2e} over {e['tokens']} tokens ({verdict})")
    if summary.export:
        lines.append(f"  exported: {summary.export['path']} (version {summary.export['version']}; "
                     "AutoModelForCausalLM.from_pretrained loads it)")
    errors = {r: n for r, n in (summary.env_errors or {}).items() if n}
    if errors:  # episodes the environment's code aborted (the job went on without them)
        lines.append("  environment errors: " + ", ".join(f"{n} {r}" for r, n in errors.items())
                     + " (episodes aborted; docs/runbooks/AsyncRLEnvErrors.md)")
    if summary.error:
        lines.append(f"  error: {summary.error}")
    return "\n".join(lines)


def _objects(value: JSON) -> list[JSONObject]:
    """The JSON objects of a JSON list (none: not a list)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def progress_line(event: LoopEvent, total: int) -> str:
    """One line per step or evaluation for a log (the driver pod's ``kubectl logs``; ``asyncrl run`` shows a bar)."""
    if isinstance(event, EvalResult):
        return f"eval at version {event.version}: held-out success {event.success:.3f}"
    keep = event.actor.metrics.correction.keep_ratio
    version = event.version if event.version is not None else "- (not applied)"
    return (f"step {event.step}/{total}: version {version}, success {event.success_rate:.3f}, "
            f"reward {event.reward_mean:.3f}, keep {keep:.3f}, staleness max {event.staleness_max}, "
            f"{event.step_s:.1f} s")


def run_with_progress(job: AsyncRLJob, options: RunOptions, *, quiet: bool = False) -> int:
    """Run ``job`` with a progress bar; returns the process exit code."""
    from tqdm import tqdm

    total = options.steps or job.spec.train.steps
    bar: Any = None

    def on_start(info: dict[str, Any]) -> None:
        if not quiet:
            print(f"metrics: {info.get('metrics_url')}  run dir: {info.get('run_dir')}", file=sys.stderr)

    warm_bar: Any = None

    def on_warm(done: int, steps: int, loss: float) -> None:
        nonlocal warm_bar
        if quiet:
            return
        if warm_bar is None:
            warm_bar = tqdm(total=steps, desc="warm start", unit="step", file=sys.stderr, dynamic_ncols=True)
        warm_bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        warm_bar.update(done - warm_bar.n)
        if done >= steps:
            warm_bar.close()

    postfix: dict[str, Any] = {"eval": "-"}  # the last held-out evaluation stays beside the training numbers

    def on_step(event: LoopEvent) -> None:
        nonlocal bar
        if isinstance(event, EvalResult):  # an evaluation (spec.eval): no step was taken
            postfix["eval"] = f"{event.success:.2f}@v{event.version}"
            if bar is not None:
                bar.set_postfix(postfix, refresh=True)
            return
        if bar is None and not quiet:
            bar = tqdm(total=total, initial=event.step - 1, desc=job.metadata.name, unit="step",
                       file=sys.stderr, dynamic_ncols=True)
        if bar is not None:
            postfix.update(reward=f"{event.reward_mean:.2f}", success=f"{event.success_rate:.2f}",
                           keep=f"{event.actor.metrics.correction.keep_ratio:.3f}",
                           v=event.version if event.version is not None else "-")
            bar.set_postfix(postfix, refresh=False)
            if event.applied:
                bar.update(1)

    if not quiet:
        print(f"starting {job.metadata.name}: local Ray, {job.spec.rollout.replicas} rollout workers, "
              "warm start first ...", file=sys.stderr)
    options = replace(options, run_dir=options.run_dir or default_run_dir(job))
    result: RunResult | None = None
    code = 0
    error: str | None = None
    began = time.time()
    try:
        # the actor gang failing (a rank died or raised) restarts the run from its checkpoint, as the operator does
        result = run_with_restarts(job, options, on_step=on_step, on_start=on_start, on_warm=on_warm,
                                   on_restart=lambda n, exc: print(
                                       f"\n{exc.line}: restarting the gang from the last complete checkpoint "
                                       f"({n}/{job.spec.run_policy.backoff_limit})", file=sys.stderr))
    except KeyboardInterrupt:
        code = 130
    except StartupCheckError as exc:  # the engines' log-probs do not match the actor's: a configuration error
        code = StartupCheckError.exit_code
        error = describe(exc)
    except Exception as exc:  # noqa: BLE001 -- the summary below carries the error
        code = 1
        error = describe(exc)
    finally:
        for b in (warm_bar, bar):
            if b is not None:
                b.close()
    summary = result.summary if result is not None else _summary_from_disk(job, options, began, error)
    print(format_summary(summary))
    return code


def _summary_from_disk(job: AsyncRLJob, options: RunOptions, began: float, error: str | None) -> RunSummary:
    """After an exception run_job has written this attempt's summary (last-attempt.json when it logged no
    step, else summary.json); read it back for the printout. A file older than the attempt is a previous
    run's, and a full disk may have left none: then the error itself is the summary."""
    import json

    run_dir = Path(options.run_dir or ".")
    for name in ("last-attempt.json", "summary.json"):
        path = run_dir / name
        try:
            if path.stat().st_mtime >= began - 1.0:  # file systems with coarse timestamps
                return RunSummary.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return RunSummary(job=job.metadata.name, status="failed", run_dir=str(run_dir), error=error,
                      report="(not written)")
