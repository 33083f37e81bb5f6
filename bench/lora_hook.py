"""Benchmark: LoRA's forward hook, the fused accumulation against the product-scaling-sum it replaced, side by side.

Usage::

    .venv/bin/python bench/lora_hook.py [--model small-llama] [--rank 16] [--rows 8] [--tokens 128]
                                        [--rounds 9] [--threads 1] [--json out.json]

The hook adds ``s B (A x)`` to every adapted layer's output. Until this bench it computed ``out + s * (h @ B^T)``:
a product, a scaling and a sum, three passes over the layer's whole output. The torch profiler showed them costing
about as much as ``linear_fc1``'s base GEMM on small-llama. ``trainer/megatron/lora.py`` now accumulates
into the output in one GEMM (``addmm_``/``baddbmm_``). This bench builds one LoRA actor and one full actor
of the same preset, keeps three adapter versions, and times EWMA's forward (one version, functional call), the
exact route's forward (the adapter bank: rows of one version, and rows spanning two), and the full model's EWMA
forward. Each LoRA op runs once per round under the new hook and once under the old formula, patched in for that
call alone, so a load spike hits both alike. Ratios are medians of per-round ratios. It also checks that both
formulas give the same log-probs. No time is asserted anywhere.
"""

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lora_versions as lv  # noqa: E402 -- the sibling bench's actors, versions and batches


def _old_single(out: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    return out + scale * (h @ b.t())


def _old_per_row(out: torch.Tensor, h: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    return out + scale * torch.einsum("snr,nor->sno", h, b)


def measure(model: str, rank: int, rows: int, tokens: int, rounds: int) -> dict[str, Any]:
    from asyncrl.trainer.megatron import lora
    from asyncrl.trainer.oldlogits.snapshot import score_exact

    new = (lora._plus_scaled, lora._plus_scaled_per_row)

    @contextlib.contextmanager
    def old_hook() -> Iterator[None]:
        lora._plus_scaled, lora._plus_scaled_per_row = _old_single, _old_per_row
        try:
            yield
        finally:
            lora._plus_scaled, lora._plus_scaled_per_row = new

    actor = lv._actor(model, {"rank": rank, "alpha": 2.0 * rank}, "exact")
    full = lv._actor(model, None, "exact")
    ids, mask, one = lv._batch(rows, tokens, spans=False)
    _, _, two = lv._batch(rows, tokens, spans=True)
    versions = lv._versions(actor, lv.VERSIONS)
    store = lv._store(versions)
    full_version = lv._versions(full, 1)[0]
    work: dict[str, Callable[[], Any]] = {
        "ewma": lambda: actor.logprobs_under(versions[0], ids),
        "exact_one": lambda: score_exact(store, actor, ids, one, mask),
        "exact_two": lambda: score_exact(store, actor, ids, two, mask),
    }

    def under_old(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with old_hook():
                return fn()
        return run

    diffs = {k: float((under_old(fn)() - fn()).abs().max()) for k, fn in work.items()}
    ops: dict[str, Callable[[], Any]] = {}
    for k, fn in work.items():
        ops[f"new.{k}"], ops[f"old.{k}"] = fn, under_old(fn)
    ops["full.ewma"] = lambda: full.logprobs_under(full_version, ids)
    times = lv._rounds(ops, rounds)
    actor.close()
    full.close()
    return {
        "model": model, "rank": rank, "rows": rows, "tokens": tokens,
        "median_s": {k: statistics.median(v) for k, v in times.items()},
        "new_over_old": {k: lv._ratio(times, f"new.{k}", f"old.{k}") for k in work},
        "exact_over_ewma": {tag: {k: lv._ratio(times, f"{tag}.{k}", f"{tag}.ewma") for k in ("exact_one", "exact_two")}
                            for tag in ("new", "old")},
        "lora_ewma_over_full_ewma": {tag: lv._ratio(times, f"{tag}.ewma", "full.ewma") for tag in ("new", "old")},
        "max_abs_logp_diff_new_vs_old": diffs,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    lv.one_model_args(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from asyncrl.trainer.megatron import compat

    compat.init_megatron(seed=0, device="cpu")
    before = os.getloadavg()
    record = measure(args.model, args.rank, args.rows, args.tokens, args.rounds)
    return lv.emit(record, "lora_hook", args, before)


if __name__ == "__main__":
    sys.exit(main())
