"""The held-out split of the built-in tasks: a fixed partition of each task's problem space.

A problem is *held out* when a keyed hash of its question text falls in one of
``HELDOUT_BUCKETS`` of ``BUCKETS`` buckets (1/8 of the problems): a property of the problem itself,
the same in every process, run and job, whatever the seed. Training (and the warm start's
demonstrations) draw only from the train side: :func:`draw_train` redraws a held-out problem from the
same generator, so the training distribution is the task's own one restricted to the train side
(a train-side problem keeps its probability up to the common factor 8/7) and every draw that
already landed on the train side is the same problem as before the split existed. The evaluation
draws only from the held-out side (:func:`heldout_problems`).

Sizes (from the generators; held-out counts enumerated by tests/rollout/test_math_envs.py):
``arithmetic`` has 3 x 9 x 9 = 243 problems, 36 held out; ``calculator`` 90 x 3 x 90 = 24,300, 3,043
held out; ``chain-calculator`` 2 x 90^3 x 3^2 (about 1.3e7, some questions twice).
"""

import hashlib
import random
from collections.abc import Callable
from typing import Protocol, TypeVar

BUCKETS = 8
HELDOUT_BUCKETS = 1  # buckets [0, HELDOUT_BUCKETS) are held out
_KEY = b"asyncrl-heldout-v1"  # changing it moves every problem: a new split
MAX_REDRAWS = 10_000  # a generator that never leaves one side is a bug, not bad luck


class Posed(Protocol):
    """What the split needs of a problem: the question text its hash is taken of (``math_tasks.Problem``)."""

    @property
    def question(self) -> str: ...


P = TypeVar("P", bound=Posed)
ProblemFn = Callable[[random.Random], P]  # a task's generator: rng -> one problem


def is_heldout(question: str) -> bool:
    """True when ``question`` (``Problem.question``, e.g. ``'(47+38)*12'``) is in the held-out split."""
    digest = hashlib.blake2b(question.encode(), digest_size=8, key=_KEY).digest()
    return int.from_bytes(digest, "big") % BUCKETS < HELDOUT_BUCKETS


def _draw(problem_fn: ProblemFn[P], rng: random.Random, heldout: bool, what: str) -> P:
    for _ in range(MAX_REDRAWS):
        p = problem_fn(rng)
        if is_heldout(p.question) == heldout:
            return p
    raise RuntimeError(f"{what}: {MAX_REDRAWS} draws of {getattr(problem_fn, '__name__', problem_fn)} "
                       f"found no {'held-out' if heldout else 'train'} problem")


def draw_train(problem_fn: ProblemFn[P], rng: random.Random) -> P:
    """A train-side problem: ``problem_fn(rng)``, redrawn from ``rng`` while it is held out."""
    return _draw(problem_fn, rng, False, "draw_train")


def heldout_problems(problem_fn: ProblemFn[P], n: int, seed: int) -> list[P]:
    """``n`` held-out problems drawn from ``Random(seed)``: the same list for the same arguments.

    Draws are independent (with replacement), so the share solved estimates success on the held-out
    distribution; a small problem space (``arithmetic``) repeats problems in a long list.
    """
    if n < 0:
        raise ValueError(f"heldout_problems: n must be >= 0, got {n}")
    rng = random.Random(seed)
    return [_draw(problem_fn, rng, True, "heldout_problems") for _ in range(n)]
