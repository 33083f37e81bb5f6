"""The shared harness of the paper experiments (``bench/paper/*.py``, paper §6 and the appendix).

One *configuration* is a correction (``spec.correction`` and ``spec.oldLogits``) and a maximum
version gap W; everything else -- task, model, batch, minibatches, learning rate, evaluation -- is
the :class:`Scale` of the command. Each (configuration, seed) runs once through the driver's
in-process loop (:func:`asyncrl.trainer.driver.loop.training_loop.run_job`, one local Ray session per command),
from one supervised warm start per task (made once at :data:`WARM_SEED`, cached; the seeds vary the RL phase;
its fingerprint is in every record, :func:`warm_fingerprint`), and writes one JSON
record (:mod:`records`) into the record folder: experiments that share a configuration (the methods
table's ``loglinear`` is Proposition 1's reference, its ``ewma`` the EWMA ablation's auto-with-reset
cell, its ``exact`` the threshold grid's paper cell) run it once. The full scale's records are
committed (``docs/results/data/cells/``) and ``bench/paper/report.py`` renders ``docs/results.md``
from them; ``--fresh`` reruns and overwrites.

The thresholds are the paper's (Table 4, first block): a mask of ``[0.99, 1.01]`` on ``r_d`` and a
clip of ``[0.997, 1.004]`` on ``r_s`` (:data:`PAPER_MASK`, :data:`PAPER_CLIP`); the loose
``[0.5, 2]`` / 0.2 block of earlier versions of this page is kept only as a contrast
(:data:`LOOSE_MASK`, :data:`LOOSE_CLIP`). :func:`eval_metrics` turns a record's evaluation curve
into the table columns: final held-out success, area under the eval curve (mean success over the
evaluated versions, trapezoid rule, 1.0 = perfect from the start), and the first version and loop
second at which success reached a level.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import records as rec  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RECORDS = ROOT / "docs" / "results" / "data" / "cells"  # the committed records of the full scale

W_PAPER = 3  # paper §6.1: the maximum version gap between rollout workers and the actor is 3
# Paper Table 4, first block: mask [0.990, 1.010] on r_d, clip [0.997, 1.004] on r_s.
PAPER_MASK = {"mode": "mask", "level": "token", "bounds": {"low": 0.99, "high": 1.01}}
PAPER_CLIP = {"low": 0.003, "high": 0.004}
LOOSE_MASK = {"mode": "mask", "level": "token", "bounds": {"low": 0.5, "high": 2.0}}  # the contrast block
LOOSE_CLIP = {"low": 0.2, "high": 0.2}
BASE_MASK, BASE_CLIP = PAPER_MASK, PAPER_CLIP
# The paper's reset rule (§6.5): in-bounds ratio below tau for k consecutive versions; tau is chosen
# below the noise floor of the in-bounds ratio (docs/results.md, "noise floor").
RESET_TAU, RESET_K = 0.8, 3
# The warm start every run of a scale starts from is made at this seed, whatever seed a command runs first
# (earlier versions made it with the seed of the command's first run, so it depended on the command).
WARM_SEED = 0


@dataclass(frozen=True)
class Scale:
    """How big one run is (the same for every configuration of a command)."""

    task: str = "calculator"  # chain-calculator did not improve in 20 versions at this batch size
    steps: int = 60  # policy versions
    prompts: int = 4  # GRPO groups per version
    group: int = 8  # samples per prompt
    # 8 optimizer updates per version at 1e-4: the paper's regime at this scale, where the current weights (3
    # versions ahead of the tokens, the reference a reset restores) keep most tokens inside the [0.99, 1.01]
    # mask and tau = 0.8 fires about once a run. At 3e-4 (earlier versions of docs/results.md, now its "fast"
    # block) their in-bounds ratio was 0.62 over versions 2-10 and the reset fired every 3 versions.
    minibatches: int = 8
    learning_rate: float = 1e-4  # per update
    warm_start_steps: int = 100
    eval_every: int = 15
    eval_prompts: int = 300  # binomial standard error of one evaluation <= sqrt(0.25 / 300) = 0.029
    probe_rollouts: int = 64  # start-up probe: |log r_d| of bf16 rollout vs the fp32 actor at version 0
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    level: float = 0.6  # success level for "versions / seconds to level"


FULL = Scale()
QUICK = Scale(steps=4, prompts=4, group=4, minibatches=2, warm_start_steps=10, eval_every=2, eval_prompts=8,
              probe_rollouts=4, seeds=(0,), level=0.3)


@dataclass(frozen=True)
class Config:
    """One row of an experiment: a name, the correction section(s) and W."""

    name: str
    correction: Mapping[str, Any]
    old_logits: Mapping[str, Any] | None = None
    max_staleness: int = W_PAPER
    learning_rate: float | None = None  # the scale's unless set (the EWMA stress block: a policy that moves faster)
    model: Mapping[str, Any] | None = None  # extra spec.model fields (bench/lora_learning.py: lora); digested when set

    def key(self) -> str:
        """The record's file name: a digest of what the configuration runs (not of its name, so the
        same run shared by two experiments under two names is one file). A configuration at the scale's
        learning rate digests as it did before the override existed (the committed records keep their names)."""
        import hashlib

        parts: list[Any] = [_digestible(self.correction), self.old_logits, self.max_staleness]
        if self.learning_rate is not None:
            parts.append({"learning_rate": self.learning_rate})
        if self.model is not None:
            parts.append({"model": dict(self.model)})
        blob = json.dumps(parts, sort_keys=True)
        return "cfg-" + hashlib.sha1(blob.encode()).hexdigest()[:12]

    def spec(self) -> dict[str, Any]:
        out = {"correction": dict(self.correction), "old_logits": None if self.old_logits is None else dict(self.old_logits),
               "max_staleness": self.max_staleness}
        if self.learning_rate is not None:
            out["learning_rate"] = self.learning_rate
        if self.model is not None:
            out["model"] = dict(self.model)
        return out


def correction(reference: str, *, mask: Mapping[str, Any] | None = None, clip: Mapping[str, Any] | None = None,
               ewma: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``spec.correction`` with the experiments' base (the paper's) mask and clip unless given."""
    out: dict[str, Any] = {"reference": reference, "mask": dict(mask or BASE_MASK), "clip": dict(clip or BASE_CLIP)}
    if ewma is not None:
        out["ewma"] = dict(ewma)
    return out


def reset_rule(enabled: bool = True) -> dict[str, Any]:
    """The paper's reset rule, named explicitly (``rule: paper``) so the cells keep running it whatever the
    spec's default; :meth:`Config.key` leaves the name out of the digest (the records predate the field)."""
    return {"enabled": enabled, "keepRatioBelow": RESET_TAU, "consecutiveSteps": RESET_K, "rule": "paper"}


def _digestible(correction: Mapping[str, Any]) -> Mapping[str, Any]:
    """``correction`` without an explicit ``ewma.reset.rule: paper`` (the rule every record before the field ran)."""
    reset = correction.get("ewma", {}).get("reset") if isinstance(correction.get("ewma"), Mapping) else None
    if not isinstance(reset, Mapping) or reset.get("rule") != "paper":
        return correction
    return {**correction, "ewma": {**correction["ewma"], "reset": {k: v for k, v in reset.items() if k != "rule"}}}


# The methods of the Table 2 analog; other experiments reuse some of them by name.
EWMA_AUTO_RESET = {"reset": reset_rule()}
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


def job_doc(cfg: Config, scale: Scale, seed: int, base: Path | None = None) -> dict[str, Any]:
    """The AsyncRLJob of one (configuration, seed) at ``scale``; ``base``: start from that HF folder
    (``model.weights``, no warm start of its own) instead of the preset and the cached warm start."""
    corr = dict(cfg.correction)
    corr["startupCheck"] = {"rollouts": scale.probe_rollouts}
    spec: dict[str, Any] = {
        "correction": corr,
        "async": {"maxStaleness": cfg.max_staleness, "partialRollout": True},
        "model": {"preset": "tiny-llama", "rolloutDtype": "bfloat16"},
        "task": {"name": scale.task, "groupSize": scale.group},
        "train": {"steps": scale.steps, "promptsPerStep": scale.prompts, "minibatches": scale.minibatches,
                  "learningRate": scale.learning_rate if cfg.learning_rate is None else cfg.learning_rate,
                  "warmStartSteps": scale.warm_start_steps, "seed": seed},
        "eval": {"everySteps": scale.eval_every, "prompts": scale.eval_prompts, "mode": "temperature"},
        "rollout": {"replicas": 1},
        "checkpoint": {"everySteps": 100_000},
        "monitoring": {"enabled": False},
    }
    if cfg.old_logits is not None:
        spec["oldLogits"] = dict(cfg.old_logits)
    if base is not None:
        spec["model"] = {"weights": str(base), "rolloutDtype": "bfloat16"}
        spec["train"]["warmStartSteps"] = 0
    if cfg.model is not None:
        spec["model"].update(cfg.model)
    name = f"paper-{cfg.key()}-s{seed}"  # an RFC 1035 label, whatever the configuration's display name
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": name}, "spec": spec}


def scale_record(scale: Scale) -> dict[str, Any]:
    """What a record keeps of the scale (the seeds and the level are the report's, not the run's)."""
    return {k: v for k, v in asdict(scale).items() if k not in ("seeds", "level")}


class Runner:
    """Runs (or reads from the record folder) every (configuration, seed) of a command in one Ray session."""

    def __init__(self, scale: Scale, records: Path, *, work: Path, fresh: bool = False,
                 log: Callable[[str], None] = print, base: Path | None = None,
                 batch_probe: Callable[[Config], Any] | None = None) -> None:
        self.scale, self.records, self.work, self.fresh, self.log = scale, records, work, fresh, log
        # base: every run starts from this HF folder (job_doc); batch_probe: makes, per run (of a config), a callable that sees
        # every batch before the actor trains on it (run_job's on_batch) and whose .record() joins the record
        self.base, self.batch_probe = base, batch_probe
        self.records.mkdir(parents=True, exist_ok=True)
        self.done: set[str] = set()  # what this command ran (--fresh reruns each once)
        self._ray: Any = None

    def result(self, cfg: Config, seed: int, tag: str = "") -> dict[str, Any]:
        """The record of ``(cfg, seed)``: read if it exists at this scale, else run."""
        path = self.records / rec.name_of(cfg.key(), seed, tag)
        if path.exists() and not (self.fresh and path.name not in self.done):
            old = rec.read(path)
            if old["scale"] != scale_record(self.scale):
                diff = ", ".join(f"{k}: recorded {old['scale'].get(k)!r} vs now {v!r}"
                                 for k, v in scale_record(self.scale).items() if old["scale"].get(k) != v)
                raise SystemExit(f"{path} is a run of another scale ({diff}); pass --fresh or another --records")
            return old
        self._start_ray()
        from asyncrl.api.validation import validate_job
        from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

        rdir = self.work / "runs" / path.stem
        shutil.rmtree(rdir, ignore_errors=True)
        warm = self._warm_start(cfg)  # the starting policy is the same for every configuration and seed
        options = RunOptions(run_dir=rdir, warm_start_dir=self.warm_dir, actor_threads=1, rollout_threads=1,
                             num_cpus=2.0)
        load0, t0 = os.getloadavg()[0], time.monotonic()
        probe = self.batch_probe(cfg) if self.batch_probe is not None else None
        res = run_job(validate_job(job_doc(cfg, self.scale, seed, self.base)), options, on_batch=probe)
        if res.summary.status != "succeeded":
            raise SystemExit(f"run {path.stem} ({cfg.name}, seed {seed}) ended {res.summary.status!r}: "
                             f"{res.summary.error}; see {rdir}")
        record = rec.build(key=cfg.key(), seed=seed, tag=tag, config=cfg.spec(), scale=scale_record(self.scale),
                           summary=res.summary.to_json(), steps=res.steps, bench_s=time.monotonic() - t0,
                           load_avg=(load0, os.getloadavg()[0]), warm_start=warm)
        if probe is not None:
            record.update(probe.record())
        rec.write(self.records, record)
        self.done.add(path.name)
        shutil.rmtree(rdir, ignore_errors=True)  # the record is what is kept
        last = record["eval"]["success"][-1] if record["eval"]["success"] else float("nan")
        self.log(f"  ran {cfg.name} seed {seed}{' ' + tag if tag else ''}: {record['bench_s']:.0f} s, "
                 f"held-out success {last:.3f}, resets {record['resets']['count']}")
        return record

    @property
    def warm_dir(self) -> Path:
        """The cached warm start of this scale (:func:`warm_dir`)."""
        return warm_dir(self.work, self.scale)

    def _warm_start(self, cfg: Config) -> dict[str, Any]:
        """Make the scale's warm start if it is not cached (a one-version run at :data:`WARM_SEED` whose only
        product is the cache), and return its fingerprint."""
        from asyncrl.api.validation import validate_job
        from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

        if not (self.warm_dir / "meta.json").exists():
            self.log(f"  warm start: {self.scale.warm_start_steps} supervised steps at seed {WARM_SEED}")
            rdir = self.work / "runs" / "warm-start"
            shutil.rmtree(rdir, ignore_errors=True)
            tiny = replace(self.scale, steps=1, eval_every=1, eval_prompts=8, probe_rollouts=4)
            res = run_job(validate_job(job_doc(replace(cfg, model=None), tiny, WARM_SEED)),
                          RunOptions(run_dir=rdir, warm_start_dir=self.warm_dir, actor_threads=1, rollout_threads=1,
                                     num_cpus=2.0))
            if res.summary.status != "succeeded" or not (self.warm_dir / "meta.json").exists():
                raise SystemExit(f"the warm start run ended {res.summary.status!r}: {res.summary.error}; see {rdir}")
            shutil.rmtree(rdir, ignore_errors=True)
        return warm_fingerprint(self.warm_dir, self.scale.warm_start_steps, WARM_SEED)

    def results(self, cfgs: Iterable[Config], seeds: Sequence[int] | None = None) -> dict[str, list[dict[str, Any]]]:
        """``{config name: [record per seed]}``, interleaved: every configuration of seed 0, then of
        seed 1, ..., so the machine's load drifts over all configurations alike and an interrupted
        suite has whole seeds."""
        cfgs, seeds = list(cfgs), list(self.scale.seeds if seeds is None else seeds)
        by_seed = {s: {c.name: self.result(c, s) for c in cfgs} for s in seeds}
        return {c.name: [by_seed[s][c.name] for s in seeds] for c in cfgs}

    def _start_ray(self) -> None:
        if self._ray is None:
            from asyncrl.trainer.driver.hosts.ray_env import local_ray

            for attempt in range(1, 4):  # a loaded machine can time out Ray's node start-up; try again
                try:
                    self._ray = local_ray(num_cpus=2)
                    self._ray.__enter__()
                    return
                except Exception as exc:
                    self._ray = None
                    if attempt == 3:
                        raise
                    self.log(f"  Ray did not start ({exc}); retrying in {20 * attempt} s")
                    time.sleep(20 * attempt)

    def close(self) -> None:
        if self._ray is not None:
            self._ray.__exit__(None, None, None)
            self._ray = None


def make_warm_start(work: Path, scale: Scale) -> Path:
    """The warm start of ``scale`` cached in ``work`` (:func:`warm_dir`), made now if it is not: what every
    experiment's run starts from, for a command that runs jobs of its own (the alert evidence, its tests)."""
    runner = Runner(scale, work / "records", work=work)
    try:
        runner._warm_start(method("ewma"))  # the configuration only names the job; the warm start is the scale's
    finally:
        runner.close()
    return warm_dir(work, scale)


def warm_dir(work: Path, scale: Scale) -> Path:
    """Where a command working in ``work`` caches the warm start of ``scale`` (task, steps, :data:`WARM_SEED`)."""
    return work / f"warm-{scale.task}-{scale.warm_start_steps}-s{WARM_SEED}"


def warm_fingerprint(folder: Path, steps: int, seed: int) -> dict[str, Any]:
    """What identifies a warm start made at ``seed``: that seed, its steps and the sha256 (first 16 hex digits) of its weight files
    (the checkpoint's files but ``meta.json``, whose times differ between two identical warm starts)."""
    import hashlib

    digest = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != "meta.json"):
        digest.update(f.relative_to(folder).as_posix().encode())
        digest.update(f.read_bytes())
    return {"seed": seed, "steps": steps, "sha256": digest.hexdigest()[:16]}


# --- metrics of one run ----------------------------------------------------------------------
def eval_curve(record: Mapping[str, Any]) -> list[dict[str, float]]:
    """A record's evaluations as ``[{"version", "success", "loop_s"}]``."""
    e = record["eval"]
    return [{"version": v, "success": s, "loop_s": t} for v, s, t in zip(e["version"], e["success"], e["loop_s"], strict=True)]


def auc(curve: Sequence[Mapping[str, Any]]) -> float:
    """Area under the held-out success curve over versions, divided by the version span (trapezoid)."""
    if len(curve) < 2:
        return float(curve[0]["success"]) if curve else float("nan")
    area = sum((b["version"] - a["version"]) * (a["success"] + b["success"]) / 2 for a, b in zip(curve, curve[1:], strict=False))
    return area / (curve[-1]["version"] - curve[0]["version"])


def first_reaching(curve: Sequence[Mapping[str, Any]], level: float) -> Mapping[str, Any] | None:
    return next((c for c in curve if c["success"] >= level), None)


def eval_metrics(curve: Sequence[Mapping[str, Any]], level: float) -> dict[str, float]:
    """Final held-out success, AUC, versions and loop seconds to ``level`` (nan: never reached)."""
    hit = first_reaching(curve, level)
    return {
        "final": float(curve[-1]["success"]) if curve else float("nan"),
        "auc": auc(curve),
        "versions_to_level": float(hit["version"]) if hit else float("nan"),
        "seconds_to_level": float(hit["loop_s"]) if hit else float("nan"),
    }


def series(record: Mapping[str, Any], key: str) -> tuple[list[int], list[float]]:
    """``(versions, values)`` of one per-version curve of a record (versions without a value skipped)."""
    c = record["curves"]
    pairs = [(v, x) for v, x in zip(c["version"], c[key], strict=True) if x is not None]
    return [v for v, _ in pairs], [float(x) for _, x in pairs]


def series_mean(record: Mapping[str, Any], key: str, versions: tuple[int, int] | None = None) -> float:
    """Mean of a per-version curve, over ``versions`` (inclusive) or the whole run."""
    xs, ys = series(record, key)
    vals = [y for x, y in zip(xs, ys, strict=True) if versions is None or versions[0] <= x <= versions[1]]
    return statistics.fmean(vals) if vals else float("nan")


# --- command line ----------------------------------------------------------------------------
def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="tiny smoke-test scale (CI): one seed, a few versions")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the scale's seeds")
    p.add_argument("--out", type=Path, default=Path("runs/paper"),
                   help="working folder: warm starts, run folders, and the records of --quick runs")
    p.add_argument("--records", type=Path, default=None,
                   help=f"record folder (default: {RECORDS.relative_to(ROOT)} at full scale, <out>/quick/records with --quick)")
    p.add_argument("--fresh", action="store_true", help="rerun and overwrite the records of this command's cells")
    return p


def scale_from(args: argparse.Namespace) -> Scale:
    s = QUICK if args.quick else FULL
    if args.seeds:
        s = replace(s, seeds=tuple(args.seeds))
    return s


def out_dir(args: argparse.Namespace) -> Path:
    """Quick runs never share a working folder with full ones."""
    return args.out / ("quick" if args.quick else "full")


def records_dir(args: argparse.Namespace) -> Path:
    if args.records is not None:
        return Path(args.records)
    return out_dir(args) / "records" if args.quick else RECORDS


def runner(args: argparse.Namespace) -> Runner:
    return Runner(scale_from(args), records_dir(args), work=out_dir(args), fresh=args.fresh)


def run_experiment(args: argparse.Namespace, cfgs: Sequence[Config]) -> dict[str, list[dict[str, Any]]]:
    """Every config's records (one per seed) at the command's scale, run where missing."""
    r = runner(args)
    try:
        return r.results(cfgs)
    finally:
        r.close()


# --- condensed runs (the form bench/paper/gaps.py reads and draws; the experiments here use records) ---
STEP_KEYS = ("version", "wall_s", "step_s", "keep_ratio", "clip_or_reject_frac", "clip_low_frac", "clip_high_frac",
             "rd_min", "rd_max", "staleness_mean", "staleness_max", "ewma_reset", "success_rate", "in_bounds_ratio",
             "learning_rate", "ewma_reset_threshold", "ewma_reset_outcome", "kl_k3", "route_flip_frac",
             "route_replayed_tokens")


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


def curve_metrics(run: Mapping[str, Any], level: float) -> dict[str, float]:
    """:func:`eval_metrics` of a condensed run, and its loop seconds."""
    return {**eval_metrics(run["eval_curve"], level), "loop_s": float(run["loop_s"])}


def step_series(run: Mapping[str, Any], key: str) -> tuple[list[int], list[float]]:
    xs = [s["version"] for s in run["steps"] if key in s]
    return xs, [float(s[key]) for s in run["steps"] if key in s]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def condensed_mean_curve(runs: Sequence[Mapping[str, Any]], key: str | None = None) -> tuple[list[float], list[float], list[float]]:
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
            xs, m, s = condensed_mean_curve(runs, key)
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
