"""pass^k: the chance that an agent solves a task in *every one* of k independent trials (τ-bench).

pass@k asks for one success in k tries; an agent deployed to many users needs the opposite, reliability:
pass^k = E_task[ P(all k trials succeed) ]. From ``n >= k`` trials of a task with ``c`` successes the unbiased
estimate of that task's term is ``C(c, k) / C(n, k)`` (the fraction of the task's k-subsets of trials that are
all successes, Yao et al. 2024, τ-bench §4); pass^k is its mean over the tasks. pass^1 is the plain success
rate, and pass^k falls with k unless every task is solved always or never.

``python -m asyncrl.rollout.envs.pass_k RECORD.json [--k 4]`` prints pass^1..k of every evaluation in a record
of ``bench/customer_service.py`` (its ``points``, each with the ``trials`` table ``[task][trial]`` of 0/1), or of
a JSON file holding one such table.
"""

import argparse
import json
from collections.abc import Sequence
from math import comb
from pathlib import Path
from typing import Any


def pass_hat_k_task(n: int, c: int, k: int) -> float:
    """``C(c, k) / C(n, k)``: one task's pass^k from ``c`` successes in ``n`` trials (``1 <= k <= n``)."""
    if not 0 <= c <= n:
        raise ValueError(f"pass^k: successes c={c} must be in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"pass^k: k={k} must be in [1, n={n}] (n trials per task); run more trials or a smaller k")
    return comb(c, k) / comb(n, k)


def pass_hat_k(successes: Sequence[Sequence[bool]], k: int) -> float:
    """pass^k over tasks: ``successes[i]`` holds task i's trials (every task the same number ``n >= k``)."""
    if not successes:
        raise ValueError("pass^k: no tasks")
    ns = {len(t) for t in successes}
    if len(ns) != 1:
        raise ValueError(f"pass^k: every task needs the same number of trials, got {sorted(ns)}")
    return sum(pass_hat_k_task(len(t), sum(map(bool, t)), k) for t in successes) / len(successes)


def pass_hat_curve(successes: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict[int, float]:
    """``{k: pass^k}`` for each ``k`` in ``ks``."""
    return {k: pass_hat_k(successes, k) for k in ks}


def _tables(doc: Any) -> list[tuple[str, list[list[bool]]]]:
    if isinstance(doc, list):
        return [("trials", [[bool(x) for x in t] for t in doc])]
    points = doc.get("points") if isinstance(doc, dict) else None
    if not isinstance(points, list):
        raise SystemExit("pass_k: the file holds neither a [task][trial] table nor a record with 'points'")
    return [(f"{p.get('label', i)}", [[bool(x) for x in t] for t in p["trials"]]) for i, p in enumerate(points)]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="pass^1..k (tau-bench) of per-task trial tables")
    ap.add_argument("path", type=Path, help="a bench/customer_service.py record, or a JSON [task][trial] table")
    ap.add_argument("--k", type=int, default=4, help="largest k (at most the trials per task)")
    args = ap.parse_args(argv)
    ks = list(range(1, args.k + 1))
    print("evaluation".ljust(24) + "".join(f"pass^{k}".rjust(9) for k in ks))
    for label, table in _tables(json.loads(args.path.read_text())):
        curve = pass_hat_curve(table, ks)
        print(label.ljust(24) + "".join(f"{curve[k]:9.3f}" for k in ks))


if __name__ == "__main__":
    main()
