"""``bench/scale.py``'s checkpoint sections: sharded vs single-file save/load, and DP=2 writes by rank 0 vs
spread over both ranks."""

import argparse
import json
import time
from pathlib import Path
from typing import Any

from bench.scale_step import Trainer


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
        from asyncrl.trainer.checkpoint.folder import read_checkpoint

        # the single-file format, which only tests and this bench write
        from tests.support.megatron_parts import write_checkpoint

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
