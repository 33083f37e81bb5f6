"""The supervised warm start's learning-rate schedule (pure).

RL on a task the policy never solves gets no signal (all-0 GRPO groups), so the driver first
imitates generated demonstrations (``asyncrl.rollout.envs.demos``). The measured recipe for the
built-in tasks (docs/architecture.md (the embedded model and tasks)) is AdamW at a peak of 3e-3 with a linear warm-up over
the first 10 % of steps (30 of 300) and a cosine decay to 10 % of the peak; the RL learning rate
(``train.learningRate``, typically 3e-4) is an order of magnitude lower and would leave the
imitation half-done in the same number of steps (measured here: sampled success 0.06 instead
of about 0.4 after 200 steps at 3e-4).

Threads. Nothing else computes during the warm start (rollout waits for the first weights), so the actor's
ranks get the cores -- split between the ranks that share a machine (:func:`warm_start_threads`). Each
rank giving torch every core oversubscribes them: ``ranks x cores`` OpenMP workers whose barriers spin
while another rank's workers hold the cores. Measured on 2 loaded cores (``bench/warm_start_dp.py``, the
``examples/data-parallel.yaml`` model and task): DP=2 at 2 threads per rank took 13.7x the DP=1 time per
step (300 steps: ~7 min against 31 s; on busier cores it did not finish in 34 min), at 1 thread per rank
1.7x (the gradient all-reduce and each rank's own optimizer step).
"""

import math
from collections import Counter
from collections.abc import Sequence

PEAK_LR = 3e-3
WARMUP_FRACTION = 0.1
FINAL_FRACTION = 0.1


def warm_start_lr(step: int, total: int, peak: float = PEAK_LR) -> float:
    """Learning rate of warm-start step ``step`` (0-based) of ``total``."""
    if not 0 <= step < total:
        raise ValueError(f"step must be in [0, {total}), got {step}")
    warmup = max(1, round(WARMUP_FRACTION * total))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup - 1)
    return peak * (FINAL_FRACTION + (1 - FINAL_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def warm_start_threads(cores: float, rank_hosts: Sequence[str] = ()) -> int:
    """Torch threads of each actor rank during the warm start: ``cores`` (one machine's) split between the
    most ranks on one host (``rank_hosts``: each rank's host; empty = one rank), so that ranks x threads <=
    cores on every machine (at least 1 each)."""
    sharing = max(Counter(rank_hosts).values(), default=1)
    return max(1, int(cores) // sharing)
