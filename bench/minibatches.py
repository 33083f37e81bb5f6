"""Benchmark: the quickstart at ``train.minibatches`` 1 vs 4, side by side in one run.

Usage::

    .venv/bin/python bench/minibatches.py [--minibatches 1 4] [--steps 120] [--epochs 1] [--json]

Runs the embedded default job (``asyncrl run`` with no file) once per ``train.minibatches`` value,
everything else as the quickstart has it (task, reference, W, batch, learning rate, evaluation
every ``spec.eval.everySteps`` versions on the same held-out prompts and sampling seed), in one local
Ray session and from one shared warm start (the first run pays for it; it is not in the loop time).

One policy version is one consumed rollout batch, whatever the minibatch count
(``docs/update-step.md``): with 4 minibatches a version makes 4 optimizer updates on quarters of
the batch. Printed per setting: loop seconds (evaluations excluded) and seconds per version, the
held-out success at every evaluated version, the first version and loop second where success
reached ``--target``, and each run's success at the faster run's final loop second (equal
wall-clock). Timings are for this machine at this moment: the parallel capacity is printed with
them (2.0 = two idle cores).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from async_speedup import (  # same folder (bench/ is sys.path[0] when run as a script)
    parallel_capacity,
    success_at_loop_seconds,
)

from asyncrl.api.validation import quickstart_doc, validate_job
from asyncrl.trainer.driver.hosts.ray_env import local_ray
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job


def job(minibatches: int, args: argparse.Namespace) -> dict[str, Any]:
    doc = quickstart_doc()
    doc["metadata"] = {"name": f"quickstart-mb{minibatches}"}
    spec = doc["spec"]
    spec["train"] = {**spec["train"], "minibatches": minibatches, "epochs": args.epochs, "seed": args.seed}
    if args.steps:
        spec["train"]["steps"] = args.steps
    spec["checkpoint"] = {"everySteps": 100_000}  # no checkpoint time in the loop
    spec["monitoring"] = {"enabled": False}
    return doc


def first_reaching(curve: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation whose success is at least ``target`` (None: never)."""
    return next((c for c in curve if c["success"] >= target), None)


def run(minibatches: int, args: argparse.Namespace, root: Path, warm: Path) -> dict[str, Any]:
    options = RunOptions(run_dir=root / f"mb{minibatches}", warm_start_dir=warm)
    result = run_job(validate_job(job(minibatches, args)), options)
    summary = result.summary.to_json()  # summary.json's form
    loop, curve = summary["loop"], summary["eval_curve"]
    loop_s = loop["wall_s"] - loop["eval_s"]
    versions = summary["final_version"] or 0
    reached = first_reaching(curve, args.target)
    return {
        "minibatches": minibatches, "epochs": args.epochs, "versions": versions,
        "updates": sum(int(r.get("updates_applied", 0)) for r in result.steps),
        "loop_s": round(loop_s, 2), "s_per_version": round(loop_s / max(1, versions), 3),
        "eval_curve": curve,
        "target_version": reached and reached["version"], "target_loop_s": reached and reached["loop_s"],
        "training_success_last10": summary["final_success"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minibatches", type=int, nargs="+", default=[1, 4], help="train.minibatches values")
    p.add_argument("--epochs", type=int, default=1, help="train.epochs of every run")
    p.add_argument("--steps", type=int, default=0, help="versions per run (0: the quickstart's train.steps)")
    p.add_argument("--seed", type=int, default=0, help="train.seed of every run")
    p.add_argument("--target", type=float, default=0.8, help="held-out success to report the time to")
    p.add_argument("--json", action="store_true", help="print one JSON object only")
    args = p.parse_args()

    root = Path(tempfile.mkdtemp(prefix="asyncrl-bench-mb-"))
    capacity_before = parallel_capacity()
    try:
        with local_ray(num_cpus=os.cpu_count() or 2):
            t0 = time.monotonic()
            runs = [run(k, args, root, root / "warm_start") for k in args.minibatches]
            total = time.monotonic() - t0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    capacity_after = parallel_capacity()
    fastest = min(r["eval_curve"][-1]["loop_s"] for r in runs)  # on the curves' own clock (last evaluation)
    for r in runs:
        at = success_at_loop_seconds(r["eval_curve"], fastest)
        r["at_equal_wall_clock"] = {"loop_s": fastest, "version": at and at["version"], "success": at and at["success"]}
    out = {"config": {**vars(args), "cores": os.cpu_count()}, "runs": runs, "bench_wall_s": round(total, 1),
           "parallel_capacity": [round(capacity_before, 2), round(capacity_after, 2)]}
    if args.json:
        print(json.dumps(out))
        return 0

    versions = sorted({c["version"] for c in runs[0]["eval_curve"]}.intersection(
        *({c["version"] for c in r["eval_curve"]} for r in runs[1:])))
    print(f"the quickstart (embedded default job) at train.minibatches {args.minibatches}, epochs {args.epochs}, "
          f"seed {args.seed}, {os.cpu_count()} cores; held-out eval success (temperature sampling, same prompts)")
    print(f"{'minibatches':>11} {'updates':>7} {'loop s':>7} {'s/version':>9} | "
          + " ".join(f"v{v:<5d}" for v in versions)
          + f" | first >= {args.target:.0%} (version, loop s) | at {fastest:.1f} s (equal wall-clock)")
    for r in runs:
        by_version = {c["version"]: c["success"] for c in r["eval_curve"]}
        reached = ("never" if r["target_version"] is None
                   else f"v{r['target_version']} at {r['target_loop_s']:.1f} s")
        eq = r["at_equal_wall_clock"]
        equal = "--" if eq["version"] is None else f"{eq['success']:.3f} (v{eq['version']})"
        print(f"{r['minibatches']:>11d} {r['updates']:>7d} {r['loop_s']:>7.1f} {r['s_per_version']:>9.3f} | "
              + " ".join(f"{by_version[v]:<6.3f}" for v in versions) + f" | {reached:<27} | {equal}")
    print(f"bench wall {total:.0f} s; parallel capacity before / after: {capacity_before:.2f}x / {capacity_after:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
