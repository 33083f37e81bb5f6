"""Rollout throughput with slow environments: tokens/s when ``step`` sleeps 0, 10 or 100 ms per turn,
in the sync form (a plain ``def``, run in the runner's thread pool) and the async form (``async def``,
awaited on its event loop), side by side with the engine's decode loop waiting inline (``blocking``:
what every step cost before environments ran off the loop).

One transformers engine (the tiny-llama preset, random weights), ``--episodes`` episodes in one
``generate`` call, each ``--turns`` assistant turns: a turn ends at the first of three stop
characters (geometric, ~36 tokens at the preset's text alphabet), then the environment answers
after its sleep. Reported: sampled tokens / wall seconds, and the ratio to the same form at 0 ms.
Ratios are measured side by side on the same (shared, possibly loaded) cores.

    python bench/env_latency.py [--episodes 256] [--turns 3] [--repeats 2]
"""

import argparse
import asyncio
import random
import time
from typing import Any

import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.runner import EnvRunner
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model

STOP = ("0", "1", "2")


class SleepEnv:
    """``turns`` turns; each step sleeps ``sleep_s`` (a tool call to a slow service), then answers."""

    def __init__(self, turns: int, sleep_s: float) -> None:
        self.turns, self.sleep_s, self.k = turns, sleep_s, 0

    def reset(self, sample: dict[str, Any]) -> Reset:
        return Reset([{"role": "user", "content": f"Q:{sample['i']}"}], stop=STOP)

    def _answer(self) -> Turn:
        self.k += 1
        if self.k >= self.turns:
            return Turn(done=True, reward=1.0, success=True)
        return Turn([{"role": "tool", "content": "<res>7</res>"}])

    def step(self, msg: AssistantMessage) -> Turn:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self._answer()


class AsyncSleepEnv(SleepEnv):
    async def step(self, msg: AssistantMessage) -> Turn:  # type: ignore[override]
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        return self._answer()


def run_once(engine: HFEngine, form: str, sleep_s: float, args: argparse.Namespace, runner: EnvRunner,
             seed: int) -> float:
    cls = AsyncSleepEnv if form == "async" else SleepEnv
    eps = []
    for i in range(args.episodes):
        env = TurnAdapter("bench", cls(args.turns, sleep_s), {"i": i}, TEXT_TOKENIZER,
                          runner=None if form == "blocking" else runner)
        eps.append(Episode.start(str(i), "b", env, random.Random(i)))
    t0 = time.perf_counter()
    engine.generate(eps, max_new_tokens=args.max_new_tokens, temperature=1.0, seed=seed)
    wall = time.perf_counter() - t0
    return sum(sum(e.loss_mask) for e in eps) / wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=160)
    p.add_argument("--sleeps-ms", type=float, nargs="+", default=[0, 10, 100])
    p.add_argument("--forms", nargs="+", default=["blocking", "sync", "async"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    arch = resolve_arch(ModelSpec(preset="tiny-llama"), TEXT_TOKENIZER.vocab_size, 512)
    engine = HFEngine(arch, dtype="float32", seed=0, pad_id=TEXT_TOKENIZER.pad_id)
    engine.load_weights(build_model(arch, seed=0).state_dict(), version=0)
    runner = EnvRunner(timeout_s=60.0, max_threads=max(64, args.episodes))
    run_once(engine, "async", 0.0, argparse.Namespace(**{**vars(args), "episodes": 16}), runner, 0)  # warm-up
    rows: dict[tuple[str, float], list[float]] = {}
    for rep in range(args.repeats):  # interleaved, so load changes hit every cell alike
        for ms in args.sleeps_ms:
            for form in args.forms:
                if form == "blocking" and ms >= 100 and rep > 0:
                    continue  # minutes per run; one is enough to show it
                rows.setdefault((form, ms), []).append(run_once(engine, form, ms / 1000, args, runner, seed=rep))
    print(f"episodes {args.episodes} x {args.turns} turns (stop at one of {STOP}), tiny-llama fp32, "
          f"{args.threads} torch threads; best of {args.repeats} (blocking at >= 100 ms: 1 run)")
    print(f"| step sleep | {' | '.join(f'{f} tok/s' for f in args.forms)} | "
          f"{' | '.join(f'{f} vs 0 ms' for f in args.forms)} |")
    print("|---|" + "---|" * (2 * len(args.forms)))
    base = {f: max(rows[(f, args.sleeps_ms[0])]) for f in args.forms}
    for ms in args.sleeps_ms:
        best = {f: max(rows[(f, ms)]) for f in args.forms}
        print(f"| {ms:g} ms | " + " | ".join(f"{best[f]:,.0f}" for f in args.forms) + " | "
              + " | ".join(f"{base[f] / best[f]:.2f}x" for f in args.forms) + " |")
    runner.close()


if __name__ == "__main__":
    main()
