"""Benchmark: the held reference's stage (issue 17), DP=1 vs DP=2 at a fixed global batch, side by side.

Usage::

    nice -n 10 .venv/bin/python bench/reference_dp.py [--rows 64] [--seq 128] [--hidden 256] [--steps 4]
                                                      [--references ewma,snapshot] [--json out.json]

Each row runs the project's actor (:class:`MegatronActor`, ``tiny-llama`` at ``--hidden`` / 4 layers, two
minibatches so the reference is held across updates) for ``--steps`` train steps of the same ``--rows x
--seq`` global batch, as one process (DP=1, 2 torch threads) and as two gloo ranks (DP=2, 1 thread each:
the same 2 cores). Columns, median over the steps after one discarded warm-up:

- ``reference s``: ``TrainStepMetrics.reference_seconds``, the stage as it runs now (each DP rank scores its
  token-balanced share, the shares are all-gathered);
- ``whole batch s``: the same provider forwards over the whole batch on every rank, timed in the same
  processes right after each step (what every DP rank did before the split);
- ``rows/rank``: the rows one rank's provider forwards saw.

On 2 shared cores DP=2 halves each rank's forwards but the two ranks share the cores, so the gain is the
work no longer done twice; on GPUs each rank has its own device and the stage shrinks by about DP.
The machine is shared and loaded: compare rows measured side by side in one run, not absolute times.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

VOCAB = 256


def _job(reference: str, hidden: int) -> dict[str, Any]:
    exact = {"correction": {"reference": "exact"}, "oldLogits": {"strategy": "snapshot"}}
    return {
        **({"correction": {"reference": reference}} if reference != "snapshot" else exact),
        "model": {"preset": "tiny-llama", "hiddenSize": hidden, "numLayers": 4, "ffnHiddenSize": 2 * hidden},
        "task": {"temperature": 1.0, "groupSize": 2},
        "train": {"learningRate": 1e-3, "seed": 3, "promptsPerStep": 4, "minibatches": 2, "microBatchTokens": 0},
    }


def _rank(rank: int, world: int, threads: int, init_method: str | None, out: str, reference: str, rows: int,
          seq: int, steps: int, hidden: int) -> None:
    import torch

    torch.set_num_threads(threads)
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.batch import TrainBatch
    from asyncrl.trainer.actor.held_reference import provider_scores
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.actor.update_plan import micro_batches
    from asyncrl.trainer.megatron.parallel import Layout

    spec = AsyncRLJobSpec.model_validate(_job(reference, hidden))
    settings = replace(ActorSettings.from_spec(spec, VOCAB, work_dir=str(Path(out) / "work")), device="cpu",
                       layout=Layout(rank=rank, world=world, init_method=init_method))
    actor = MegatronActor(settings)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (rows, seq), generator=g)
    mask = torch.zeros(rows, seq, dtype=torch.bool)
    for i in range(rows):
        mask[i, 4 : 4 + int(torch.randint(seq // 4, seq - 4, (1,), generator=g))] = True
    counted: list[int] = []
    real = actor.old_logits.score

    def score(batch: Any, scorer: Any) -> Any:  # counts the rows this rank's provider forwards see
        counted.append(int(batch.tokens.shape[0]))
        return real(batch, scorer)

    actor.old_logits.score = score  # type: ignore[method-assign]
    held, whole = [], []
    for step in range(steps + 1):
        versions = torch.where(mask, torch.full((rows, seq), step), torch.full((rows, seq), -1))
        batch = TrainBatch(tokens, mask, (actor.logprobs(tokens) - 0.05) * mask, versions,
                           torch.linspace(-1, 1, rows)[:, None].expand(rows, seq).contiguous(),
                           torch.where(mask, 0, -1))
        counted.clear()
        m = actor.train_step(batch)
        mine = sum(counted)
        t0 = time.perf_counter()  # the former stage: the provider over the whole batch on every rank
        with torch.no_grad():
            provider_scores(actor, batch, micro_batches(torch.arange(rows), seq, settings.micro_batch_tokens))
        if step:
            held.append(m.reference_seconds)
            whole.append(time.perf_counter() - t0)
    Path(out, f"rank{rank}.json").write_text(json.dumps(
        {"reference_s": statistics.median(held), "whole_s": statistics.median(whole), "rows": mine}))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run(world: int, threads: int, reference: str, rows: int, seq: int, steps: int, hidden: int) -> dict[str, float]:
    import torch.multiprocessing as mp

    from asyncrl.trainer.megatron.parallel import rendezvous

    with tempfile.TemporaryDirectory() as out:
        init = rendezvous("127.0.0.1") if world > 1 else None
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_rank, args=(r, world, threads, init, out, reference, rows, seq, steps, hidden))
                 for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(1200)
        for p in procs:
            if p.is_alive():
                p.kill()
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"DP={world} {reference}: ranks exited with {[p.exitcode for p in procs]}")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {"reference_s": max(r["reference_s"] for r in ranks), "whole_s": max(r["whole_s"] for r in ranks),
            "rows": max(r["rows"] for r in ranks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--references", default="ewma,snapshot")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for reference in args.references.split(","):
        for world, threads in ((1, 2), (2, 1)):
            r = run(world, threads, reference, args.rows, args.seq, args.steps, args.hidden)
            results.append({"reference": reference, "dp": world, "threads": threads, **r})
            print(f"measured {reference} DP={world}: {r}", flush=True)
    print(f"\nheld reference, global batch {args.rows} x {args.seq}, hidden {args.hidden} x 4 layers, median of "
          f"{args.steps} steps")
    print(f"{'reference':>10} {'layout':>12} {'rows/rank':>9} {'reference s':>12} {'vs DP=1':>8} {'whole batch s':>14}"
          f" {'split/whole':>12}")
    for r in results:
        base = next(b for b in results if b["reference"] == r["reference"] and b["dp"] == 1)["reference_s"]
        layout = f"DP={r['dp']} x {r['threads']} thr"
        print(f"{r['reference']:>10} {layout:>12} {r['rows']:>9} "
              f"{r['reference_s']:>12.4f} {r['reference_s'] / base:>7.2f}x {r['whole_s']:>14.4f} "
              f"{r['reference_s'] / r['whole_s']:>11.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
