"""Benchmark: the ``disk`` weight-sync transport beside the object store and broadcast, side by side.

Usage::

    nice -n 10 .venv/bin/python bench/weight_sync_disk.py [--sizes 10,35,100] [--receivers 2] [--repeats 2]

Reuses ``bench/scale.py``'s source (megatron-named fp32 parameters of a Llama-shaped model) and receivers
(bf16 parameters filled per version), and adds the disk transport: the source writes the version's bf16
buckets as ``v<version>/model.safetensors`` (atomic rename, fsync), every receiver reads the file and
installs it. Rows per size: ``buckets`` (object store), ``broadcast`` (gloo) and ``disk`` (a local folder
here; the checkpoint volume in a cluster), each with publish (source side), transfer (slowest receiver:
take off the transport), pause (slowest receiver: install) and total, median of ``--repeats`` after one
discarded warm-up. Measured on loaded shared cores: compare rows of one run, not absolute times.
"""

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from asyncrl.trainer.collective.endpoint import LOOPBACK, new_endpoint  # noqa: E402
from bench.scale_common import arch_of, table  # noqa: E402
from bench.scale_sync import Receiver, Source  # noqa: E402


class DiskSource(Source):
    def disk(self, root: str, bucket_mib: int, version: int) -> tuple[Any, float]:
        import torch

        from asyncrl.trainer.weight_sync.disk import write_version
        from asyncrl.trainer.weight_sync.source import actor_buckets

        t0 = time.perf_counter()
        handle = write_version(actor_buckets(self.params, self.arch, version=version, bucket_mib=bucket_mib,
                                             dtype=torch.bfloat16), root, version, keep=2)
        return handle, time.perf_counter() - t0


class DiskReceiver(Receiver):
    def take_disk(self, handle: Any) -> tuple[float, float]:
        from asyncrl.trainer.weight_sync.disk import read_version

        t0 = time.perf_counter()
        state = read_version(handle)
        return time.perf_counter() - t0, self._install(state)


def rows_of(millions: int, args: argparse.Namespace, root: str) -> list[dict[str, Any]]:
    import ray

    from asyncrl.trainer.megatron.convert import hf_shapes

    arch = arch_of(millions)
    src = ray.remote(DiskSource).options(num_cpus=0).remote(arch)
    recv = [ray.remote(DiskReceiver).options(num_cpus=0).remote(arch) for _ in range(args.receivers)]
    n = ray.get(src.n_params.remote())
    wire = sum(math.prod(s) for s in hf_shapes(arch).values()) * 2  # bf16
    endpoint, world = new_endpoint(LOOPBACK), args.receivers + 1  # the group's authenticated store on loopback
    ray.get([src.join.remote(endpoint, world), *[r.join.remote(endpoint, i + 1, world) for i, r in enumerate(recv)]])

    def pulled(publish: Any, take: str = "take") -> dict[str, float]:
        t0 = time.perf_counter()
        handle, pub = ray.get(publish)
        parts = ray.get([getattr(r, take).remote(handle) for r in recv])
        return {"publish": pub, "transfer": max(p[0] for p in parts), "pause": max(p[1] for p in parts),
                "total": time.perf_counter() - t0}

    def bcast(v: int) -> dict[str, float]:
        t0 = time.perf_counter()
        pub_ref = src.broadcast.remote(args.bucket_mib, v)
        parts = ray.get([r.take_broadcast.remote() for r in recv])
        return {"publish": ray.get(pub_ref), "transfer": max(p[0] for p in parts),
                "pause": max(p[1] for p in parts), "total": time.perf_counter() - t0}

    methods = {
        f"buckets {args.bucket_mib} MiB (object store)": lambda v: pulled(src.buckets.remote(args.bucket_mib, v)),
        f"broadcast gloo {args.bucket_mib} MiB": bcast,
        "disk (safetensors per version)": lambda v: pulled(src.disk.remote(root, args.bucket_mib, v + 1), "take_disk"),
    }
    rows = []
    for name, run in methods.items():
        run(-1)  # warm-up, discarded
        runs = [run(v) for v in range(args.repeats)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append({"params_M": round(n / 1e6, 1), "method": name, "receivers": args.receivers,
                     **{f"{k}_s": round(v, 3) for k, v in med.items()},
                     "wire_MB": round(wire / 1e6, 1), "GB_per_s": round(wire / med["total"] / 1e9, 3)})
        print(json.dumps(rows[-1]), flush=True)
    for a in [src, *recv]:
        ray.kill(a)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[10, 35, 100])
    p.add_argument("--receivers", type=int, default=2)
    p.add_argument("--bucket-mib", type=int, default=512)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    from asyncrl.trainer.driver.hosts.ray_env import local_ray

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as root, local_ray(2):
        for m in args.sizes:
            rows += rows_of(m, args, str(Path(root) / f"m{m}"))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
