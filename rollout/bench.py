"""Rollout throughput of the HF engine: ``python -m asyncrl.rollout.bench``.

Generates ``--batch`` fresh episodes of a task with random weights of a preset (lock-step loop
with environment tokens, as in training) and prints the median tokens/s per dtype. Random weights
make most episodes run to ``maxNewTokens``, so this is the loop's throughput, not a policy's.
``--weights FOLDER`` (e.g. what ``asyncrl models pull smollm2`` prints, with ``--preset
smollm2-135m``) measures a pretrained policy instead, with its own tokenizer and prompts.
"""

import argparse
import random
import statistics
import time

import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs.registry import get_task
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.tokenizer import tokenizer_for, weights_folder


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--preset", default="tiny-llama")
    p.add_argument("--task", default="chain-calculator")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--weights", metavar="FOLDER", help="HF safetensors folder (default: random weights)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = ModelSpec(preset=args.preset, weights=args.weights)
    tok = tokenizer_for(spec)
    arch = resolve_arch(spec, tok.vocab_size)
    if args.weights is None:
        weights = build_model(arch, seed=0).state_dict()
    else:
        from safetensors.torch import load_file

        weights = {k: v for f in sorted(weights_folder(args.weights).glob("*.safetensors")) for k, v in load_file(f).items()}
    task = get_task(args.task)
    for dtype in args.dtypes.split(","):
        eng = HFEngine(arch, dtype=dtype, seed=0, pad_id=tok.pad_id)
        eng.load_weights(weights, version=0)
        rates, all_rates = [], []
        for rep in range(args.reps + 1):  # rep 0 warms up
            rng = random.Random(rep)
            eps = [Episode.start(str(i), "b", task.make_env(tokenizer=tok), rng) for i in range(args.batch)]
            t0 = time.perf_counter()
            eng.generate(eps, max_new_tokens=args.max_new_tokens, seed=rep)
            dt = time.perf_counter() - t0
            if rep:
                rates.append(sum(sum(e.loss_mask) for e in eps) / dt)
                all_rates.append(sum(e.new_tokens for e in eps) / dt)
        print(
            f"{args.preset} {dtype:9s} batch {args.batch} threads {args.threads}: "
            f"{statistics.median(rates):8.0f} sampled tok/s, {statistics.median(all_rates):8.0f} tok/s incl. forced"
        )


if __name__ == "__main__":
    main()
