"""The shared harness of the paper experiments (``bench/paper/*.py``, paper §6 and the appendix).

One *configuration* is a correction (``spec.correction`` and ``spec.oldLogits``) and a maximum
version gap W; everything else -- task, model, batch, minibatches, learning rate, evaluation -- is
the :class:`Scale` of the command. Each (configuration, seed) runs once through the driver's
in-process loop (:func:`asyncrl.trainer.driver.loop.run_job`, one local Ray session per command),
from one supervised warm start per task (cached; the seeds vary the RL phase), and its condensed result is cached as JSON under the
output folder: experiments that share a configuration (the methods table's ``loglinear`` is
Proposition 1's reference, its ``ewma`` the EWMA ablation's auto-with-reset cell, its ``exact`` the
threshold grid's default cell) run it once. Delete the folder (or pass ``--fresh``) to rerun.

What a run keeps (:func:`condense`): the held-out evaluation curve (``spec.eval``: the same prompts
and sampling seed in every run, version and training-loop seconds of each evaluation), and per
policy version the correction's keep ratio, clip fractions, ``r_d`` range, mean version gap, EWMA
reset flags and the actor's step time. :func:`curve_metrics` turns a curve into the table columns:
final held-out success, area under the eval curve (mean success over the evaluated versions,
trapezoid rule, 1.0 = perfect from the start), and the first version and loop second at which
success reached a level.
"""

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

W_PAPER = 3  # paper §6.1: the maximum version gap between rollout workers and the actor is 3
BASE_MASK = {"mode": "mask", "level": "token", "bounds": {"low": 0.5, "high": 2.0}}
BASE_CLIP = {"low": 0.2, "high": 0.2}


@dataclass(frozen=True)
class Scale:
    """How big one run is (the same for every configuration of a command)."""

    task: str = "calculator"  # chain-calculator did not improve in 20 versions here (docs/results.md)
    steps: int = 60  # policy versions
    prompts: int = 4  # GRPO groups per version
    group: int = 8  # samples per prompt
    minibatches: int = 4  # optimizer updates per version: the staleness clip binds from the 2nd on
    learning_rate: float = 1e-4  # per update (4 per version)
    warm_start_steps: int = 100
    eval_every: int = 10
    eval_prompts: int = 64
    seeds: tuple[int, ...] = (0, 1, 2)
    level: float = 0.7  # success level for "versions / seconds to level"


FULL = Scale()
QUICK = Scale(steps=4, prompts=4, group=4, minibatches=2, warm_start_steps=10, eval_every=2, eval_prompts=8,
              seeds=(0,), level=0.3)


@dataclass(frozen=True)
class Config:
    """One row of an experiment: a name, the correction section(s) and W."""

    name: str
    correction: Mapping[str, Any]
    old_logits: Mapping[str, Any] | None = None
    max_staleness: int = W_PAPER

    def key(self) -> str:
        """The cache's file name: a digest of what the configuration runs (not of its name, so the
        same run shared by two experiments under two names is one file)."""
        import hashlib

        blob = json.dumps([self.correction, self.old_logits, self.max_staleness], sort_keys=True)
        return "cfg-" + hashlib.sha1(blob.encode()).hexdigest()[:12]


def correction(reference: str, *, mask: Mapping[str, Any] | None = None, clip: Mapping[str, Any] | None = None,
               ewma: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``spec.correction`` with the experiments' base mask and clip unless given."""
    out: dict[str, Any] = {"reference": reference, "mask": dict(mask or BASE_MASK), "clip": dict(clip or BASE_CLIP)}
    if ewma is not None:
        out["ewma"] = dict(ewma)
    return out


# The methods of the Table 2 analog; other experiments reuse some of them by name.
EWMA_AUTO_RESET = {"reset": {"enabled": True, "keepRatioBelow": 0.8, "consecutiveSteps": 3}}
METHODS: tuple[Config, ...] = (
    Config("sync", correction("current"), max_staleness=0),
    Config("behavior", correction("behavior")),
    Config("current", correction("current")),
    Config("linear", correction("linear")),
    Config("loglinear", correction("loglinear")),
    Config("ewma", correction("ewma", ewma=EWMA_AUTO_RESET)),
    Config("exact", correction("exact"), old_logits={"strategy": "snapshot"}),
)


def method(name: str) -> Config:
    """The methods-table configuration called ``name`` (shared runs)."""
    for c in METHODS:
        if c.name == name:
            return c
    raise KeyError(f"no method {name!r}; valid: {', '.join(c.name for c in METHODS)}")


def job_doc(cfg: Config, scale: Scale, seed: int) -> dict[str, Any]:
    """The AsyncRLJob of one (configuration, seed) at ``scale``."""
    spec: dict[str, Any] = {
        "correction": dict(cfg.correction),
        "async": {"maxStaleness": cfg.max_staleness, "partialRollout": True},
        "model": {"preset": "tiny-llama", "rolloutDtype": "bfloat16"},
        "task": {"name": scale.task, "groupSize": scale.group},
        "train": {"steps": scale.steps, "promptsPerStep": scale.prompts, "minibatches": scale.minibatches,
                  "learningRate": scale.learning_rate, "warmStartSteps": scale.warm_start_steps, "seed": seed},
        "eval": {"everySteps": scale.eval_every, "prompts": scale.eval_prompts, "mode": "temperature"},
        "rollout": {"replicas": 1},
        "checkpoint": {"everySteps": 100_000},
        "monitoring": {"enabled": False},
    }
    if cfg.old_logits is not None:
        spec["oldLogits"] = dict(cfg.old_logits)
    name = f"paper-{cfg.key()}-s{seed}"  # an RFC 1035 label, whatever the configuration's display name
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": name}, "spec": spec}


STEP_KEYS = ("version", "wall_s", "step_s", "keep_ratio", "clip_or_reject_frac", "clip_low_frac", "clip_high_frac",
             "rd_min", "rd_max", "staleness_mean", "staleness_max", "ewma_reset", "success_rate", "in_bounds_ratio")


def condense(summary: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What an experiment reads of one run (see the module docstring)."""
    applied = [s for s in steps if "version" in s]
    loop = summary.get("loop", {})
    return {
        "eval_curve": summary.get("eval_curve", []),
        "steps": [{k: s[k] for k in STEP_KEYS if k in s} for s in applied],
        "loop_s": float(loop.get("wall_s", summary.get("wall_s", 0.0))) - float(summary.get("eval_s", 0.0)),
        "wall_s": summary.get("wall_s"),
        "final_version": summary.get("final_version"),
    }


def run_dir_root(out: Path) -> Path:
    return out / "runs"


class Runner:
    """Runs (or reads from the cache) every (configuration, seed) of a command in one Ray session."""

    def __init__(self, scale: Scale, out: Path, *, fresh: bool = False, log: Callable[[str], None] = print) -> None:
        self.scale, self.out, self.log = scale, out, log
        self.cache = out / "cache"
        if fresh and self.cache.exists():
            shutil.rmtree(self.cache)
        self.cache.mkdir(parents=True, exist_ok=True)
        self._check_scale()
        self._ray: Any = None

    def _check_scale(self) -> None:
        """A cache holds runs of one scale (seeds aside): refuse to mix in runs of another."""
        mine = {k: v for k, v in asdict(self.scale).items() if k not in ("seeds", "level")}
        path = self.cache / "scale.json"
        if not path.exists():
            path.write_text(json.dumps(mine, sort_keys=True))
            return
        theirs = json.loads(path.read_text())
        if theirs != mine:
            diff = ", ".join(f"{k}: cached {theirs.get(k)!r} vs now {v!r}" for k, v in mine.items() if theirs.get(k) != v)
            raise SystemExit(f"{self.cache} holds runs of another scale ({diff}); pass --fresh or another --out")

    def _path(self, cfg: Config, seed: int) -> Path:
        return self.cache / f"{cfg.key()}-s{seed}.json"

    def result(self, cfg: Config, seed: int) -> dict[str, Any]:
        path = self._path(cfg, seed)
        if path.exists():
            return json.loads(path.read_text())
        self._start_ray()
        from asyncrl.api.validation import validate_job
        from asyncrl.trainer.driver.loop import RunOptions, run_job

        rdir = run_dir_root(self.out) / f"{cfg.key()}-s{seed}"
        shutil.rmtree(rdir, ignore_errors=True)
        # One supervised warm start per task, made by the first run (with its seed) and shared by all:
        # the seeds vary the RL phase (sampling, minibatch order), the starting policy is the same.
        options = RunOptions(run_dir=rdir, warm_start_dir=self.out / f"warm-{self.scale.task}",
                             actor_threads=1, rollout_threads=1, num_cpus=2.0)
        t0 = time.monotonic()
        res = run_job(validate_job(job_doc(cfg, self.scale, seed)), options)
        out = condense(res.summary, res.steps)
        out["bench_s"] = round(time.monotonic() - t0, 1)
        path.write_text(json.dumps(out))
        shutil.rmtree(rdir, ignore_errors=True)  # the condensed result is what is kept
        last = out["eval_curve"][-1]["success"] if out["eval_curve"] else float("nan")
        self.log(f"  ran {cfg.name} seed {seed}: {out['bench_s']:.0f} s, held-out success {last:.3f}")
        return out

    def results(self, cfgs: Iterable[Config]) -> dict[str, list[dict[str, Any]]]:
        """``{config name: [result per seed]}``, run seed by seed (every configuration of seed 0 first,
        so an interrupted suite has whole seeds)."""
        cfgs = list(cfgs)
        by_seed = {s: {c.name: self.result(c, s) for c in cfgs} for s in self.scale.seeds}
        return {c.name: [by_seed[s][c.name] for s in self.scale.seeds] for c in cfgs}

    def _start_ray(self) -> None:
        if self._ray is None:
            from asyncrl.trainer.driver.ray_env import local_ray

            self._ray = local_ray(num_cpus=2)
            self._ray.__enter__()

    def close(self) -> None:
        if self._ray is not None:
            self._ray.__exit__(None, None, None)
            self._ray = None


# --- metrics of one run ----------------------------------------------------------------------
def auc(curve: Sequence[Mapping[str, Any]]) -> float:
    """Area under the held-out success curve over versions, divided by the version span (trapezoid)."""
    if len(curve) < 2:
        return float(curve[0]["success"]) if curve else float("nan")
    area = sum((b["version"] - a["version"]) * (a["success"] + b["success"]) / 2 for a, b in zip(curve, curve[1:], strict=False))
    return area / (curve[-1]["version"] - curve[0]["version"])


def first_reaching(curve: Sequence[Mapping[str, Any]], level: float) -> Mapping[str, Any] | None:
    return next((c for c in curve if c["success"] >= level), None)


def curve_metrics(run: Mapping[str, Any], level: float) -> dict[str, float]:
    """Final held-out success, AUC, versions and loop seconds to ``level`` (nan: never reached)."""
    curve = run["eval_curve"]
    hit = first_reaching(curve, level)
    return {
        "final": float(curve[-1]["success"]) if curve else float("nan"),
        "auc": auc(curve),
        "versions_to_level": float(hit["version"]) if hit else float("nan"),
        "seconds_to_level": float(hit["loop_s"]) if hit else float("nan"),
        "loop_s": float(run["loop_s"]),
    }


def step_series(run: Mapping[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs = [s["version"] for s in run["steps"] if key in s]
    return xs, [float(s[key]) for s in run["steps"] if key in s]


# --- aggregation and rendering ---------------------------------------------------------------
def mean_std(values: Sequence[float]) -> tuple[float, float, int]:
    """Mean and sample std over the finite values, and how many were finite."""
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return float("nan"), float("nan"), 0
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0), len(v)


def fmt(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± std`` over seeds; ``(k/n)`` when only k of n seeds have a value (e.g. reached a level)."""
    m, s, k = mean_std(values)
    if k == 0:
        return "never"
    cell = f"{m:.{digits}f} ± {s:.{digits}f}"
    return cell if k == len(values) else f"{cell} ({k}/{len(values)})"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def mean_curve(runs: Sequence[Mapping[str, Any]], key: str | None = None) -> tuple[list[float], list[float], list[float]]:
    """Mean and std across seeds of the eval curve (``key`` None) or of a step series, on the versions
    every seed has."""
    series = [
        {c["version"]: c["success"] for c in r["eval_curve"]} if key is None else dict(zip(*step_series(r, key), strict=False))
        for r in runs
    ]
    common = sorted(set.intersection(*(set(s) for s in series))) if series else []
    means = [statistics.fmean(s[v] for s in series) for v in common]
    stds = [statistics.stdev([s[v] for s in series]) if len(series) > 1 else 0.0 for v in common]
    return [float(v) for v in common], means, stds


def figure(path: Path, panels: Sequence[tuple[str, str, Mapping[str, Sequence[Mapping[str, Any]]], str | None]],
           *, markers: Callable[[Any, str, Sequence[Mapping[str, Any]]], None] | None = None) -> None:
    """A row of small panels: ``(title, y label, {series name: runs}, step key or None for eval)``;
    mean across seeds with a ±std band. Saved as a small PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (title, ylabel, groups, key) in zip(axes[0], panels, strict=True):
        for name, runs in groups.items():
            xs, m, s = mean_curve(runs, key)
            (line,) = ax.plot(xs, m, label=name, lw=1.4)
            ax.fill_between(xs, [a - b for a, b in zip(m, s, strict=False)], [a + b for a, b in zip(m, s, strict=False)],
                            color=line.get_color(), alpha=0.15, lw=0)
            if markers is not None:
                markers(ax, name, runs)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("policy version", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --- command line ----------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny smoke-test scale (CI): one seed, a few versions")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the scale's seeds")
    p.add_argument("--steps", type=int, default=None, help="override the scale's policy versions")
    p.add_argument("--out", type=Path, default=Path("runs/paper"),
                   help="cache of runs (shared by the five commands) and where tables/figures go")
    p.add_argument("--fresh", action="store_true", help="ignore cached runs")
    return p


def scale_from(args: argparse.Namespace) -> Scale:
    s = QUICK if args.quick else FULL
    if args.seeds:
        s = replace(s, seeds=tuple(args.seeds))
    if args.steps:
        s = replace(s, steps=args.steps)
    return s


def out_dir(args: argparse.Namespace) -> Path:
    """Quick runs never share a cache with full ones."""
    return args.out / ("quick" if args.quick else "full")


def run_experiment(args: argparse.Namespace, cfgs: Sequence[Config]
                   ) -> tuple[Scale, Path, float, dict[str, list[dict[str, Any]]]]:
    """One experiment command's scale, output folder, start time and every config's runs (one per seed)."""
    scale, out = scale_from(args), out_dir(args)
    started = time.monotonic()
    runner = Runner(scale, out, fresh=args.fresh)
    try:
        return scale, out, started, runner.results(cfgs)
    finally:
        runner.close()


def success_and_keep(runs: Sequence[Mapping[str, Any]], level: float) -> list[str]:
    """The columns final held-out success, AUC, keep ratio mean and keep ratio min, each over the seeds."""
    m = [curve_metrics(r, level) for r in runs]
    keep = [step_series(r, "keep_ratio")[1] for r in runs]
    return [fmt([x["final"] for x in m]), fmt([x["auc"] for x in m]),
            fmt([sum(k) / len(k) for k in keep], 4), fmt([min(k) for k in keep], 4)]


def write_outputs(out: Path, name: str, table: str, header_lines: Sequence[str]) -> Path:
    """``<out>/<name>.md``: the command, the scale and the table."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.md"
    path.write_text("\n".join(header_lines) + "\n\n" + table)
    return path


def describe(scale: Scale, started: float) -> list[str]:
    return [
        f"command: {' '.join([Path(sys.executable).name, *sys.argv])}",
        f"scale: {json.dumps(asdict(scale))}",
        f"machine: {os.cpu_count()} cores (shared), wall {time.monotonic() - started:.0f} s for this command",
    ]
