"""pass^k (rollout/envs/pass_k.py) against a brute-force reference: the mean over tasks of the fraction of
k-subsets of each task's trials that are all successes."""

import itertools
import random
from fractions import Fraction

import pytest

from asyncrl.rollout.envs.pass_k import pass_hat_curve, pass_hat_k, pass_hat_k_task


def _brute(successes: list[list[bool]], k: int) -> Fraction:
    per_task = []
    for trials in successes:
        subsets = list(itertools.combinations(range(len(trials)), k))
        per_task.append(Fraction(sum(all(trials[i] for i in s) for s in subsets), len(subsets)))
    return sum(per_task, Fraction(0)) / len(per_task)


def test_pass_hat_k_equals_the_subset_enumeration_on_random_tables() -> None:
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(1, 9)
        p = rng.random()
        table = [[rng.random() < p for _ in range(n)] for _ in range(rng.randint(1, 6))]
        for k in range(1, n + 1):
            assert pass_hat_k(table, k) == pytest.approx(float(_brute(table, k)), abs=1e-12), (table, k)


def test_pass_hat_k_known_values_and_shape() -> None:
    assert pass_hat_k([[True] * 8, [False] * 8], 4) == 0.5  # always-or-never tasks: flat in k
    half = [[True, False] * 4]
    assert pass_hat_k(half, 1) == 0.5 and pass_hat_k(half, 2) == pytest.approx(12 / 56)  # C(4,2)/C(8,2)
    curve = pass_hat_curve(half, [1, 2, 3, 4])
    assert all(curve[k] > curve[k + 1] for k in (1, 2, 3)) and curve[4] == pytest.approx(1 / 70)
    assert pass_hat_k_task(8, 3, 4) == 0.0  # fewer successes than k: never all k


def test_pass_hat_k_refuses_what_it_cannot_estimate() -> None:
    with pytest.raises(ValueError, match="k=5 must be in"):
        pass_hat_k([[True] * 4], 5)
    with pytest.raises(ValueError, match="same number of trials"):
        pass_hat_k([[True] * 4, [True] * 3], 1)
    with pytest.raises(ValueError, match="c=9"):
        pass_hat_k_task(8, 9, 1)
    with pytest.raises(ValueError, match="no tasks"):
        pass_hat_k([], 1)
