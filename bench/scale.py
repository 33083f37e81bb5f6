"""Benchmark: scaling the actor out (issue 17): weight sync today; step time and checkpoints are hooks.

Usage::

    nice -n 10 .venv/bin/python bench/scale.py [--sizes 10,35,100] [--receivers 2] [--bucket-mib 512,64]
                                               [--repeats 2] [--json out.json]

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

**Step time DP=1 vs DP=2** and **checkpoint save/load sharded vs single file**: not measured here yet;
:data:`SECTIONS` has their hooks (``None``): a function ``(args) -> list[dict]`` of rows per section.

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


# section -> rows; None: a hook for another part of issue 17 (DP=1 vs DP=2 step time, sharded checkpoints)
SECTIONS: dict[str, Callable[[argparse.Namespace], list[dict[str, Any]]] | None] = {
    "weight sync": weight_sync_rows,
    "step time DP=1 vs DP=2": None,
    "checkpoint save/load sharded vs single file": None,
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
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()

    from asyncrl.trainer.driver.ray_env import local_ray

    out: dict[str, Any] = {}
    with local_ray(num_cpus=2):
        for name, section in SECTIONS.items():
            if section is None:
                print(f"\n## {name}: not measured by this build (hook in bench/scale.py SECTIONS)")
                continue
            rows = section(args)
            out[name] = rows
            print(f"\n## {name} (loaded shared cores: compare rows side by side)\n\n{table(rows)}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
