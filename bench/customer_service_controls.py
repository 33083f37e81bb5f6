"""The customer-service controls that could win (issue 39), as arms of ``bench/customer_service.py``.

RL's gain means something only against controls that could have won without RL. Each arm starts from the same
warm start as RL (version 0) and gets RL's budget, matched (``--match``) either in **samples generated** (RL's
``rl_steps x prompts x group`` episodes; a supervised arm's demonstrations count as samples) or in **training wall
time** (the RL run's); its weights are evaluated at the same fractions of that budget, on the same held-out tasks
with the same sampler seeds as RL's checkpoints:

- ``sft_success``: supervised training on successful demonstrations only (``SUCCESS_MIX``: the skill's calls,
  which the environment generates for free -- an advantage RL does not have), at a learning rate tuned first
  (:data:`SUCCESS_RATES`, each for a quarter of the budget, scored on validation scenarios that are not the
  evaluation's; the grid and its scores are in the record);
- ``rft``: rejection-sampling fine-tuning: each round samples ``prompts x group`` episodes of training scenarios
  from the current policy (the rollout engine, T = 1, as RL's), keeps the successful ones and takes one supervised
  step on them at ``rft_rate``; as many rounds as RL has steps, so the same rollout budget;
- ``shuffled`` (``bench/customer_service.py``'s RL run with ``task.args.shuffle_rewards``): RL whose rewards are
  recent episodes' outcomes drawn at random, the same rate without the link to the episode
  (``CustomerService``'s docstring).

``sft`` (the old control, the warm start's imitation continued) stays: it is what the page reported before.
"""

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

SUCCESS_RATES = (1e-4, 3e-4, 1e-3, 3e-3)  # the supervised control's grid (the warm start peaks at 3e-3)
VALIDATION_SEED = 4049  # held-out scenarios for the tuning, not the evaluation's (EVAL_SEED)
Match = Literal["samples", "time"]
Demo = tuple[list[int], list[bool]]


@dataclass(frozen=True)
class Budget:
    """An arm's budget, RL's: ``samples`` episodes generated in ``seconds`` of training wall time."""

    samples: int
    seconds: float
    match: Match

    def spent(self, samples: int, seconds: float) -> float:
        """The fraction of the budget used after ``samples`` samples in ``seconds``."""
        return samples / self.samples if self.match == "samples" else seconds / self.seconds


def rl_budget(rl: Mapping[str, Any], samples: int, match: Match) -> Budget:
    """RL's budget from its record (``train_seconds``) and its generated episode count."""
    return Budget(samples, float(rl["train_seconds"]), match)


def best_rate(scores: Mapping[float, float]) -> float:
    """The rate with the highest validation success; a tie goes to the lower rate (the more conservative)."""
    if not scores:
        raise ValueError("best_rate: no rate was tried")
    return min(scores, key=lambda lr: (-scores[lr], lr))


@dataclass
class Arm:
    """One supervised arm's loop: ``batch()`` gives (the demonstrations of one step, the samples it generated)."""

    kind: str
    host: Any  # a Ray ActorHost handle, the warm start loaded
    batch: Callable[[], tuple[list[Demo], int]]
    learning_rate: float

    def run(self, budget: Budget, fractions: Sequence[float],
            at_point: Callable[[int, float, float, Mapping[str, Any]], None]) -> dict[str, Any]:
        """Train until each fraction of ``budget`` is spent, calling ``at_point(k, fraction, seconds, weights)``
        at each (its time is not the arm's); the arm's counters."""
        import ray

        samples, steps, losses, empty = 0, 0, list[float](), 0
        t0 = time.monotonic()
        for k, due in enumerate(fractions, start=1):
            while budget.spent(samples, time.monotonic() - t0) < due:
                demos, n = self.batch()
                samples += n
                if demos:
                    losses.append(ray.get(self.host.supervised.remote(demos, self.learning_rate, 2)))
                    steps += 1
                else:
                    empty += 1  # a round with no success: nothing to imitate
            held = time.monotonic() - t0
            weights = ray.get(self.host.weights.remote())
            pause = time.monotonic()
            at_point(k, budget.spent(samples, held), held, {"samples": samples, "sft_steps": steps, "weights": weights})
            t0 += time.monotonic() - pause  # the evaluation is not the arm's time
        return {"samples": samples, "sft_steps": steps, "empty_rounds": empty, "learning_rate": self.learning_rate,
                "loss_first": round(losses[0], 4) if losses else None,
                "loss_last": round(losses[-1], 4) if losses else None}


def success_demos(tokenizer: Any, max_tool_calls: int, seed: int, batch: int = 128) -> Callable[[], tuple[list[Demo], int]]:
    """``batch`` successful demonstrations per step (``SUCCESS_MIX``), drawn from ``seed``."""
    from asyncrl.rollout.envs.customer_service import SUCCESS_MIX
    from asyncrl.rollout.envs.demos import demonstrations

    rng = random.Random(seed)
    return lambda: (demonstrations("customer-service", batch, rng, mix=SUCCESS_MIX, max_tool_calls=max_tool_calls,
                                   tokenizer=tokenizer), batch)


def own_successes(host: Any, arch: Any, tokenizer: Any, *, prompts: int, group: int, max_new_tokens: int,
                  temperature: float, seed: int) -> Callable[[], tuple[list[Demo], int]]:
    """One RFT round: ``prompts x group`` episodes of training scenarios from the host's current weights (the
    rollout engine, in this process), the successful ones as demonstrations."""
    import ray
    import torch

    from asyncrl.rollout.envs.adapter import TurnAdapter
    from asyncrl.rollout.envs.customer_service import CustomerService, ScenarioSamples
    from asyncrl.rollout.episode import Episode
    from asyncrl.rollout.hf_engine import HFEngine

    rng, samples, rounds = random.Random(seed), ScenarioSamples(), [0]

    def batch() -> tuple[list[Demo], int]:
        rounds[0] += 1
        engine = HFEngine(arch, dtype="float32", seed=seed * 1000 + rounds[0], pad_id=tokenizer.pad_id)
        engine.load_weights({k: torch.as_tensor(v) for k, v in ray.get(host.weights.remote()).items()}, version=0)
        tasks = [samples.train(0, i, rng) for i in range(prompts)]
        eps = [Episode.start(f"r{i}-{j}", f"r{i}", TurnAdapter("customer-service", CustomerService(4), t, tokenizer),
                             random.Random(j)) for i, t in enumerate(tasks) for j in range(group)]
        engine.generate(eps, max_new_tokens=max_new_tokens, temperature=temperature, partial_rollout=False,
                        seed=seed * 1000 + rounds[0])
        return [(list(e.tokens), list(e.loss_mask)) for e in eps if e.success], len(eps)

    return batch
