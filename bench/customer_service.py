"""The customer-service task at full fidelity: RL against continued supervised training, scored by pass^k.

What runs, per seed (``--seeds``, default 0 1 2 3 4; one local Ray session for all of it):

1. **warm start** (shared by every seed, made once and cached): the job's own supervised pass on the task's
   demonstrations (``train.warmStartSteps``, ``rollout/envs/demos.py``) -- version 0 of every run below;
2. **RL**: the job (``job_doc``: ``examples/customer-service.yaml``'s settings, the task's BPE tokenizer with
   its chat template) through the driver's in-process loop
   (:func:`asyncrl.trainer.driver.loop.training_loop.run_job`), a checkpoint at every evaluation point;
3. **control**: the warm start continued, supervised, for the same training wall time as that seed's RL run
   (the actor's own warm-start step, :meth:`ActorHost.warm_start`, in a Ray actor of the same spec: the same
   demonstrations generator, seeded by the seed, at the warm start's final learning rate ``0.1 x 3e-3``);
   its weights are taken at the same fractions of that time as the RL run's checkpoints;
4. **evaluation** of every point, RL and control alike: ``trials`` samples (T = 1) of each of the same
   ``tasks`` held-out scenarios (never trained on), the same sampler seed for RL and control at one point;
   pass^1..pass^4 from the per-task successes (:mod:`asyncrl.rollout.envs.pass_k`).

It writes one JSON record per run into ``docs/results/data/customer_service/`` (``rl-s<seed>.json``,
``sft-s<seed>.json``: every point's ``trials`` table and pass^k), the figure ``docs/results/customer-service.png``
(pass^k against the fraction of the run's training time, RL and control, mean and 95 % t interval over seeds)
and prints the table with the paired t test across seeds of RL - control at the end ("held" only at p < 0.05).
``--pilot``: one seed at a small scale, into ``runs/customer-service/pilot`` (nothing committed is touched).

    nice -n 10 .venv/bin/python bench/customer_service.py            # ~20 min on 2 quiet cores (5 seeds)
    nice -n 10 .venv/bin/python bench/customer_service.py --pilot    # ~5 min
    nice -n 10 .venv/bin/python bench/customer_service.py --report   # table and figure from the records
"""

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "paper"))

import stats  # noqa: E402  (bench/paper/stats.py: the 95 % t interval and the paired t test)

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "results" / "data" / "customer_service"
FIGURE = ROOT / "docs" / "results" / "customer-service.png"
KS = (1, 2, 3, 4)
BIG = 10**9  # the control's schedule length: every step at warm_start_lr's final value (0.1 x peak)


@dataclass(frozen=True)
class Scale:
    """How big the experiment is."""

    warm_start_steps: int = 300  # batches of 128 demonstrations (measured: loss 0.177, on the plateau; 500: 0.173)
    rl_steps: int = 48  # policy versions per RL run
    points: int = 4  # evaluation points after version 0 (every rl_steps / points versions)
    prompts: int = 8  # GRPO groups per step
    group: int = 16  # samples per prompt
    learning_rate: float = 1e-3  # RL (examples/customer-service.yaml)
    tasks: int = 32  # held-out scenarios per evaluation
    trials: int = 8  # samples of each (pass^k needs n >= k)
    max_new_tokens: int = 96
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # 3 left RL - control at p = 0.10 (pass^1 +0.060 +- 0.090)


FULL = Scale()
PILOT = Scale(warm_start_steps=120, rl_steps=16, points=2, tasks=16, trials=4, seeds=(0,))
EVAL_SEED = 2024  # the held-out scenarios (the same for every run and point)


def job_doc(scale: Scale, seed: int) -> dict[str, Any]:
    """The AsyncRLJob of one RL run (examples/customer-service.yaml at this scale; no in-loop evaluation: the
    points are evaluated from checkpoints, with n trials per task)."""
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": f"cs-rl-s{seed}"}, "spec": {
        "correction": {"reference": "ewma", "mask": {"mode": "mask", "level": "token", "bounds": {"low": 0.5, "high": 2.0}},
                       "clip": {"low": 0.2, "high": 0.2}, "startupCheck": {"enabled": False}},
        "async": {"maxStaleness": 2, "partialRollout": True},
        "model": {"preset": "tiny-llama", "rolloutDtype": "bfloat16"},
        "task": {"name": "customer-service", "maxNewTokens": scale.max_new_tokens, "maxToolCalls": 4,
                 "toolCallFormat": "hermes", "envTimeoutSeconds": 10, "groupSize": scale.group},
        "train": {"steps": scale.rl_steps, "promptsPerStep": scale.prompts, "learningRate": scale.learning_rate,
                  "warmStartSteps": scale.warm_start_steps, "seed": seed},
        "rollout": {"replicas": 1},
        "checkpoint": {"everySteps": scale.rl_steps // scale.points, "keep": 100},
        "monitoring": {"enabled": False},
    }}


# --- evaluation ---------------------------------------------------------------------------------------
@dataclass
class Evaluator:
    """pass^k of a policy's weights on the fixed held-out tasks (the rollout engine, in this process)."""

    spec: Any  # AsyncRLJobSpec
    scale: Scale

    def __post_init__(self) -> None:
        from asyncrl.rollout.envs.customer_service import ScenarioSamples
        from asyncrl.trainer.export import model_files

        self.files = model_files(self.spec)  # the actor's architecture and the task's tokenizer
        self.tokenizer = self.files.tokenizer
        self.tasks = ScenarioSamples().heldout(self.scale.tasks, EVAL_SEED)
        self.seconds = 0.0

    def checkpoint_weights(self, folder: Path) -> dict[str, Any]:
        from asyncrl.trainer.export import checkpoint_weights

        return checkpoint_weights(folder, self.files)[0]

    def trials(self, weights: Mapping[str, Any], seed: int) -> list[list[bool]]:
        """``[task][trial]`` successes: ``scale.trials`` samples at T = 1 of every task, sampler seeded by ``seed``."""
        import torch

        from asyncrl.rollout.envs.adapter import TurnAdapter
        from asyncrl.rollout.envs.customer_service import CustomerService
        from asyncrl.rollout.episode import Episode
        from asyncrl.rollout.hf_engine import HFEngine

        t0 = time.monotonic()
        torch.set_num_threads(2)
        n, tok = self.scale.trials, self.tokenizer
        engine = HFEngine(self.files.arch, dtype="float32", seed=seed, pad_id=tok.pad_id)
        engine.load_weights({k: torch.as_tensor(v) for k, v in weights.items()}, version=0)
        eps = [Episode.start(f"t{i}-{j}", f"t{i}", TurnAdapter("customer-service", CustomerService(4), task, tok),
                             random.Random(0)) for i, task in enumerate(self.tasks) for j in range(n)]
        engine.generate(eps, max_new_tokens=self.scale.max_new_tokens, temperature=float(self.spec.task.temperature),
                        partial_rollout=False, seed=seed)
        self.seconds += time.monotonic() - t0
        return [[bool(eps[i * n + j].success) for j in range(n)] for i in range(len(self.tasks))]


def point(label: str, fraction: float, seconds: float, trials: list[list[bool]], **extra: Any) -> dict[str, Any]:
    from asyncrl.rollout.envs.pass_k import pass_hat_curve

    curve = pass_hat_curve(trials, KS)
    return {"label": label, "fraction": round(fraction, 4), "seconds": round(seconds, 2), **extra,
            "pass_k": {str(k): round(v, 5) for k, v in curve.items()}, "trials": [[int(x) for x in t] for t in trials]}


# --- the runs -----------------------------------------------------------------------------------------
def rl_run(scale: Scale, seed: int, work: Path, ev: Evaluator) -> dict[str, Any]:
    """One RL run (warm-starting from the shared cache, or making it) and the pass^k of version 0 (the warm
    start) and of its checkpoints."""
    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

    rdir = work / f"rl-s{seed}"
    shutil.rmtree(rdir, ignore_errors=True)
    t0 = time.monotonic()
    res = run_job(validate_job(job_doc(scale, seed)), RunOptions(
        run_dir=rdir, warm_start_dir=warm_dir(work, scale), actor_threads=1, rollout_threads=1, num_cpus=2.0),
        on_warm=lambda done, total, loss: print(f"  warm start {done}/{total}: loss {loss:.3f}", flush=True))
    if res.summary.status != "succeeded":
        raise SystemExit(f"RL seed {seed} ended {res.summary.status!r}: {res.summary.error}; see {rdir}")
    steps = [s for s in res.steps if "version" in s]
    first = steps[0]["wall_s"] - steps[0]["step_s"]  # the loop's first step began about here
    train_s = steps[-1]["wall_s"] - first
    every = scale.rl_steps // scale.points
    v0 = ev.trials(ev.checkpoint_weights(warm_dir(work, scale)), eval_seed(seed, 0))
    points = [point("v0", 0.0, 0.0, v0, version=0)]
    for k in range(1, scale.points + 1):
        v = k * every
        rec = next(s for s in steps if s["version"] == v)
        trials = ev.trials(ev.checkpoint_weights(rdir / "checkpoints" / f"step-{v:06d}"), eval_seed(seed, k))
        points.append(point(f"v{v}", (rec["wall_s"] - first) / train_s, rec["wall_s"] - first, trials, version=v))
    summary = res.summary.to_json()
    record = {"kind": "rl", "seed": seed, "train_seconds": round(train_s, 2), "points": points,
              "batch_success": [s.get("success_rate") for s in steps],
              "warm_start": summary.get("warm_start"), "bench_s": round(time.monotonic() - t0, 1)}
    shutil.rmtree(rdir, ignore_errors=True)  # the record is what is kept
    return record


def control_run(scale: Scale, seed: int, work: Path, ev: Evaluator, rl: Mapping[str, Any]) -> dict[str, Any]:
    """The warm start continued (supervised) for the RL run's training time; pass^k at the same time fractions."""
    import ray

    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.hosts.actor_host import ActorHost
    from asyncrl.trainer.oldlogits.precision import actor_bf16

    t_bench = time.monotonic()
    doc = job_doc(scale, 1000 + seed)  # its own demonstrations stream (the warm start drew from seed 0's)
    spec = validate_job(doc).spec
    megatron = spec.actor.megatron.model_copy(update={"precision": "bf16" if actor_bf16(spec, "local") else "fp32"})
    spec = spec.model_copy(update={"actor": spec.actor.model_copy(update={"megatron": megatron})})  # as fleet.py
    host = ray.remote(ActorHost).options(num_cpus=2).remote(spec.model_dump(mode="json", by_alias=True), 2)
    try:
        if not ray.get(host.load_warm_start.remote(str(warm_dir(work, scale)))):
            raise SystemExit(f"no warm start in {warm_dir(work, scale)}: the RL run makes it")
        total = float(rl["train_seconds"])
        due = [float(p["fraction"]) * total for p in rl["points"][1:]]
        v0 = rl["points"][0]  # the warm start, evaluated with the same sampler seed
        points, steps, losses = [{**v0, "label": "sft0", "sft_steps": 0}], 0, []
        points[0].pop("version", None)
        t0 = time.monotonic()
        losses += ray.get(host.warm_start.remote(0, 1, BIG, 2))  # seeds its demonstration generator; lr ~ 0
        steps += 1
        for k, at in enumerate(due, start=1):
            while time.monotonic() - t0 < at:
                losses += ray.get(host.warm_start.remote(BIG - 1, BIG, BIG, 2))
                steps += 1
            held = time.monotonic() - t0
            weights = ray.get(host.weights.remote())
            pause = time.monotonic()
            trials = ev.trials(weights, eval_seed(seed, k))
            t0 += time.monotonic() - pause  # the evaluation is not training time
            points.append(point(f"sft{steps}", held / total, held, trials, sft_steps=steps))
    finally:
        ray.kill(host)
    return {"kind": "sft", "seed": seed, "train_seconds": round(points[-1]["seconds"], 2), "points": points,
            "sft_steps": steps, "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
            "learning_rate": 0.1 * 3e-3, "bench_s": round(time.monotonic() - t_bench, 1)}


def warm_dir(work: Path, scale: Scale) -> Path:
    from asyncrl.rollout.envs.cs_tokenizer import NAME

    return work / f"warm-{NAME}-{scale.warm_start_steps}"


def eval_seed(seed: int, k: int) -> int:
    """The sampler seed of evaluation point ``k`` of ``seed``: RL and control share it (paired noise)."""
    return 1000 * seed + k


def run(scale: Scale, seeds: Sequence[int], work: Path, records: Path) -> None:
    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.hosts.ray_env import local_ray

    records.mkdir(parents=True, exist_ok=True)
    ev = Evaluator(validate_job(job_doc(scale, 0)).spec, scale)
    with local_ray(num_cpus=2):
        for seed in seeds:
            load0 = os.getloadavg()[0]
            rl = rl_run(scale, seed, work, ev)  # the first one makes the warm start
            sft = control_run(scale, seed, work, ev, rl)
            meta = {"scale": {k: v for k, v in asdict(scale).items() if k != "seeds"}, "eval_seed": EVAL_SEED,
                    "load_avg": (load0, os.getloadavg()[0]), **task_facts(ev)}
            for r in (rl, sft):
                write(records / f"{r['kind']}-s{seed}.json", {**r, **meta})
            print(f"seed {seed}: RL {rl['train_seconds']:.0f} s, pass^1 {rl['points'][0]['pass_k']['1']:.3f} -> "
                  f"{rl['points'][-1]['pass_k']['1']:.3f}; control {sft['sft_steps']} SFT steps, pass^1 -> "
                  f"{sft['points'][-1]['pass_k']['1']:.3f} (evaluations so far {ev.seconds:.0f} s)", flush=True)


def task_facts(ev: Evaluator) -> dict[str, Any]:
    """The tokenizer, the prompt length in tokens, and the status shortcut's success on the held-out tasks."""
    from asyncrl.rollout.envs.adapter import TurnAdapter
    from asyncrl.rollout.envs.customer_service import CustomerService, Scenario

    lens = [len(TurnAdapter("customer-service", CustomerService(4), t, ev.tokenizer).reset()) for t in ev.tasks]
    fit = [1 / len(Scenario.from_sample(t).fitting) for t in ev.tasks]
    return {"tokenizer": ev.tokenizer.name, "vocab_size": ev.tokenizer.vocab_size,
            "prompt_tokens": {"min": min(lens), "max": max(lens), "mean": round(statistics.fmean(lens), 1)},
            "first_fit_expected": round(statistics.fmean(fit), 4)}


def write(path: Path, record: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    tmp.replace(path)


# --- the report ---------------------------------------------------------------------------------------
def load(records: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {"rl": [], "sft": []}
    for p in sorted(records.glob("*-s*.json")):
        r = json.loads(p.read_text())
        out[r["kind"]].append(r)
    seeds = [sorted(r["seed"] for r in rs) for rs in out.values()]
    if seeds[0] != seeds[1]:
        raise SystemExit(f"{records}: RL seeds {seeds[0]} and control seeds {seeds[1]} differ; rerun the missing ones")
    for rs in out.values():
        rs.sort(key=lambda r: r["seed"])
    return out


def report(runs: Mapping[str, Sequence[Mapping[str, Any]]], figure: Path | None) -> str:
    """The markdown table (mean ± 95 % half-width over seeds at each point) and the paired tests at the end."""
    lines = ["| point (fraction of training time) | " + " | ".join(f"pass^{k} RL | pass^{k} control" for k in KS) + " |",
             "|---|" + "---|---|" * len(KS)]
    n_points = len(runs["rl"][0]["points"])
    for i in range(n_points):
        frac = statistics.fmean(r["points"][i]["fraction"] for r in runs["rl"])
        cells = []
        for k in KS:
            for kind in ("rl", "sft"):
                cells.append(stats.interval([r["points"][i]["pass_k"][str(k)] for r in runs[kind]]).cell())
        lines.append(f"| {i} ({frac:.2f}) | " + " | ".join(cells) + " |")
    lines.append("")
    for k in KS:
        test = stats.paired([r["points"][-1]["pass_k"][str(k)] for r in runs["rl"]],
                            [r["points"][-1]["pass_k"][str(k)] for r in runs["sft"]])
        lines.append(f"- end, pass^{k}: RL - control {test.text()}: {test.verdict(+1)}")
    if figure is not None:
        draw(runs, figure)
    return "\n".join(lines)


def draw(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KS), figsize=(3.2 * len(KS), 3.0), sharey=True)
    for ax, k in zip(axes, KS, strict=True):
        for kind, name in (("rl", "RL"), ("sft", "SFT control")):
            rs = runs[kind]
            xs = [statistics.fmean(r["points"][i]["fraction"] for r in rs) for i in range(len(rs[0]["points"]))]
            iv = [stats.interval([r["points"][i]["pass_k"][str(k)] for r in rs]) for i in range(len(xs))]
            m = [v.mean for v in iv]
            (line,) = ax.plot(xs, m, marker="o", ms=3, lw=1.4, label=name)
            ax.fill_between(xs, [v.mean - v.half_width for v in iv], [v.mean + v.half_width for v in iv],
                            color=line.get_color(), alpha=0.15, lw=0)
        ax.set_title(f"pass^{k}", fontsize=9)
        ax.set_xlabel("fraction of training wall time", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out ({len(runs['rl'])} seeds, mean, 95% CI)", fontsize=8)
    axes[-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pilot", action="store_true", help="one seed at a small scale, into --out/pilot")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the scale's seeds")
    p.add_argument("--out", type=Path, default=Path("runs/customer-service"), help="working folder (warm start, runs)")
    p.add_argument("--records", type=Path, default=None, help=f"record folder (default {RECORDS.relative_to(ROOT)})")
    p.add_argument("--report", action="store_true", help="only the table and the figure, from the records")
    args = p.parse_args()
    scale = PILOT if args.pilot else FULL
    if args.seeds:
        scale = replace(scale, seeds=tuple(args.seeds))
    work = args.out / ("pilot" if args.pilot else "full")
    records = args.records or (work / "records" if args.pilot else RECORDS)
    t0 = time.monotonic()
    if not args.report:
        run(scale, scale.seeds, work, records)
    print(report(load(records), None if args.pilot else FIGURE))
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
