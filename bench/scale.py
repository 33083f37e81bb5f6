"""Benchmark: scaling the actor out (issue 17): weight sync, step time DP=1 vs DP=2, checkpoints.

Usage::

    nice -n 10 .venv/bin/python bench/scale.py [--sizes 10,35,100] [--receivers 2] [--bucket-mib 512,64]
                                               [--repeats 2] [--quick] [--only SECTION,...] [--json out.json]

``--quick``: one small size, small batches, one repeat (a smoke run of every section in about a minute).

**Weight sync** (``bench/scale_sync.py``). A source process holds a Llama-shaped model's megatron parameters
(random, fp32) at three sizes up to ~100M parameters; ``--receivers`` rollout-like processes take every
version. Side by side, in one run, on one local Ray:

- ``one object``: today's path before buckets: the whole HF state dict converted and cloned in fp32,
  one ``ray.put``; each receiver ``ray.get``s it and casts into its bf16 parameters;
- ``buckets N MiB``: :mod:`asyncrl.trainer.weight_sync` over the object store: per-tensor conversion,
  bf16 on the wire, flat buckets of N MiB, one object each;
- ``broadcast``: the same buckets by a gloo collective group (source + receivers; NCCL on GPU runs the
  same code).

Columns: ``publish`` (source: convert, cast, pack, put / send), ``transfer`` (slowest receiver: pull and
reassemble, generation would keep running), ``pause`` (slowest receiver: installing the tensors into
preallocated bf16 parameters, the time generation stands still), ``total`` (wall from the start of
publish to every receiver done), wire bytes and GB/s = wire bytes / total. Median of ``--repeats`` after one
discarded warm-up (the first call imports the converter in each process).

**Step time DP=1 vs DP=2** (``bench/scale_step.py``) at a fixed global batch: the project's actor (:class:`MegatronActor`, the
``--step-size`` shape, ``behavior`` reference, two minibatches) as one process and as two gloo ranks in Ray
actors, each trains the same ``--step-batch`` rows (DP=2: a token-balanced half each). Columns: median
seconds per ``train_step`` after one discarded warm-up, trained tokens/s, and the ratio to DP=1. On these
2 shared cores DP=2 only shows the cost of the split and the all-reduces; on GPUs each rank has its own.

**Checkpoint save/load** (``bench/scale_checkpoint.py``) at the weight-sync sizes: one process holding the actor with Adam state (one
update applied, so the moments exist), side by side: the sharded folder the actor writes
(:mod:`asyncrl.trainer.actor.checkpoint_io`: megatron ``dist_checkpointing``, checksums, marker, rename)
and the former single file (the same content as one ``torch.save``, :func:`write_checkpoint`). Columns:
save and load seconds (load = verify + read + restore into the live model and optimizer), bytes on disk.

**Spread DP=2 checkpoint writes** (``--ckpt-size``): two gloo ranks (Ray actors, one thread each) holding
the actor with Adam state write group checkpoints, side by side: DP rank 0 writing every replicated tensor
(``save_rank(spread=False)``, the former writer) vs the writes balanced over both ranks (megatron's
``FullyParallelSaveStrategyWrapper``), for the torch AdamW and megatron's distributed optimizer. Columns:
save and load seconds of the slowest rank (best of two after a warm-up) and the MB each rank wrote.

The machine is shared and loaded: compare rows measured side by side in one run, not absolute times.
"""

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from bench.scale_checkpoint import checkpoint_rows, spread_rows  # noqa: E402
from bench.scale_common import table  # noqa: E402
from bench.scale_step import step_rows  # noqa: E402
from bench.scale_sync import weight_sync_rows  # noqa: E402

# section -> rows
SECTIONS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]] | None] = {
    "weight sync": weight_sync_rows,
    "step time DP=1 vs DP=2": step_rows,
    "checkpoint save/load sharded vs single file": checkpoint_rows,
    "spread DP=2 checkpoint writes: DP rank 0 vs every rank": spread_rows,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10, 35, 100],
                   help="model sizes in M parameters")
    p.add_argument("--receivers", type=int, default=2)
    p.add_argument("--bucket-mib", type=lambda s: [int(x) for x in s.split(",")], default=[512, 64])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--step-size", type=int, default=10, help="model of the step-time rows (M parameters)")
    p.add_argument("--step-batch", type=lambda s: [int(x) for x in s.split("x")], default=[16, 256],
                   help="global batch of the step-time rows, ROWSxLENGTH")
    p.add_argument("--step-repeats", type=int, default=3)
    p.add_argument("--ckpt-size", type=int, default=35, help="model of the DP=2 checkpoint rows (M parameters)")
    p.add_argument("--work", type=Path, default=None, help="folder for the checkpoint rows (default: temp)")
    p.add_argument("--only", type=lambda s: s.split(","), default=None,
                   help=f"sections to run, by their first word: {[k.split()[0] for k in SECTIONS]}")
    p.add_argument("--quick", action="store_true", help="one small size, small batches, one repeat")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.sizes, args.repeats, args.step_batch, args.step_repeats, args.ckpt_size = [10], 1, [8, 64], 1, 10

    import ray.cloudpickle

    import bench.scale_checkpoint
    import bench.scale_common
    import bench.scale_step
    import bench.scale_sync
    from asyncrl.trainer.driver.hosts.ray_env import local_ray

    # The Ray actors' classes go to the workers by value, as when they were defined in this script: a worker
    # started outside the checkout's root cannot import bench.*.
    for module in (bench.scale_common, bench.scale_sync, bench.scale_step, bench.scale_checkpoint):
        ray.cloudpickle.register_pickle_by_value(module)

    out: dict[str, Any] = {}
    with local_ray(num_cpus=2):
        for name, section in SECTIONS.items():
            if section is None or (args.only is not None and name.split()[0] not in args.only):
                continue
            rows = section(args)
            out[name] = rows
            print(f"\n## {name} (loaded shared cores: compare rows side by side)\n\n{table(rows)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
