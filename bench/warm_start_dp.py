"""Benchmark: the supervised warm start with a data-parallel actor (issue 17), DP=1 vs DP=2 side by side.

Usage::

    nice -n 10 .venv/bin/python bench/warm_start_dp.py [--example examples/data-parallel.yaml] [--steps 20]
                                                       [--threads 2,1] [--json out.json]

Every row runs the real warm-start path of one actor rank (:meth:`ActorHost.warm_start`: seeded
demonstrations, ``pad_batch``, :meth:`MegatronActor.sft_step` over each DP rank's token-balanced share, the
gradient all-reduce, AdamW) for ``--steps`` steps of the example's task and model, as one process (DP=1) and
as two gloo ranks (DP=2, one spawned process each), at the given torch threads per rank. The seconds per
step are the slowest rank's median after two discarded warm-up steps; ``demos`` is the part of a step spent
generating and padding the demonstrations (each rank draws the whole batch: the token-balanced split needs
every row's length). ``ranks x threads`` above the cores oversubscribes them: OpenMP workers that spin in
their barriers while the other rank's hold the cores. The driver gives each rank the cores split between
the ranks on its host (:func:`asyncrl.trainer.driver.hosts.warm_start.warm_start_threads`: DP=2 on 2 cores, 1 each);
before, every rank got every core (the ``DP=2 x 2`` row).

The machine is shared and loaded: compare rows measured side by side in one run, not absolute times.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing


def _rank(rank: int, world: int, init_method: str | None, spec_json: dict[str, Any], threads: int, steps: int,
          out: str) -> None:
    import random

    from asyncrl.rollout.envs.demos import demonstrations, pad_batch
    from asyncrl.trainer.driver.hosts.actor_host import ActorHost

    spec_json = {**spec_json, "actor": {**spec_json.get("actor", {}), "replicas": world, "gpusPerReplica": 0}}
    host = ActorHost(spec_json, threads, rank=rank, init_method=init_method)
    total = steps + 2
    host.warm_start(0, 2, total, threads)  # warm-up: imports, the first allocations, the rendezvous settled
    per_step = []
    for step in range(2, total):
        t0 = time.perf_counter()
        host.warm_start(step, step + 1, total, threads)
        per_step.append(time.perf_counter() - t0)
    rng = random.Random(0)
    t0 = time.perf_counter()
    for _ in range(steps):
        pad_batch(demonstrations(host.spec.task.name, 128, rng, max_tool_calls=host.spec.task.max_tool_calls,
                                 tokenizer=host.tokenizer), pad_id=host.pad)
    demos = (time.perf_counter() - t0) / steps
    Path(out, f"rank{rank}.json").write_text(json.dumps({"step_s": statistics.median(per_step), "demos_s": demos}))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run(world: int, threads: int, spec_json: dict[str, Any], steps: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    from asyncrl.trainer.megatron.parallel import rendezvous

    with tempfile.TemporaryDirectory() as out:
        init = rendezvous("127.0.0.1") if world > 1 else None
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(r, world, init, spec_json, threads, steps, out)) for r in range(world)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        for p in procs:
            p.join(1800)
        wall = time.perf_counter() - t0
        for p in procs:
            if p.is_alive():
                p.kill()
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"DP={world} threads={threads}: ranks exited with {[p.exitcode for p in procs]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {"step_s": max(r["step_s"] for r in ranks), "demos_s": max(r["demos_s"] for r in ranks), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--example", default="examples/data-parallel.yaml")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", default="2,1", help="torch threads per rank to try at DP=2 (DP=1 uses the cores)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    import yaml

    spec_json = yaml.safe_load(Path(args.example).read_text())["spec"]
    cores = os.cpu_count() or 1
    rows = [("DP=1", 1, cores)] + [("DP=2", 2, int(t)) for t in args.threads.split(",")]
    results = []
    for name, world, threads in rows:
        r = run(world, threads, spec_json, args.steps)
        results.append({"layout": name, "threads": threads, **r})
        print(f"measured {name} x {threads} threads: {r}", flush=True)
    base = results[0]["step_s"]
    print(f"\nwarm start, {args.example} (task {spec_json['task']['name']}, model {spec_json['model']}), "
          f"{args.steps} steps of 128 demonstrations, {cores} cores")
    print(f"{'layout':>6} {'threads/rank':>12} {'ranks x threads':>15} {'s/step':>8} {'demos s':>8} {'vs DP=1':>8}"
          f" {'300 steps':>10}")
    for r in results:
        world = 1 if r["layout"] == "DP=1" else 2
        print(f"{r['layout']:>6} {r['threads']:>12} {world * r['threads']:>15} {r['step_s']:>8.3f} "
              f"{r['demos_s']:>8.3f} {r['step_s'] / base:>7.2f}x {300 * r['step_s']:>9.0f}s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
