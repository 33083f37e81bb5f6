"""Benchmark: asynchronous (maxStaleness 2) vs synchronous (maxStaleness 0) training, same work.

Usage::

    .venv/bin/python bench/async_speedup.py [--steps 60] [--prompts 8] [--group 8] [--replicas 1] [--partial-rollout]
        [--eval-every 10] [--eval-prompts 128] [--reference current] [--async-references ewma,current]

Both runs train the same number of trajectories (``steps x prompts x group``) from the same
cached warm start, with the same driver code, in one local Ray session; only
``async.maxStaleness`` differs. Timed is the training loop (after start-up and warm start).

The configuration is chosen so that rollout and training take comparable time and each gets its
own core: one rollout worker (1 torch thread) and the actor (1 torch thread) on the 2 cores. Then
the synchronous loop alternates ``T_rollout + T_train`` per step while the asynchronous one
overlaps them, and the best possible speed-up is

    ideal = (T_rollout + T_train) / max(T_rollout, T_train)

with ``T_rollout`` the trainer's mean wait per step and ``T_train`` the mean step + weight-sync
time, both measured in the synchronous run. Idle ratios are defined as verl
defines them: trainer idle = waiting for a batch / loop time; rollout idle = worker time without a
generate call / worker time.

The asynchronous job runs once per ``--async-references`` entry: ``ewma`` (the quickstart's
correction) and ``current`` (no staleness correction: ``r_s = 1``, the clip is inert and two-version-old
tokens are trained as if fresh -- the configuration that made async look worse than sync before the
evaluation existed: training success 0.56 against 0.79).

Learning is compared on the held-out evaluation (``spec.eval``, the same prompts and sampling seed
in both runs, every ``--eval-every`` versions): success **at equal versions** (what a version of
stale data is worth) and **at equal wall-clock** (what the overlap buys), the latter at quarters of
the asynchronous run's loop time, each run's newest evaluation by then (evaluation time excluded).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.hosts.ray_env import local_ray
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job


def _spin(n: int = 3_000_000) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def parallel_capacity() -> float:
    """How much two CPU-bound processes gain from running at once on this machine right now.

    2.0 on two idle cores; near 1.0 when other tenants keep the cores busy. Overlapping rollout
    and training cannot beat this, so it is printed next to the speed-up.
    """
    import multiprocessing as mp

    t0 = time.perf_counter()
    _spin()
    _spin()
    sequential = time.perf_counter() - t0
    t0 = time.perf_counter()
    procs = [mp.Process(target=_spin) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return sequential / (time.perf_counter() - t0)


def job(max_staleness: int, args: argparse.Namespace, reference: str) -> dict:
    return {
        "apiVersion": "asyncrl.io/v1alpha1",
        "kind": "AsyncRLJob",
        "metadata": {"name": f"bench-w{max_staleness}-{reference.lower()}"},
        "spec": {
            "correction": {"reference": reference},
            "async": {"maxStaleness": max_staleness, "partialRollout": args.partial_rollout},
            "task": {"name": args.task, "groupSize": args.group},
            "train": {"steps": args.steps, "promptsPerStep": args.prompts, "learningRate": 3e-4,
                      "warmStartSteps": args.warm_start_steps, "seed": 0},
            "eval": {"everySteps": args.eval_every, "prompts": args.eval_prompts, "mode": "temperature"},
            "rollout": {"replicas": args.replicas},
            "checkpoint": {"everySteps": 10_000},
            "monitoring": {"enabled": False},
        },
    }


def run(max_staleness: int, args: argparse.Namespace, root: Path, warm: Path, reference: str) -> dict:
    options = RunOptions(run_dir=root / f"w{max_staleness}-{reference}", warm_start_dir=warm,
                         actor_threads=1, rollout_threads=1, num_cpus=2.0)
    result = run_job(validate_job(job(max_staleness, args, reference)), options)
    summary = result.summary.to_json()  # summary.json's form
    loop = summary["loop"]
    n = len(result.steps)
    return {
        "max_staleness": max_staleness, "reference": reference,
        "loop_s": loop["wall_s"],
        "trajectories": loop["trajectories_trained"],
        "trainer_idle_ratio": loop["trainer_idle_s"] / loop["wall_s"],
        "rollout_idle_ratio": loop["rollout_idle_s"] / max(loop["rollout_worker_s"], 1e-9),
        "t_rollout": loop["trainer_idle_s"] / n,  # sync: the trainer waits exactly for rollout
        "t_train": loop["train_s"] / n,
        "dropped_groups": summary["buffer"]["groups_dropped_stale"],
        "partial_frac": sum(r.get("partial_frac", 0.0) for r in result.steps) / n,
        "final_success": summary["final_success"],
        "eval_curve": summary["eval_curve"],
    }


def success_at_loop_seconds(curve: Sequence[Mapping[str, Any]], seconds: float) -> Mapping[str, Any] | None:
    """The newest entry of an ``eval_curve`` (summary.json's, with ``loop_s``) evaluated by ``seconds`` of
    training (None when even the first came later)."""
    done = [c for c in curve if c["loop_s"] <= seconds + 1e-9]
    return done[-1] if done else None


def equal_versions(sync: dict, asyn: dict) -> list[tuple[int, float, float]]:
    """(version, sync eval success, async eval success) at every version both evaluated."""
    a = {c["version"]: c["success"] for c in asyn["eval_curve"]}
    return [(c["version"], c["success"], a[c["version"]]) for c in sync["eval_curve"] if c["version"] in a]


def equal_wall_clock(sync: dict, asyn: dict, points: int = 4) -> list[dict]:
    """At ``points`` equal fractions of the async run's training time (its last evaluation's
    ``loop_s``, the curves' own clock): each run's newest evaluation by then."""
    span = asyn["eval_curve"][-1]["loop_s"]
    rows = []
    for k in range(1, points + 1):
        t = span * k / points
        s, a = success_at_loop_seconds(sync["eval_curve"], t), success_at_loop_seconds(asyn["eval_curve"], t)
        rows.append({"loop_s": round(t, 2),
                     "sync_version": s and s["version"], "sync_success": s and s["success"],
                     "async_version": a and a["version"], "async_success": a and a["success"]})
    return rows


def show(version: int | None, success: float | None) -> str:
    """One run's newest evaluation at a wall-clock point ("--": none yet)."""
    return "  --  " if version is None else f"{success:.3f} (version {version})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--prompts", type=int, default=8, help="GRPO groups per step")
    p.add_argument("--group", type=int, default=8, help="samples per prompt")
    p.add_argument("--replicas", type=int, default=1, help="rollout workers")
    p.add_argument("--task", default="calculator")
    p.add_argument("--reference", default="current",
                   help="correction.reference of the synchronous run (at W=0 current is plain on-policy PPO)")
    p.add_argument("--async-references", default="ewma,current",
                   help="one asynchronous run per correction.reference, comma-separated (ewma: the quickstart's; "
                        "current: no staleness correction, r_s = 1)")
    p.add_argument("--warm-start-steps", type=int, default=100)
    p.add_argument("--partial-rollout", action=argparse.BooleanOptionalAction, default=False,
                   help="async.partialRollout (an update mid-generation re-prefills every in-flight episode)")
    p.add_argument("--eval-every", type=int, default=10, help="evaluate every this many versions")
    p.add_argument("--eval-prompts", type=int, default=128, help="held-out prompts per evaluation")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    args = p.parse_args()

    references = [r.strip() for r in args.async_references.split(",") if r.strip()]
    if not references:
        p.error("--async-references: name at least one correction.reference, e.g. ewma")
    root = Path(tempfile.mkdtemp(prefix="asyncrl-bench-"))
    capacity_before = parallel_capacity()
    try:
        with local_ray(num_cpus=2):
            warm = root / "warm_start"
            t0 = time.monotonic()
            sync = run(0, args, root, warm, args.reference)  # also fills the warm-start cache all runs use
            asyncs = [run(2, args, root, warm, reference) for reference in references]
            total = time.monotonic() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    capacity_after = parallel_capacity()
    t_r, t_t = sync["t_rollout"], sync["t_train"]
    out = {
        "config": {**vars(args), "cores": os.cpu_count(), "actor_threads": 1, "rollout_threads": 1},
        "sync": sync,
        "async": [{**a, "speedup": sync["loop_s"] / a["loop_s"], "eval_equal_versions": equal_versions(sync, a),
                   "eval_equal_wall_clock": equal_wall_clock(sync, a)} for a in asyncs],
        "ideal": (t_r + t_t) / max(t_r, t_t),
        "bench_wall_s": round(total, 1),
        "parallel_capacity": [round(capacity_before, 2), round(capacity_after, 2)],
    }
    if args.json:
        print(json.dumps(out))
        return 0
    c = out["config"]
    print(f"config: task {c['task']}, {c['steps']} steps x {c['prompts']} prompts x {c['group']} samples "
          f"= {sync['trajectories']} trajectories per run, {c['replicas']} rollout worker(s) x 1 thread, "
          f"actor 1 thread, {c['cores']} cores")
    runs = [(f"sync  (W 0, {sync['reference']})", sync)] + [(f"async (W 2, {a['reference']})", a) for a in out["async"]]
    for name, r in runs:
        print(f"{name:<24}: loop {r['loop_s']:.2f} s, trainer idle {r['trainer_idle_ratio']:.2f}, "
              f"rollout idle {r['rollout_idle_ratio']:.2f}, partial {r['partial_frac']:.2f}, "
              f"dropped groups {r['dropped_groups']}, training success (last 10 steps) {r['final_success']}")
    print(f"T_rollout {t_r:.3f} s/step, T_train {t_t:.3f} s/step (measured in the sync run); "
          f"ideal speedup (T_rollout + T_train) / max: {out['ideal']:.2f}x")
    for a in out["async"]:
        print(f"speedup sync/async ({a['reference']}) wall: {a['speedup']:.2f}x")
    print("held-out eval success at equal versions (same prompts and seed):")
    versions = [v for v, _, _ in out["async"][0]["eval_equal_versions"]]
    print(f"  {'version':<24}" + " ".join(f"{v:>6d}" for v in versions))
    print(f"  {runs[0][0]:<24}" + " ".join(f"{x:6.3f}" for _, x, _ in out["async"][0]["eval_equal_versions"]))
    for name, a in runs[1:]:
        print(f"  {name:<24}" + " ".join(f"{x:6.3f}" for _, _, x in a["eval_equal_versions"]))
    for a in out["async"]:
        print(f"held-out eval success at equal wall-clock, sync vs async ({a['reference']}) "
              f"(training loop seconds, evaluations excluded):")
        for row in a["eval_equal_wall_clock"]:
            print(f"  at {row['loop_s']:7.2f} s: sync {show(row['sync_version'], row['sync_success'])}, "
                  f"async {show(row['async_version'], row['async_success'])}")
    print(f"parallel capacity of the machine (2 CPU-bound processes at once vs one after the other), "
          f"before / after: {capacity_before:.2f}x / {capacity_after:.2f}x -- the overlap cannot beat it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
