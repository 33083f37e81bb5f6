"""The run directory: what a finished (or interrupted) run leaves behind.

```
<run-dir>/
  job.yaml          the validated job, as run
  metrics.jsonl     one JSON object per optimizer step: reward/success, staleness, the
                    correction metrics (keep_ratio, clip_*_frac, ...), timings; and one per
                    held-out evaluation (spec.eval): eval_version, eval_success, eval_reward, eval_s
                    ("step" = the evaluated version, no "version" key)
  summary.json      start/final success, eval_first/eval_last/eval_curve, wall time, counts;
                    rewritten on every exit path
  report.png        reward/success (and the held-out evaluation's success by version), keep ratio,
                    clip fractions, staleness, EWMA resets over steps
  warm_start/       actor weights after the supervised warm start (a rerun skips it)
  checkpoints/      step checkpoints (checkpoint.dir when relative)
```
"""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory; ``create`` makes the folder."""

    path: Path

    @classmethod
    def create(cls, path: str | Path) -> "RunDir":
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        return cls(p)

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
    def job_yaml(self) -> Path:
        return self.path / "job.yaml"

    @property
    def warm_start_dir(self) -> Path:
        return self.path / "warm_start"

    def checkpoint_dir(self, configured: str) -> Path:
        """``checkpoint.dir``: relative paths live inside the run directory."""
        p = Path(configured)
        return p if p.is_absolute() else self.path / p

    def append_step(self, record: dict[str, Any]) -> None:
        """Append one step's record to ``metrics.jsonl`` (flushed: a crash keeps every step so far)."""
        with self.metrics_jsonl.open("a") as f:
            f.write(json.dumps(_jsonable(record)) + "\n")

    def read_steps(self) -> list[dict[str, Any]]:
        if not self.metrics_jsonl.exists():
            return []
        return [json.loads(line) for line in self.metrics_jsonl.read_text().splitlines() if line.strip()]

    def keep_steps_up_to(self, version: int) -> list[dict[str, Any]]:
        """On resume from ``version``: drop logged steps after it (they will be redone); return the rest."""
        kept = [s for s in self.read_steps() if s.get("step", 0) <= version]
        if self.metrics_jsonl.exists():
            self.metrics_jsonl.write_text("".join(json.dumps(s) + "\n" for s in kept))
        return kept

    def write_summary(self, summary: dict[str, Any]) -> None:
        tmp = self.summary_json.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(_jsonable(summary), indent=2) + "\n")
        tmp.replace(self.summary_json)


def _jsonable(record: dict[str, Any]) -> dict[str, Any]:
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


def _series(steps: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for s in steps:
        v = s.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(s["step"]))
            ys.append(float(v))
    return xs, ys


def write_report(steps: Sequence[dict[str, Any]], out: Path, title: str = "") -> Path:
    """Plot the per-step records to ``out`` (PNG, matplotlib Agg: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(8, 12), sharex=True)
    panels = [
        ("reward / success", [("reward_mean", "mean reward"), ("success_rate", "success rate (training batch)"),
                              ("eval_success", "held-out eval success (current version)")]),
        ("discrepancy keep ratio", [("keep_ratio", "keep ratio")]),
        ("staleness clip fractions", [("clip_low_frac", "clip low"), ("clip_high_frac", "clip high")]),
        ("token staleness (versions)", [("staleness_mean", "mean"), ("staleness_max", "max")]),
    ]
    for ax, (name, keys) in zip(axes[:4], panels, strict=True):
        for key, label in keys:
            xs, ys = _series(steps, key)
            if xs:
                evaluation = key.startswith("eval_")  # a few points, one per evaluated version
                ax.plot(xs, ys, label=label, marker="o" if evaluation else "." if len(xs) < 50 else None,
                        color="black" if evaluation else None, linewidth=2 if evaluation else None)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7, loc="best")
    xs, ys = _series(steps, "ewma_reset")
    cumulative = [sum(ys[: i + 1]) for i in range(len(ys))]
    axes[4].step(xs, cumulative, where="post", label="EWMA resets (cumulative)")
    axes[4].set_ylabel("EWMA resets", fontsize=8)
    axes[4].set_xlabel("policy version (one per rollout batch: train.minibatches x train.epochs updates)")
    axes[4].grid(alpha=0.3)
    fig.suptitle(title or "asyncrl run")
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
