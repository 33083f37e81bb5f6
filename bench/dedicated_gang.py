"""Benchmark: a dedicated old-logit scorer as one process vs as a tensor-parallel gang (issue 17).

Usage::

    nice -n 10 .venv/bin/python bench/dedicated_gang.py [--preset smollm2-135m] [--tp 3] [--rows 8]
                                                        [--tokens 128] [--repeats 2]

Side by side, in one run, on one local Ray: a one-process :class:`DedicatedScorer` and a gang of ``--tp``
ranks (gloo, one Ray actor per rank, ``trainer/driver/hosts/actor_group.py`` ``start_gang``) load the same random
HF weights of ``--preset`` from the object store and score the same ``--rows`` x ``--tokens`` segments.
Columns: parameter bytes held per rank (what a rank needs in device memory: the point of a gang is that a
model too big for one device fits in ``tp``), the load (``advance_to``: fetch, convert, slice) and score
seconds (median of ``--repeats``), and the largest log-prob difference to the one-process scorer. On a CPU
host the gang is no faster (its ranks share the cores and add gloo all-reduces); on GPUs each rank has its own.

Measured (2 shared, loaded cores; defaults: smollm2-135m, TP=3, 8 x 128 tokens, median of 2, the first load
includes the model build)::

    scorer          param MiB/rank   load s  score s  max |diff|
    one process              513.1     3.76     6.70    0.00e+00
    gang TP=3                171.1     1.97     6.57    1.91e-06
"""

import argparse
import statistics
import time
from typing import Any

import numpy as np


def _hf_weights(arch: Any, seed: int) -> dict[str, np.ndarray]:
    from asyncrl.trainer.megatron.convert import hf_shapes

    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in hf_shapes(arch, with_tied_head=False).items():
        out[name] = (np.ones(shape, np.float32) if name.endswith("norm.weight")
                     else (0.02 * rng.standard_normal(shape)).astype(np.float32))
    return out


def _param_bytes(scorer: Any) -> int:  # runs inside a rank (__ray_call__)
    return sum(p.numel() * p.element_size() for p in scorer.scorer._gpt.parameters())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="smollm2-135m")
    ap.add_argument("--tp", type=int, default=3)  # smollm2: 9 heads, 3 KV heads, vocab 49152 -> TP in {1, 3}
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import ray

    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.driver.hosts.actor_group import start_gang
    from asyncrl.trainer.driver.hosts.ray_env import local_ray
    from asyncrl.trainer.megatron.parallel import Layout
    from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer
    from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings

    spec = AsyncRLJobSpec.model_validate({"model": {"preset": args.preset}})
    settings = ScorerSettings.from_spec(spec, 49152, device="cpu")
    rng = np.random.default_rng(1)
    vocab = settings.arch.vocab_size
    segs = [(rng.integers(0, vocab, args.tokens).tolist(), list(range(1, args.tokens))) for _ in range(args.rows)]
    with local_ray(num_cpus=args.tp + 1):
        ref = ray.put(_hf_weights(settings.arch, seed=0))
        cls: Any = ray.remote(DedicatedScorer)
        one = cls.options(num_cpus=1).remote(settings, num_threads=1)

        def start_rank(r: int, init_method: str) -> Any:
            lay = Layout(tp=args.tp, rank=r, world=args.tp, init_method=init_method)
            return cls.options(num_cpus=1).remote(settings, num_threads=1, layout=lay)

        gang = start_gang(args.tp, {}, start_rank, role="bench scorer", after="the bench ends")
        rows, scores = [], {}
        for label, h, ranks in (("one process", one, [one]), (f"gang TP={args.tp}", gang, gang.ranks)):
            loads, times = [], []
            for v in range(args.repeats):
                ray.get(h.push_version.remote([ref], v))
                loads.append(ray.get(h.advance_to.remote(v)))
                t0 = time.perf_counter()
                scores[label] = ray.get(h.score.remote(segs, v))
                times.append(time.perf_counter() - t0)
            per_rank = max(ray.get([r.__ray_call__.remote(_param_bytes) for r in ranks]))
            rows.append((label, per_rank, statistics.median(loads), statistics.median(times)))
        base = scores["one process"]
        print(f"{args.preset}, {args.rows} x {args.tokens} tokens, CPU (gloo), loaded shared cores")
        print(f"{'scorer':<14} {'param MiB/rank':>15} {'load s':>8} {'score s':>8} {'max |diff|':>11}")
        for label, nbytes, load_s, score_s in rows:
            diff = max(abs(a - b) for g, w in zip(scores[label], base, strict=True) for a, b in zip(g, w, strict=True))
            print(f"{label:<14} {nbytes / 2**20:>15.1f} {load_s:>8.2f} {score_s:>8.2f} {diff:>11.2e}")
        gang.kill()


if __name__ == "__main__":
    main()
