"""What ``asyncrl run`` shows: a tqdm bar while the job runs, then a short summary."""

import sys
import time
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


def format_summary(summary: dict[str, Any]) -> str:
    """The final lines printed after a run (also after Ctrl-C or a failure)."""

    def pct(x: Any) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"{summary.get('job')}: {summary.get('status')} after {summary.get('steps_done', 0)} steps "
        f"in {summary.get('wall_s', 0):.1f} s (maxStaleness {summary.get('max_staleness')}, "
        f"reference {summary.get('reference')})",
        f"  training success (mean of the first / last 10 steps): {pct(summary.get('start_success'))} -> "
        f"{pct(summary.get('final_success'))}",
        f"  run directory: {summary.get('run_dir')}  (report: {summary.get('report')})",
    ]
    if summary.get("eval_first") is not None:
        # The held-out evaluation is the honest learning signal: the current version, on prompts never trained on.
        lines.insert(1, f"  success went from {pct(summary['eval_first'])} to {pct(summary['eval_last'])} "
                        f"(held-out evaluation, version {summary.get('eval_first_version')} -> "
                        f"{summary.get('eval_last_version')}, {len(summary.get('eval_curve') or [])} evaluations)")
    warm = summary.get("warm_start")
    if warm:
        how = ("reused from the run directory" if warm.get("cached") else
               "stopped by SIGTERM, not cached" if warm.get("interrupted") else f"{warm.get('seconds')} s")
        lines.insert(1, f"  warm start: {warm.get('steps')} supervised steps ({how})")
    elif summary.get("resumed_from"):
        lines.insert(1, f"  resumed from {summary['resumed_from']}")
    for notice in summary.get("notices") or []:  # a checkpoint skipped, a torn log line repaired
        lines.append(f"  note: {notice}")
    if summary.get("status") == "preempted":
        version = (summary.get("stopped") or {}).get("version", summary.get("final_version"))
        saved = summary.get("final_checkpoint") or "none needed (nothing trained since the last one)"
        lines.append(f"  stopped by SIGTERM at version {version}; final checkpoint: {saved} (a rerun resumes there)")
    probe = summary.get("startup_check")
    if probe:  # the start-up discrepancy probe, one engine per line
        for e in probe.get("engines", []):
            verdict = "ok" if e["passed"] else f"REFUSED, looks like {e['cause']}"
            lines.append(f"  start-up probe {e['engine']}: mean |log r_d| {e['mean_abs_log_ratio']:.2e}, p99 "
                         f"{e['p99_abs_log_ratio']:.2e} over {e['tokens']} tokens ({verdict})")
    if summary.get("export"):
        lines.append(f"  exported: {summary['export']['path']} (version {summary['export']['version']}; "
                     "AutoModelForCausalLM.from_pretrained loads it)")
    errors = {r: n for r, n in (summary.get("env_errors") or {}).items() if n}
    if errors:  # episodes the environment's code aborted (the job went on without them)
        lines.append("  environment errors: " + ", ".join(f"{n} {r}" for r, n in errors.items())
                     + " (episodes aborted; docs/runbooks/AsyncRLEnvErrors.md)")
    if summary.get("error"):
        lines.append(f"  error: {summary['error']}")
    return "\n".join(lines)


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


def _summary_from_disk(job: AsyncRLJob, options: RunOptions, began: float, error: str | None) -> dict[str, Any]:
    """After an exception run_job has written this attempt's summary (last-attempt.json when it logged no
    step, else summary.json); read it back for the printout. A file older than the attempt is a previous
    run's, and a full disk may have left none: then the error itself is the summary."""
    import json

    run_dir = Path(options.run_dir or ".")
    for name in ("last-attempt.json", "summary.json"):
        path = run_dir / name
        try:
            if path.stat().st_mtime >= began - 1.0:  # file systems with coarse timestamps
                return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return {"job": job.metadata.name, "status": "failed", "run_dir": str(run_dir), "error": error,
            "report": "(not written)"}
