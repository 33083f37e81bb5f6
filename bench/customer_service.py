"""The customer-service task at full fidelity: RL against controls that could win, scored by pass^k (issue 39).

What runs, per seed (``--seeds``, default 0 1 2 3 4; one local Ray session for all of it; ``--arms`` picks them):

1. **warm start** (shared by every seed, made once and cached): the job's own supervised pass on the task's
   demonstrations (``train.warmStartSteps``, ``rollout/envs/demos.py``; the mix teaches the prerequisites, not the
   skill: ``customer_service.DEMO_MIX``) -- version 0 of every arm below;
2. ``rl``: the job (``job_doc``: ``examples/customer-service.yaml``'s settings, the task's BPE tokenizer with
   its chat template) through the driver's in-process loop
   (:func:`asyncrl.trainer.driver.loop.training_loop.run_job`), a checkpoint at every evaluation point;
3. the controls, each from the same warm start (``bench/customer_service_controls.py``): ``sft`` (the warm
   start's imitation continued for RL's training wall time, the old control), ``sft_success`` (successful
   demonstrations only, at a tuned rate), ``rft`` (rejection-sampling fine-tuning on the policy's own successes,
   RL's rollout budget), ``shuffled`` (RL with shuffled rewards); the supervised ones matched to RL in samples
   generated (``--match samples``, default) or in training wall time (``--match time``);
4. **evaluation** of every point, every arm alike: ``trials`` samples (T = 1) of each of the same ``tasks``
   held-out scenarios (never trained on), the same sampler seed for every arm at one point; pass^1..pass^4 from
   the per-task successes (:mod:`asyncrl.rollout.envs.pass_k`), the behaviour flags
   (``rollout/envs/cs_behaviour.py``: looked up the user, copied the id, acted on the first fitting order,
   guessed, used the right tool) and the first 4 episodes' transcripts (each capped at 1,200 characters).

It writes one JSON record per run into ``docs/results/data/customer_service/`` (``<arm>-s<seed>.json``), the
figure ``docs/results/customer-service.png`` (pass^k against the fraction of the budget, mean and 95 % t interval
over seeds) and prints the tables with the paired t tests across seeds of RL - each control at the end ("held" only
at p < 0.05). The trivial policies' table is ``bench/customer_service_baselines.py``'s.
``--pilot``: one seed at a small scale, ``--smoke``: every arm at a toy scale (the plumbing, not a result); both
write into ``runs/customer-service/`` (nothing committed is touched).

    nice -n 10 .venv/bin/python bench/customer_service.py            # hours on 2 quiet cores (5 seeds, 5 arms)
    nice -n 10 .venv/bin/python bench/customer_service.py --pilot    # one seed
    nice -n 10 .venv/bin/python bench/customer_service.py --report   # tables and figure from the records
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import customer_service_controls as controls  # noqa: E402  (the controls' arms, beside this file)
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
    max_new_tokens: int = 128  # a good episode: 81-88 tokens after the prompt (35 the agent's), room for one more call
    rft_rate: float = 3e-4  # the RFT control's supervised rate (the warm start's final rate)
    shuffle_window: int = 512  # the shuffled-reward control: rewards drawn from the last 4 steps' episodes
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)  # 3 left RL - control at p = 0.10 (pass^1 +0.060 +- 0.090)


FULL = Scale()
PILOT = Scale(warm_start_steps=120, rl_steps=16, points=2, tasks=16, trials=4, seeds=(0,))
SMOKE = Scale(warm_start_steps=4, rl_steps=2, points=1, prompts=2, group=4, tasks=4, trials=4, seeds=(0,),
              shuffle_window=8)
EVAL_SEED = 2024  # the held-out scenarios (the same for every run and point)


def job_doc(scale: Scale, seed: int, task_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The AsyncRLJob of one RL run (examples/customer-service.yaml at this scale; no in-loop evaluation: the
    points are evaluated from checkpoints, with n trials per task); ``task_args``: the environment's knobs (the
    shuffled-reward control's ``shuffle_rewards``)."""
    doc: dict[str, Any] = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": f"cs-rl-s{seed}"}, "spec": {
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
    if task_args:
        doc["spec"]["task"]["args"] = dict(task_args)
    return doc


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

    def trials(self, weights: Mapping[str, Any], seed: int, tasks: Sequence[Mapping[str, Any]] | None = None,
               trials: int | None = None) -> "Evaluation":
        """``scale.trials`` samples at T = 1 of every task (``tasks``: the fixed held-out ones unless given), sampler
        seeded by ``seed``: the ``[task][trial]`` successes, the behaviour counts, a few transcripts."""
        import torch

        from asyncrl.rollout.envs.adapter import TurnAdapter
        from asyncrl.rollout.envs.cs_behaviour import tally
        from asyncrl.rollout.envs.customer_service import CustomerService
        from asyncrl.rollout.episode import Episode
        from asyncrl.rollout.hf_engine import HFEngine

        t0 = time.monotonic()
        torch.set_num_threads(2)
        n, tok, tasks = trials or self.scale.trials, self.tokenizer, self.tasks if tasks is None else tasks
        engine = HFEngine(self.files.arch, dtype="float32", seed=seed, pad_id=tok.pad_id)
        engine.load_weights({k: torch.as_tensor(v) for k, v in weights.items()}, version=0)
        eps = [Episode.start(f"t{i}-{j}", f"t{i}", TurnAdapter("customer-service", CustomerService(4), task, tok),
                             random.Random(0)) for i, task in enumerate(tasks) for j in range(n)]
        engine.generate(eps, max_new_tokens=self.scale.max_new_tokens, temperature=float(self.spec.task.temperature),
                        partial_rollout=False, seed=seed)
        self.seconds += time.monotonic() - t0
        infos = [e.to_trajectory().info for e in eps]
        return Evaluation([[bool(eps[i * n + j].success) for j in range(n)] for i in range(len(tasks))],
                          tally(i.get("behaviour") or {} for i in infos),
                          [transcript(tok.decode(e.tokens[e.prompt_len:]), bool(e.success), str(i.get("end_reason")))
                           for e, i in zip(eps[::n][:TRANSCRIPTS], infos[::n][:TRANSCRIPTS], strict=True)])


TRANSCRIPTS, TRANSCRIPT_CHARS = 4, 1200  # per evaluation point: the first trial of the first 4 tasks, each capped


def transcript(text: str, success: bool, reason: str) -> dict[str, Any]:
    """One episode as the record keeps it: what followed the prompt (capped at :data:`TRANSCRIPT_CHARS`)."""
    if len(text) > TRANSCRIPT_CHARS:
        text = text[:TRANSCRIPT_CHARS] + f"... [{len(text) - TRANSCRIPT_CHARS} more chars]"
    return {"success": success, "end": reason, "text": text}


@dataclass(frozen=True)
class Evaluation:
    """One evaluation point: ``trials[task][trial]``, the behaviour counts (``cs_behaviour.tally``), transcripts."""

    trials: list[list[bool]]
    behaviour: dict[str, int]
    transcripts: list[dict[str, Any]]


def point(label: str, fraction: float, seconds: float, ev: Evaluation, **extra: Any) -> dict[str, Any]:
    from asyncrl.rollout.envs.cs_behaviour import rates
    from asyncrl.rollout.envs.pass_k import pass_hat_curve

    curve = pass_hat_curve(ev.trials, KS)
    return {"label": label, "fraction": round(fraction, 4), "seconds": round(seconds, 2), **extra,
            "pass_k": {str(k): round(v, 5) for k, v in curve.items()},
            "trials": [[int(x) for x in t] for t in ev.trials],
            "behaviour": rates(ev.behaviour), "transcripts": ev.transcripts}


# --- the runs -----------------------------------------------------------------------------------------
def rl_run(scale: Scale, seed: int, work: Path, ev: Evaluator, kind: str = "rl",
           task_args: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One RL run (warm-starting from the shared cache, or making it) and the pass^k of version 0 (the warm
    start) and of its checkpoints; ``kind="shuffled"`` with ``task_args`` is the shuffled-reward control."""
    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

    rdir = work / f"{kind}-s{seed}"
    shutil.rmtree(rdir, ignore_errors=True)
    t0 = time.monotonic()
    res = run_job(validate_job(job_doc(scale, seed, task_args)), RunOptions(
        run_dir=rdir, warm_start_dir=warm_dir(work, scale), actor_threads=1, rollout_threads=1, num_cpus=2.0),
        on_warm=lambda done, total, loss: print(f"  warm start {done}/{total}: loss {loss:.3f}", flush=True))
    if res.summary.status != "succeeded":
        raise SystemExit(f"{kind} seed {seed} ended {res.summary.status!r}: {res.summary.error}; see {rdir}")
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
    record = {"kind": kind, "seed": seed, "train_seconds": round(train_s, 2), "points": points,
              "samples": scale.rl_steps * scale.prompts * scale.group, "task_args": dict(task_args or {}),
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


def actor_host(scale: Scale, seed: int, work: Path) -> Any:
    """A Ray ActorHost of the job's spec with the shared warm start loaded (version 0 of every arm)."""
    import ray

    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.hosts.actor_host import ActorHost
    from asyncrl.trainer.oldlogits.precision import actor_bf16

    spec = validate_job(job_doc(scale, seed)).spec
    megatron = spec.actor.megatron.model_copy(update={"precision": "bf16" if actor_bf16(spec, "local") else "fp32"})
    spec = spec.model_copy(update={"actor": spec.actor.model_copy(update={"megatron": megatron})})  # as fleet.py
    host = ray.remote(ActorHost).options(num_cpus=2).remote(spec.model_dump(mode="json", by_alias=True), 2)
    if not ray.get(host.load_warm_start.remote(str(warm_dir(work, scale)))):
        ray.kill(host)
        raise SystemExit(f"no warm start in {warm_dir(work, scale)}: the RL run makes it")
    return host


def arm_run(kind: str, scale: Scale, seed: int, work: Path, ev: Evaluator, rl: Mapping[str, Any],
            match: "controls.Match") -> dict[str, Any]:
    """A supervised control (``sft_success`` or ``rft``, ``bench/customer_service_controls.py``) with RL's budget,
    evaluated at the same fractions of it as RL's checkpoints."""
    import ray

    budget = controls.rl_budget(rl, int(rl["samples"]), match)
    fractions = [k / scale.points for k in range(1, scale.points + 1)]
    t_bench, extra = time.monotonic(), dict[str, Any]()
    if kind == "sft_success":  # the rate first: each of the grid for a quarter of the budget, on validation tasks
        from asyncrl.rollout.envs.customer_service import ScenarioSamples

        val = ScenarioSamples().heldout(scale.tasks, controls.VALIDATION_SEED)
        quarter = controls.Budget(max(1, budget.samples // 4), budget.seconds / 4, match)
        scores: dict[float, float] = {}
        for lr in controls.SUCCESS_RATES:
            host = actor_host(scale, seed, work)
            try:
                arm = controls.Arm(kind, host, controls.success_demos(ev.tokenizer, 4, 2000 + seed), lr)
                got: list[float] = []

                def score(k: int, f: float, sec: float, out: Mapping[str, Any], got: list[float] = got) -> None:
                    got.append(statistics.fmean(x for t in ev.trials(out["weights"], 77, val, 2).trials for x in t))

                arm.run(quarter, [1.0], score)
                scores[lr] = got[0]
            finally:
                ray.kill(host)
        lr = controls.best_rate(scores)
        extra = {"rate_grid": {str(k): round(v, 4) for k, v in scores.items()}, "rate_chosen": lr}
    host = actor_host(scale, seed, work)
    points = [{**rl["points"][0], "label": f"{kind}0"}]
    points[0].pop("version", None)
    try:
        if kind == "sft_success":
            arm = controls.Arm(kind, host, controls.success_demos(ev.tokenizer, 4, 3000 + seed), lr)
        elif kind == "rft":
            arm = controls.Arm(kind, host, controls.own_successes(
                host, ev.files.arch, ev.tokenizer, prompts=scale.prompts, group=scale.group,
                max_new_tokens=scale.max_new_tokens, temperature=float(ev.spec.task.temperature), seed=4000 + seed),
                scale.rft_rate)
        else:
            raise ValueError(f"unknown arm {kind!r}; valid: sft_success, rft")

        def at_point(k: int, fraction: float, seconds: float, out: Mapping[str, Any]) -> None:
            trials = ev.trials(out["weights"], eval_seed(seed, k))
            points.append(point(f"{kind}{k}", fraction, seconds, trials, samples=out["samples"],
                                sft_steps=out["sft_steps"]))

        counters = arm.run(budget, fractions, at_point)
    finally:
        ray.kill(host)
    return {"kind": kind, "seed": seed, "match": match, "train_seconds": round(points[-1]["seconds"], 2),
            "points": points, **counters, **extra, "bench_s": round(time.monotonic() - t_bench, 1)}


def warm_dir(work: Path, scale: Scale) -> Path:
    from asyncrl.rollout.envs.cs_tokenizer import NAME

    return work / f"warm-{NAME}-{scale.warm_start_steps}-new{scale.max_new_tokens}"  # the context is in the weights


def eval_seed(seed: int, k: int) -> int:
    """The sampler seed of evaluation point ``k`` of ``seed``: RL and control share it (paired noise)."""
    return 1000 * seed + k


ARMS = ("rl", "sft", "sft_success", "rft", "shuffled")  # RL and its controls (the first is always run)


def run(scale: Scale, seeds: Sequence[int], work: Path, records: Path, arms: Sequence[str] = ARMS,
        match: "controls.Match" = "samples") -> None:
    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.hosts.ray_env import local_ray

    records.mkdir(parents=True, exist_ok=True)
    ev = Evaluator(validate_job(job_doc(scale, 0)).spec, scale)
    with local_ray(num_cpus=2):
        for seed in seeds:
            load0 = os.getloadavg()[0]
            rl = rl_run(scale, seed, work, ev)  # the first one makes the warm start
            done = [rl]
            for arm in arms:
                if arm == "sft":
                    done.append(control_run(scale, seed, work, ev, rl))
                elif arm == "shuffled":
                    done.append(rl_run(scale, seed, work, ev, "shuffled", {"shuffle_rewards": scale.shuffle_window}))
                elif arm != "rl":
                    done.append(arm_run(arm, scale, seed, work, ev, rl, match))
            meta = {"scale": {k: v for k, v in asdict(scale).items() if k != "seeds"}, "eval_seed": EVAL_SEED,
                    "load_avg": (load0, os.getloadavg()[0]), **task_facts(ev)}
            for r in done:
                write(records / f"{r['kind']}-s{seed}.json", {**r, **meta})
            print(f"seed {seed}: " + "; ".join(f"{r['kind']} pass^1 {r['points'][0]['pass_k']['1']:.3f} -> "
                                               f"{r['points'][-1]['pass_k']['1']:.3f}" for r in done)
                  + f" (evaluations so far {ev.seconds:.0f} s)", flush=True)


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
    """The records by arm (RL first), each arm's sorted by seed; every arm must have RL's seeds."""
    out: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(records.glob("*-s*.json")):
        r = json.loads(p.read_text())
        out.setdefault(r["kind"], []).append(r)
    if "rl" not in out:
        raise SystemExit(f"{records}: no RL record (rl-s<seed>.json)")
    for rs in out.values():
        rs.sort(key=lambda r: r["seed"])
    want = [r["seed"] for r in out["rl"]]
    for kind, rs in out.items():
        if [r["seed"] for r in rs] != want:
            raise SystemExit(f"{records}: RL seeds {want} and {kind} seeds {[r['seed'] for r in rs]} differ; "
                             "rerun the missing ones")
    return {"rl": out.pop("rl"), **out}


def report(runs: Mapping[str, Sequence[Mapping[str, Any]]], figure: Path | None) -> str:
    """pass^1 at each point (mean ± 95 % half-width over seeds) for every arm; pass^1..4 at the end; the paired tests
    of RL - each control at the end; the behaviour at the end."""
    kinds = list(runs)
    lines = ["| point (fraction of the budget) | " + " | ".join(f"pass^1 {k}" for k in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for i in range(len(runs["rl"][0]["points"])):
        frac = statistics.fmean(r["points"][i]["fraction"] for r in runs["rl"])
        cells = [stats.interval([r["points"][i]["pass_k"]["1"] for r in runs[kind]]).cell() for kind in kinds]
        lines.append(f"| {i} ({frac:.2f}) | " + " | ".join(cells) + " |")
    lines += ["", "| arm (end) | " + " | ".join(f"pass^{k}" for k in KS) + " |", "|---|" + "---|" * len(KS)]
    for kind in kinds:
        cells = [stats.interval([r["points"][-1]["pass_k"][str(k)] for r in runs[kind]]).cell() for k in KS]
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines.append("")
    for kind in kinds[1:]:
        for k in KS:
            test = stats.paired([r["points"][-1]["pass_k"][str(k)] for r in runs["rl"]],
                                [r["points"][-1]["pass_k"][str(k)] for r in runs[kind]])
            lines.append(f"- end, pass^{k}: RL - {kind} {test.text()}: {test.verdict(+1)}")
    flags = [f for f in runs["rl"][0]["points"][-1].get("behaviour", {})]
    if flags:
        lines += ["", "| arm: behaviour at v0 -> end (mean over seeds) | " + " | ".join(flags) + " |",
                  "|---|" + "---|" * len(flags)]
        for kind in kinds:
            cells = [f"{statistics.fmean(r['points'][0]['behaviour'][f] for r in runs[kind]):.2f} -> "
                     f"{statistics.fmean(r['points'][-1]['behaviour'][f] for r in runs[kind]):.2f}" for f in flags]
            lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    if figure is not None:
        draw(runs, figure)
    return "\n".join(lines)


def draw(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(KS), figsize=(3.2 * len(KS), 3.0), sharey=True)
    for ax, k in zip(axes, KS, strict=True):
        for kind, rs in runs.items():
            name = kind
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
    p.add_argument("--smoke", action="store_true", help="every arm at a toy scale (the plumbing), into --out/smoke")
    p.add_argument("--seeds", type=int, nargs="+", default=None, help="override the scale's seeds")
    p.add_argument("--out", type=Path, default=Path("runs/customer-service"), help="working folder (warm start, runs)")
    p.add_argument("--records", type=Path, default=None, help=f"record folder (default {RECORDS.relative_to(ROOT)})")
    p.add_argument("--report", action="store_true", help="only the table and the figure, from the records")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="RL and which controls")
    p.add_argument("--match", choices=("samples", "time"), default="samples",
                   help="the supervised controls' budget: RL's generated samples, or its training wall time")
    args = p.parse_args()
    scale = SMOKE if args.smoke else PILOT if args.pilot else FULL
    if args.seeds:
        scale = replace(scale, seeds=tuple(args.seeds))
    trial = args.pilot or args.smoke
    work = args.out / ("smoke" if args.smoke else "pilot" if args.pilot else "full")
    records = args.records or (work / "records" if trial else RECORDS)
    t0 = time.monotonic()
    if not args.report:
        run(scale, scale.seeds, work, records, args.arms, args.match)
    print(report(load(records), None if trial else FIGURE))
    print(f"({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
