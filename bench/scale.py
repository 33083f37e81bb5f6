"""Benchmark: scaling the actor out (issue 17): weight sync, step time DP=1 vs DP=2, checkpoints.

Usage::

    nice -n 10 .venv/bin/python bench/scale.py [--sizes 10,35,100] [--receivers 2] [--bucket-mib 512,64]
                                               [--repeats 2] [--quick] [--only SECTION,...] [--json out.json]

``--quick``: one small size, small batches, one repeat (a smoke run of every section in about a minute).

**Weight sync** (this file's part). A source process holds a Llama-shaped model's megatron parameters
(random, fp32) at three sizes up to ~100M parameters; ``--receivers`` rollout-like processes take every
version. Side by side, in one run, on one local Ray:

- ``one object``: today's path before buckets: the whole HF state dict converted and cloned in fp32,
  one ``ray.put``; each receiver ``ray.get``s it and casts into its bf16 parameters;
- ``buckets N MiB``: :mod:`asyncrl.trainer.weightsync` over the object store: per-tensor conversion,
  bf16 on the wire, flat buckets of N MiB, one object each;
- ``broadcast``: the same buckets by a gloo collective group (source + receivers; NCCL on GPU runs the
  same code).

Columns: ``publish`` (source: convert, cast, pack, put / send), ``transfer`` (slowest receiver: pull and
reassemble, generation would keep running), ``pause`` (slowest receiver: installing the tensors into
preallocated bf16 parameters, the time generation stands still), ``total`` (wall from the start of
publish to every receiver done), wire bytes and GB/s = wire bytes / total. Median of ``--repeats`` after one
discarded warm-up (the first call imports the converter in each process).

**Step time DP=1 vs DP=2** at a fixed global batch: the project's actor (:class:`MegatronActor`, the
``--step-size`` shape, ``behavior`` reference, two minibatches) as one process and as two gloo ranks in Ray
actors, each trains the same ``--step-batch`` rows (DP=2: a token-balanced half each). Columns: median
seconds per ``train_step`` after one discarded warm-up, trained tokens/s, and the ratio to DP=1. On these
2 shared cores DP=2 only shows the cost of the split and the all-reduces; on GPUs each rank has its own.

**Checkpoint save/load** at the weight-sync sizes: one process holding the actor with Adam state (one
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
import math
import socket
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

MIB = 2**20


# M parameters -> (hidden, layers, heads, KV heads, SwiGLU inner, vocab): Llama-shaped, untied; the largest is
# reference/distributed-actor.md §5.2's shape (hidden 768, 12/4 heads, vocab 32768) at 8 layers.
SHAPES: dict[int, tuple[int, int, int, int, int, int]] = {
    10: (384, 2, 6, 2, 1024, 8192),
    35: (512, 6, 8, 2, 1408, 16384),
    100: (768, 8, 12, 4, 2048, 32768),
}


def arch_of(millions: int) -> Any:
    """The architecture of :data:`SHAPES` ``[millions]`` (valid keys: its sizes)."""
    from asyncrl.api.model_arch import PRESETS

    if millions not in SHAPES:
        raise SystemExit(f"--sizes: {millions} has no shape; valid: {sorted(SHAPES)}")
    h, layers, heads, kv, ffn, vocab = SHAPES[millions]
    base = next(a for a in PRESETS.values() if a.family == "llama")
    return replace(base, hidden_size=h, num_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                   ffn_hidden_size=ffn, vocab_size=vocab, tie_embeddings=False, kv_channels=None)


class Source:
    """The actor side: megatron-named fp32 parameters, published by each method."""

    def __init__(self, arch: Any) -> None:
        import torch

        from asyncrl.trainer.megatron.convert import megatron_shapes

        torch.set_num_threads(1)
        g = torch.Generator().manual_seed(0)
        self.arch = arch
        self.params = {k: torch.randn(s, generator=g) * 0.02 for k, s in megatron_shapes(arch).items()}
        self.group: Any = None

    def n_params(self) -> int:
        return sum(p.numel() for p in self.params.values())

    def one_object(self) -> tuple[Any, float]:
        import ray

        from asyncrl.trainer.megatron.convert import megatron_to_hf

        t0 = time.perf_counter()
        hf = {k: v.clone().numpy() for k, v in megatron_to_hf(self.params, self.arch).items()}  # as hf_state_dict
        ref = ray.put(hf)
        return [ref], time.perf_counter() - t0

    def buckets(self, bucket_mib: int, version: int) -> tuple[Any, float]:
        import torch

        from asyncrl.trainer.weightsync.objectstore import publish
        from asyncrl.trainer.weightsync.source import actor_buckets

        t0 = time.perf_counter()
        handle = publish(actor_buckets(self.params, self.arch, version=version, bucket_mib=bucket_mib,
                                       dtype=torch.bfloat16))
        return handle, time.perf_counter() - t0

    def join(self, port: int, world: int) -> None:
        from asyncrl.trainer.weightsync.broadcast import open_group

        self.group = open_group("127.0.0.1", port, 0, world, backend="gloo", timeout_s=600)

    def broadcast(self, bucket_mib: int, version: int) -> float:
        import torch

        from asyncrl.trainer.weightsync.broadcast import send
        from asyncrl.trainer.weightsync.source import actor_buckets

        t0 = time.perf_counter()
        send(self.group, actor_buckets(self.params, self.arch, version=version, bucket_mib=bucket_mib,
                                       dtype=torch.bfloat16))
        return time.perf_counter() - t0


class Receiver:
    """A rollout-like process: bf16 parameters, filled by each method (pull, then install)."""

    def __init__(self, arch: Any) -> None:
        import torch

        from asyncrl.trainer.megatron.convert import hf_shapes

        torch.set_num_threads(1)
        self.params = {k: torch.zeros(s, dtype=torch.bfloat16) for k, s in hf_shapes(arch).items()}
        self.group: Any = None

    def _install(self, state: dict[str, Any]) -> float:
        import torch

        t0 = time.perf_counter()
        with torch.no_grad():
            for k, p in self.params.items():
                p.copy_(torch.as_tensor(state[k]))  # casts fp32 -> bf16 on the one-object path
        return time.perf_counter() - t0

    def take(self, handle: Any) -> tuple[float, float]:
        import warnings

        import ray

        from asyncrl.trainer.weightsync.objectstore import BucketRefs, receive

        t0 = time.perf_counter()
        if isinstance(handle, BucketRefs):
            state = receive(handle).state
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                state = ray.get(handle[0])
        return time.perf_counter() - t0, self._install(state)

    def join(self, port: int, rank: int, world: int) -> None:
        from asyncrl.trainer.weightsync.broadcast import open_group

        self.group = open_group("127.0.0.1", port, rank, world, backend="gloo", timeout_s=600)

    def take_broadcast(self) -> tuple[float, float]:
        from asyncrl.trainer.weightsync.broadcast import receive

        t0 = time.perf_counter()
        state = receive(self.group)
        return time.perf_counter() - t0, self._install(state)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _size_rows(millions: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The weight-sync rows of one model size (fresh source and receiver processes)."""
    import ray

    from asyncrl.trainer.megatron.convert import hf_shapes

    rows: list[dict[str, Any]] = []
    arch = arch_of(millions)
    src = ray.remote(Source).options(num_cpus=0).remote(arch)
    recv = [ray.remote(Receiver).options(num_cpus=0).remote(arch) for _ in range(args.receivers)]
    n = ray.get(src.n_params.remote())
    hf_elems = sum(math.prod(s) for s in hf_shapes(arch).values())
    port, world = _port(), args.receivers + 1
    ray.get([src.join.remote(port, world), *[r.join.remote(port, i + 1, world) for i, r in enumerate(recv)]])

    def timed(publish: Callable[[], Any], take: Callable[[Any], list[Any]]) -> dict[str, float]:
        t0 = time.perf_counter()
        handle, pub = publish()
        parts = take(handle)
        total = time.perf_counter() - t0
        return {"publish": pub, "transfer": max(p[0] for p in parts), "pause": max(p[1] for p in parts),
                "total": total}

    methods: list[tuple[str, int, Callable[[int], dict[str, float]]]] = [
        ("one object (fp32)", 4, lambda v: timed(lambda: ray.get(src.one_object.remote()),
                                                 lambda h: ray.get([r.take.remote(h) for r in recv]))),
    ]
    for mib in args.bucket_mib:
        methods.append((f"buckets {mib} MiB (bf16)", 2, lambda v, mib=mib: timed(
            lambda: ray.get(src.buckets.remote(mib, v)), lambda h: ray.get([r.take.remote(h) for r in recv]))))

    def bcast(v: int) -> dict[str, float]:
        t0 = time.perf_counter()
        pub_ref = src.broadcast.remote(args.bucket_mib[0], v)
        parts = ray.get([r.take_broadcast.remote() for r in recv])
        pub = ray.get(pub_ref)
        return {"publish": pub, "transfer": max(p[0] for p in parts), "pause": max(p[1] for p in parts),
                "total": time.perf_counter() - t0}

    methods.append((f"broadcast gloo {args.bucket_mib[0]} MiB (bf16)", 2, bcast))
    for name, width, run in methods:
        run(-1)  # warm-up, discarded: the first call imports the converter and megatron in each process
        runs = [run(v) for v in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        wire = hf_elems * width
        rows.append({"params_M": round(n / 1e6, 1), "method": name, "receivers": args.receivers,
                     **{f"{k}_s": round(v, 3) for k, v in med.items()},
                     "wire_MB": round(wire / 1e6, 1), "GB_per_s": round(wire / med["total"] / 1e9, 3)})
        print(json.dumps(rows[-1]), flush=True)
    for actor in [src, *recv]:
        ray.kill(actor)
    return rows


def weight_sync_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for millions in args.sizes:
        rows += _size_rows(millions, args)
    return rows


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

        from asyncrl.trainer.megatron.batch import TrainBatch

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


class Checkpointer:
    """One process holding an actor with Adam state; saves and loads it in both formats."""

    def __init__(self, millions: int) -> None:
        self.trainer = Trainer(millions, 0, 1, None, 2)
        self.trainer.steps(2, 16, 0)  # one update: the optimizer's moments exist

    def run(self, work: str) -> list[dict[str, Any]]:
        import dataclasses
        import shutil
        import tempfile

        from asyncrl.trainer.actor.checkpoint_io import COUNTERS, load_actor, save_actor
        from asyncrl.trainer.megatron.checkpoint import read_checkpoint, write_checkpoint

        actor = self.trainer.actor
        root = Path(tempfile.mkdtemp(prefix="scale-ckpt-", dir=work))

        def single_save(d: Path) -> None:  # the former format: the same content, one torch.save
            state = {"model": {k: v for k, v in actor._gpt.state_dict().items() if not k.endswith("_extra_state")},
                     "optimizer": actor._optimizer.state_dict(), "version": actor.version,
                     "counters": {n: getattr(actor, n) for n in COUNTERS}}
            write_checkpoint(d, state, {"version": actor.version, "arch": dataclasses.asdict(actor.settings.arch)})

        def single_load(d: Path) -> None:
            state, _ = read_checkpoint(d)
            actor._gpt.load_state_dict(state["model"], strict=True)
            actor._optimizer.load_state_dict(state["optimizer"])

        formats = {"sharded (dist_checkpointing)": (lambda d: save_actor(actor, str(d)),
                                                    lambda d: load_actor(actor, str(d))),
                   "single file (torch.save)": (single_save, single_load)}
        rows = []
        try:
            for name, (save, load) in formats.items():
                save(root / "warm")  # first call: imports, megatron's writer set-up
                saves, loads = [], []
                for i in range(2):
                    d = root / f"{name[:6]}-{i}"
                    t0 = time.perf_counter()
                    save(d)
                    saves.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    load(d)
                    loads.append(time.perf_counter() - t0)
                nbytes = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
                n = sum(p.numel() for p in actor._params)
                rows.append({"params_M": round(n / 1e6, 1), "format": name, "save_s": round(min(saves), 3),
                             "load_s": round(min(loads), 3), "MB": round(nbytes / 1e6, 1),
                             "files": sum(1 for p in d.rglob("*") if p.is_file())})
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return rows


def checkpoint_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    import tempfile

    import ray

    rows: list[dict[str, Any]] = []
    for millions in args.sizes:
        holder = ray.remote(Checkpointer).options(num_cpus=0).remote(millions)
        for row in ray.get(holder.run.remote(str(args.work or tempfile.gettempdir()))):
            rows.append(row)
            print(json.dumps(row), flush=True)
        ray.kill(holder)
    return rows


class SpreadRank:
    """One of two DP ranks holding the actor with Adam state; saves and loads group checkpoints."""

    def __init__(self, millions: int, rank: int, init_method: str, distributed_optimizer: bool) -> None:
        self.rank = rank
        self.trainer = Trainer(millions, rank, 2, init_method, 1, distributed_optimizer)
        self.trainer.steps(2, 16, 0)  # one update: the optimizer's moments exist

    def save(self, folder: str, spread: bool) -> dict[str, float]:
        """Seconds of this rank's save_rank, and the bytes of the shard files this rank wrote."""
        from asyncrl.trainer.actor.checkpoint_io import save_rank

        t0 = time.perf_counter()
        save_rank(self.trainer.actor, folder, rank=self.rank, spread=spread)
        seconds = time.perf_counter() - t0
        mine = sum(p.stat().st_size for p in Path(folder).glob(f"__{self.rank}_*.distcp"))
        return {"s": seconds, "bytes": mine}

    def load(self, folder: str) -> float:
        from asyncrl.trainer.actor.checkpoint_io import load_rank

        t0 = time.perf_counter()
        load_rank(self.trainer.actor, folder, rank=self.rank)
        return time.perf_counter() - t0


def spread_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """DP=2 group checkpoints of the ``--ckpt-size`` actor: DP rank 0 writing every replicated tensor vs the
    writes spread over both ranks (FullyParallelSaveStrategyWrapper), for the torch AdamW (the CPU default)
    and megatron's distributed optimizer. Save/load seconds: the slowest rank, best of two after a warm-up;
    MB written by rank 0 and rank 1."""
    import shutil
    import tempfile

    import ray

    from asyncrl.trainer.megatron.parallel import rendezvous

    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="scale-spread-", dir=str(args.work or tempfile.gettempdir())))
    try:
        for dist_opt in (False, True):
            init = rendezvous("127.0.0.1")
            ranks = [ray.remote(SpreadRank).options(num_cpus=0).remote(args.ckpt_size, r, init, dist_opt)
                     for r in range(2)]
            optimizer = "distributed optimizer" if dist_opt else "torch AdamW"
            ray.get([r.save.remote(str(root / f"warm-{dist_opt}"), True) for r in ranks])
            for spread in (False, True):
                saves, loads, written = [], [], [0.0, 0.0]
                for i in range(2):
                    folder = str(root / f"{dist_opt}-{spread}-{i}")
                    got = ray.get([r.save.remote(folder, spread) for r in ranks])
                    saves.append(max(g["s"] for g in got))
                    written = [g["bytes"] / 1e6 for g in got]
                    loads.append(max(ray.get([r.load.remote(folder) for r in ranks])))
                    shutil.rmtree(folder, ignore_errors=True)
                rows.append({"params_M": args.ckpt_size, "optimizer": optimizer,
                             "writes": "spread over DP" if spread else "DP rank 0",
                             "save_s": round(min(saves), 3), "load_s": round(min(loads), 3),
                             "MB_rank0": round(written[0], 1), "MB_rank1": round(written[1], 1)})
                print(json.dumps(rows[-1]), flush=True)
            for r in ranks:
                ray.kill(r)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


# section -> rows
SECTIONS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]] | None] = {
    "weight sync": weight_sync_rows,
    "step time DP=1 vs DP=2": step_rows,
    "checkpoint save/load sharded vs single file": checkpoint_rows,
    "spread DP=2 checkpoint writes: DP rank 0 vs every rank": spread_rows,
}


def table(rows: list[dict[str, Any]]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


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

    from asyncrl.trainer.driver.ray_env import local_ray

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
