"""The run directory: what a finished (or interrupted) run leaves behind.

```
<run-dir>/
  job.yaml          the validated job, as run
  metrics.jsonl     one JSON object per optimizer step: reward/success, staleness, the
                    correction metrics (keep_ratio, clip_*_frac, ...), timings; and one per
                    held-out evaluation (spec.eval): eval_version, eval_success, eval_reward, eval_s
                    ("step" = the evaluated version, no "version" key)
  summary.json      start/final success, eval_first/eval_last/eval_curve, wall time, counts;
                    rewritten on every exit path -- except by an attempt that failed before it
                    logged a step: that one writes last-attempt.json and keeps what a good run wrote
  report.png        reward/success (and the held-out evaluation's success by version), keep ratio,
                    clip fractions, staleness, EWMA resets over steps
  warm_start/       actor weights after the supervised warm start (a rerun skips it)
  checkpoints/      step checkpoints (checkpoint.dir when relative)
```
"""

import json
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.trainer.correction.stats import CorrectionStats
from asyncrl.trainer.driver.run import faults
from asyncrl.trainer.driver.run.metrics_log import (
    EvalLine,
    JSONObject,
    Line,
    MetricsFileError,
    MetricsLine,
    StepLine,
    parse_lines,
    read_metrics,
    read_records,
)

__all__ = ["MetricsFileError", "RunDir", "sweep_temporaries", "write_report"]

log = logging.getLogger(__name__)

# What an interrupted write leaves in the run directory (summary, report, the warm start's folders).
_TEMPORARY = re.compile(r"^(summary|last-attempt)\.json\.tmp$|^\.(report\.png|metrics\.jsonl)\.tmp-\d+$"
                        r"|^\.warm_start\.(tmp|old)-\d+$")


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory; ``create`` makes the folder."""

    path: Path
    checkpoint_base: Path | None = None  # where a relative checkpoint.dir lives (None: the run directory)

    @classmethod
    def create(cls, path: str | Path, checkpoint_base: Path | None = None) -> "RunDir":
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        return cls(p, checkpoint_base)

    @property
    def metrics_jsonl(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def summary_json(self) -> Path:
        return self.path / "summary.json"

    @property
    def report_png(self) -> Path:
        return self.path / "report.png"

    @property
    def last_attempt_json(self) -> Path:
        """The summary of an attempt that failed before it logged a step (summary.json stays the good run's)."""
        return self.path / "last-attempt.json"

    @property
    def job_yaml(self) -> Path:
        return self.path / "job.yaml"

    @property
    def warm_start_dir(self) -> Path:
        return self.path / "warm_start"

    def checkpoint_dir(self, configured: str) -> Path:
        """``checkpoint.dir``: relative paths live inside the run directory (in a cluster: the job's volume)."""
        p = Path(configured)
        return p if p.is_absolute() else (self.checkpoint_base or self.path) / p

    def append_step(self, record: dict[str, Any]) -> None:
        """Append one step's record to ``metrics.jsonl`` (flushed: a crash keeps every step so far)."""
        with self.metrics_jsonl.open("a") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")

    def read_steps(self, notices: list[str] | None = None) -> list[dict[str, object]]:
        """The logged objects (:func:`.metrics_log.read_records`: a torn last line is cut off and said)."""
        return read_records(self.metrics_jsonl, notices)

    def read_metrics(self, notices: list[str] | None = None) -> list[MetricsLine]:
        """The logged lines, typed (:func:`.metrics_log.read_metrics`)."""
        return read_metrics(self.metrics_jsonl, notices)

    def keep_steps_up_to(self, version: int, notices: list[str] | None = None) -> list[dict[str, object]]:
        """On resume from ``version``: drop logged steps after it (they will be redone); return the rest."""
        kept = [line.record for line in self.read_metrics(notices) if line.step <= version]
        if self.metrics_jsonl.exists():
            _atomic_write(self.metrics_jsonl, "".join(json.dumps(r) + "\n" for r in kept).encode())
        return [dict(r) for r in kept]

    def write_summary(self, summary: JSONObject, *, attempt_only: bool = False) -> Path:
        """Write ``summary.json`` (``attempt_only``: ``last-attempt.json``, leaving summary.json as it is) from
        its JSON form (:meth:`.summary.RunSummary.to_json`); a failed write removes its temporary file and raises."""
        target = self.last_attempt_json if attempt_only else self.summary_json
        _atomic_write(target, (json.dumps(_jsonable(summary), indent=2) + "\n").encode(),
                      tmp=target.with_suffix(".json.tmp"))
        if not attempt_only:
            self.last_attempt_json.unlink(missing_ok=True)  # this summary is the newest word
        return target

    def sweep_temporaries(self) -> list[Path]:
        """Remove what interrupted writes left in the run directory (``summary.json.tmp``, the warm start's
        ``.warm_start.tmp-PID``, ...). Called when a run starts."""
        return sweep_temporaries(self.path)


def sweep_temporaries(folder: Path) -> list[Path]:
    """Remove the run directory's temporary files and folders left in ``folder``; returns them."""
    return faults.remove_matching(folder, _TEMPORARY)


def _atomic_write(target: Path, data: bytes, tmp: Path | None = None) -> None:
    """Write ``data`` to a temporary sibling, then rename it over ``target``; on failure remove the sibling."""
    tmp = tmp or target.with_name(f".{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _jsonable(record: Mapping[str, Any]) -> dict[str, Any]:
    """JSON has no NaN/Inf: non-finite floats become strings ("nan", "inf") so the file stays valid."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = str(v)
        elif isinstance(v, dict):
            out[k] = _jsonable(v)
        else:
            out[k] = v
    return out


Series = Callable[[MetricsLine], float | None]  # a line's value on one curve (None: not on it)


def _step(value: Callable[[StepLine], float | None]) -> Series:
    return lambda line: value(line) if isinstance(line, StepLine) else None


def _correction(value: Callable[[CorrectionStats[float]], float]) -> Series:
    return _step(lambda s: value(s.correction) if s.correction is not None else None)


def _held_out(line: MetricsLine) -> float | None:
    return line.success if isinstance(line, EvalLine) else None


def _series(lines: Sequence[MetricsLine], value: Series) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for line in lines:
        v = value(line)
        if v is not None and math.isfinite(v):
            xs.append(float(line.step))
            ys.append(float(v))
    return xs, ys


def write_report(records: Sequence[Line], out: Path, title: str = "") -> Path:
    """Plot the ``metrics.jsonl`` lines to ``out`` (PNG, matplotlib Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = parse_lines(records)
    fig, axes = plt.subplots(5, 1, figsize=(8, 12), sharex=True)
    panels: list[tuple[str, list[tuple[Series, str]]]] = [
        ("reward / success", [(_step(lambda s: s.reward_mean), "mean reward"),
                              (_step(lambda s: s.success_rate), "success rate (training batch)"),
                              (_held_out, "held-out eval success (current version)")]),
        ("discrepancy keep ratio", [(_correction(lambda c: c.keep_ratio), "keep ratio")]),
        ("staleness clip fractions", [(_correction(lambda c: c.clip_low_frac), "clip low"),
                                      (_correction(lambda c: c.clip_high_frac), "clip high")]),
        ("token staleness (versions)", [(_step(lambda s: s.staleness_mean), "mean"),
                                        (_step(lambda s: s.staleness_max), "max")]),
    ]
    for ax, (name, curves) in zip(axes[:4], panels, strict=True):
        for value, label in curves:
            xs, ys = _series(lines, value)
            if xs:
                evaluation = value is _held_out  # a few points, one per evaluated version
                ax.plot(xs, ys, label=label, marker="o" if evaluation else "." if len(xs) < 50 else None,
                        color="black" if evaluation else None, linewidth=2 if evaluation else None)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    xs, ys = _series(lines, _step(lambda s: s.ewma_reset))
    cumulative = [sum(ys[: i + 1]) for i in range(len(ys))]
    axes[4].step(xs, cumulative, where="post", label="EWMA resets (cumulative)")
    axes[4].set_ylabel("EWMA resets", fontsize=8)
    axes[4].set_xlabel("policy version (one per rollout batch: train.minibatches x train.epochs updates)")
    axes[4].grid(alpha=0.3)
    fig.suptitle(title or "asyncrl run")
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        fig.savefig(tmp, dpi=80, format="png")
        os.replace(tmp, out)  # a full disk never leaves a half-written report in place of a good one
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)
    return out
