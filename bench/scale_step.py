"""``bench/scale.py``'s step-time section: the actor's ``train_step`` at DP=1 vs DP=2 at one global batch."""

import argparse
import json
import statistics
import time
from dataclasses import replace
from typing import Any

from bench.scale_common import arch_of


class Trainer:
    """One rank of the actor (one process: world 1) training a fixed global batch."""

    def __init__(self, millions: int, rank: int, world: int, init_method: str | None, threads: int,
                 distributed_optimizer: bool = False) -> None:
        import torch

        from asyncrl.api.job import AsyncRLJobSpec
        from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
        from asyncrl.trainer.megatron.parallel import Layout

        torch.set_num_threads(threads)
        arch = arch_of(millions)
        spec = AsyncRLJobSpec.model_validate({"correction": {"reference": "behavior"},
                                              "train": {"minibatches": 2, "learningRate": 1e-5},
                                              "actor": {"megatron": {"distributedOptimizer": distributed_optimizer}}})
        settings = ActorSettings.from_spec(spec, arch.vocab_size)
        self.actor = MegatronActor(replace(settings, arch=arch, device="cpu", num_threads=threads,
                                           layout=Layout(rank=rank, world=world, init_method=init_method)))

    def steps(self, rows: int, length: int, n: int) -> list[float]:
        """Seconds of each of ``n`` train steps on one seeded ``[rows, length]`` batch (plus a warm-up)."""
        import torch

        from asyncrl.trainer.actor.batch import TrainBatch

        g = torch.Generator().manual_seed(0)
        vocab = self.actor.settings.arch.vocab_size
        tokens = torch.randint(0, vocab, (rows, length), generator=g)
        mask = torch.zeros(rows, length, dtype=torch.bool)
        mask[:, length // 4:] = True
        logp_mu = self.actor.logprobs(tokens) * mask
        versions = torch.where(mask, 0, -1)
        adv = torch.linspace(-1, 1, rows)[:, None].expand(rows, length).contiguous()
        batch = TrainBatch(tokens, mask, logp_mu, versions, adv, torch.where(mask, 0, -1))
        out = []
        for _ in range(n + 1):
            t0 = time.perf_counter()
            self.actor.train_step(batch)
            out.append(time.perf_counter() - t0)
        return out[1:]


def step_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """DP=1 vs DP=2 at one global batch (``--step-batch``), the ``--step-size`` shape."""
    import ray

    from asyncrl.trainer.megatron.parallel import rendezvous

    rows_, length = args.step_batch
    out: list[dict[str, Any]] = []
    base = None
    for world in (1, 2):
        init = rendezvous("127.0.0.1") if world > 1 else None
        threads = max(1, 2 // world)  # the same 2 cores in all: 2 threads x 1 rank, 1 thread x 2 ranks
        ranks = [ray.remote(Trainer).options(num_cpus=0).remote(args.step_size, r, world, init, threads)
                 for r in range(world)]
        times = ray.get([r.steps.remote(rows_, length, args.step_repeats) for r in ranks])
        med = statistics.median(max(ts) for ts in zip(*times, strict=True))  # a step ends when its slowest rank does
        base = base or med
        tokens = rows_ * (length - length // 4)
        out.append({"params_M": args.step_size, "layout": f"DP={world}", "global_batch": f"{rows_}x{length}",
                    "step_s": round(med, 3), "tokens_per_s": round(tokens / med, 1),
                    "vs_DP1": round(med / base, 2)})
        print(json.dumps(out[-1]), flush=True)
        for r in ranks:
            ray.kill(r)
    return out
