"""``bench/scale.py``'s weight-sync section: one object vs buckets vs broadcast (see that script's doc).

A source process holds a Llama-shaped model's megatron parameters (random, fp32); ``--receivers`` rollout-like
processes (bf16 parameters) take every version by each method.
"""

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from asyncrl.trainer.collective.endpoint import LOOPBACK, new_endpoint
from bench.scale_common import arch_of


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

        from asyncrl.trainer.weight_sync.objectstore import publish
        from asyncrl.trainer.weight_sync.source import actor_buckets

        t0 = time.perf_counter()
        handle = publish(actor_buckets(self.params, self.arch, version=version, bucket_mib=bucket_mib,
                                       dtype=torch.bfloat16))
        return handle, time.perf_counter() - t0

    def join(self, endpoint: Any, world: int) -> None:
        from asyncrl.trainer.weight_sync.broadcast import open_group

        self.group = open_group(endpoint, 0, world, backend="gloo", timeout_s=600)

    def broadcast(self, bucket_mib: int, version: int) -> float:
        import torch

        from asyncrl.trainer.weight_sync.broadcast import send
        from asyncrl.trainer.weight_sync.source import actor_buckets

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

        from asyncrl.trainer.weight_sync.objectstore import BucketRefs, receive

        t0 = time.perf_counter()
        if isinstance(handle, BucketRefs):
            state = receive(handle).state
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                state = ray.get(handle[0])
        return time.perf_counter() - t0, self._install(state)

    def join(self, endpoint: Any, rank: int, world: int) -> None:
        from asyncrl.trainer.weight_sync.broadcast import open_group

        self.group = open_group(endpoint, rank, world, backend="gloo", timeout_s=600)

    def take_broadcast(self, version: int) -> tuple[float, float]:
        from asyncrl.trainer.weight_sync.broadcast import receive_version

        t0 = time.perf_counter()
        state = receive_version(self.group, version).state  # what a rollout worker runs
        return time.perf_counter() - t0, self._install(state)


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
    endpoint, world = new_endpoint(LOOPBACK), args.receivers + 1  # the group's authenticated store on loopback
    ray.get([src.join.remote(endpoint, world), *[r.join.remote(endpoint, i + 1, world) for i, r in enumerate(recv)]])

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
        parts = ray.get([r.take_broadcast.remote(v) for r in recv])
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
