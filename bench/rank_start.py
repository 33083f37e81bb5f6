"""Benchmark: how long a two-rank gloo group takes to start, spawned vs forked from a preloaded server.

Usage::

    .venv/bin/python bench/rank_start.py [--rounds 3] [--world 2] [--json]

Each round starts ``--world`` processes that import what an actor rank imports first (torch,
megatron-core, the project's parallel module), form one gloo process group, all-reduce a tensor and exit;
once with the ``spawn`` start method (a fresh interpreter per rank, as the tests did) and once with
``tests/support/rank_processes.rank_context()`` (a fork server that imported them once). The rounds
alternate the two methods, so a change of load hits both; the first fork-server round includes the server's
own start (its imports), and is printed apart. Times are for this machine at this moment: the load
average is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rank(rank: int, world: int, endpoint: Any) -> None:
    import megatron.core  # noqa: F401  (what an actor rank imports)
    import torch
    import torch.distributed as dist

    from asyncrl.trainer.collective.groups import init_default_group
    from asyncrl.trainer.megatron import parallel  # noqa: F401

    init_default_group(endpoint, "gloo", rank, world, 300.0)  # the actor's own authenticated rendezvous
    t = torch.ones(4)
    dist.all_reduce(t)
    assert float(t[0]) == world
    dist.destroy_process_group()


def _group(ctx: Any, world: int) -> float:
    from asyncrl.trainer.megatron.parallel import rendezvous

    endpoint = rendezvous("127.0.0.1")
    t0 = time.perf_counter()
    procs = [ctx.Process(target=_rank, args=(r, world, endpoint)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
    codes = [p.exitcode for p in procs]
    if codes != [0] * world:
        raise RuntimeError(f"ranks exited with {codes}")
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import torch.multiprocessing as mp

    from tests.support.rank_processes import rank_context

    spawn, forked = mp.get_context("spawn"), rank_context()
    first_fork = _group(forked, args.world)  # starts the server: its imports are paid here, once a session
    rows: dict[str, list[float]] = {"spawn": [], "forkserver": []}
    for _ in range(args.rounds):
        rows["spawn"].append(_group(spawn, args.world))
        rows["forkserver"].append(_group(forked, args.world))
    out = {
        "world": args.world, "rounds": args.rounds, "load_avg": [round(x, 2) for x in os.getloadavg()],
        "forkserver_first_s": round(first_fork, 2),
        **{f"{k}_median_s": round(statistics.median(v), 2) for k, v in rows.items()},
        "spawn_over_forkserver": round(statistics.median(rows["spawn"]) / statistics.median(rows["forkserver"]), 2),
        "rounds_s": {k: [round(x, 2) for x in v] for k, v in rows.items()},
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{args.world} ranks, {args.rounds} rounds, load {out['load_avg']}")
        print(f"  spawn       median {out['spawn_median_s']:6.2f} s  {out['rounds_s']['spawn']}")
        print(f"  fork server median {out['forkserver_median_s']:6.2f} s  {out['rounds_s']['forkserver']}"
              f"  (first, with the server's own imports: {out['forkserver_first_s']:.2f} s)")
        print(f"  spawn / fork server: {out['spawn_over_forkserver']:.2f}x")
    return out


if __name__ == "__main__":
    main()
