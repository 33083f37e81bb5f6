"""Rerun one cell of ``docs/results.md`` and compare it with its committed record.

Usage::

    .venv/bin/python bench/paper/cell.py ewma "decay 0.9, reset" --seed 0   # one cell, one seed
    .venv/bin/python bench/paper/cell.py --list                              # every experiment's cells
    .venv/bin/python bench/paper/cell.py --rerun-spread [--seeds 0 1 2]      # section 8's identical reruns

A rerun writes into ``<out>/rerun/`` (never over the committed record) and prints, per metric, the
committed value, the new one and whether the difference lies within the largest difference two identical
runs of the same cell showed (section 8's records, tag ``rerun-1``). ``--rerun-spread`` writes those
``rerun-1`` records next to the committed ones, for ``decay 0.9, reset``.
"""

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
import records as rec  # noqa: E402
import render as rd  # noqa: E402

METRICS = (("final", "final held-out success"), ("auc", "AUC"), ("mean:in_bounds_ratio", "in-bounds ratio"),
           ("resets", "resets"))
SPREAD_TAG = "rerun-1"


def cells() -> dict[str, list[h.Config]]:
    import ewma
    import thresholds

    return {"methods": list(h.METHODS), "ewma": ewma.grid(), "ewma-fast": ewma.fast_grid(), "ewma-stress": ewma.stress_grid(),
            "thresholds": thresholds.grid()}


def find(experiment: str, name: str) -> h.Config:
    grid = cells()
    if experiment not in grid:
        raise SystemExit(f"experiment {experiment!r}: valid: {', '.join(grid)}")
    for c in grid[experiment]:
        if c.name == name:
            return c
    raise SystemExit(f"cell {name!r} is not in {experiment}; valid: {', '.join(repr(c.name) for c in grid[experiment])}")


def spread_cells() -> list[h.Config]:
    import ewma

    return [ewma.cfg("decay 0.9, reset")]  # a cell whose resets depend on the run's timing (W = 3, partial rollouts)


def spread(store: rec.Store, cfg: h.Config, what: str, level: float) -> float | None:
    """The largest |first - rerun| of ``what`` over the seeds run twice (None: no reruns recorded)."""
    seeds = store.seeds_of(cfg.key(), SPREAD_TAG)
    if not seeds:
        return None
    a = rd.metric(store.runs(cfg.key(), seeds), what, level)
    b = rd.metric(store.runs(cfg.key(), seeds, SPREAD_TAG), what, level)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def sampling_bound(what: str, prompts: int) -> float | None:
    """95 % bound on the difference of two final evaluations of ``prompts`` prompts each (binomial, p = 0.5:
    1.96 x sqrt(2 x 0.25 / prompts), 0.080 at 300): a rerun's final success moves by its own evaluation's
    sampling noise whatever a few measured reruns spread. None for metrics that are not one evaluation."""
    return 1.96 * (2 * 0.25 / prompts) ** 0.5 if what == "final" else None


def warm_start_note(old: Mapping[str, Any], new: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the rerun started from the committed record's warm start, and a line saying so: a record without a
    fingerprint (made before the harness kept one) is compared by its version-0 held-out success only."""
    a, b = old.get("warm_start"), new.get("warm_start")
    if a is not None and b is not None:
        if a == b:
            return True, f"warm start: the committed one (sha256 {a['sha256']}, {a['steps']} steps at seed {a['seed']})"
        return False, (f"warm start: DIFFERENT from the committed record's (sha256 {b['sha256']} vs {a['sha256']}): "
                       "the numbers below are not comparable")
    v0 = [r["eval"]["success"][0] if r["eval"]["success"] else float("nan") for r in (old, new)]
    return False, (f"warm start: the committed record keeps no fingerprint (made by an earlier harness); version-0 "
                   f"held-out success committed {v0[0]:.4f}, rerun {v0[1]:.4f}: not known to be the same start")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("experiment", nargs="?")
    p.add_argument("cell", nargs="?")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--list", action="store_true")
    p.add_argument("--rerun-spread", action="store_true")
    p.add_argument("--out", type=Path, default=Path("runs/paper"))
    args = p.parse_args(argv)
    if args.list:
        for exp, cfgs in cells().items():
            print(exp + ": " + ", ".join(repr(c.name) for c in cfgs))
        return 0
    work = args.out / "full"
    if args.rerun_spread:
        runner = h.Runner(h.FULL, h.RECORDS, work=work)
        try:
            for s in args.seeds:
                for c in spread_cells():
                    runner.result(c, s)
                    runner.result(c, s, SPREAD_TAG)
        finally:
            runner.close()
        return 0
    if not (args.experiment and args.cell):
        p.error("give an experiment and a cell (see --list), or --rerun-spread")
    cfg = find(args.experiment, args.cell)
    committed = rec.Store(h.RECORDS)
    old = committed.get(cfg.key(), args.seed)
    runner = h.Runner(h.FULL, work / "rerun", work=work, fresh=True)
    try:
        new = runner.result(cfg, args.seed)
    finally:
        runner.close()
    if old is None:
        print(f"no committed record of {cfg.name!r} seed {args.seed} ({rec.name_of(cfg.key(), args.seed)}); new run only")
        return 0
    same_start = warm_start_note(old, new)
    print(same_start[1])
    ok = same_start[0]
    for what, label in METRICS:
        a, b = rd.metric([old], what, h.FULL.level)[0], rd.metric([new], what, h.FULL.level)[0]
        bound = spread(committed, cfg, what, h.FULL.level)
        floor = sampling_bound(what, h.FULL.eval_prompts)
        if bound is None and floor is None:
            note = " (no identical-rerun spread recorded for this cell)"
        else:
            limit = max(x for x in (bound, floor) if x is not None)
            inside = abs(a - b) <= limit + 1e-12
            ok &= inside
            why = (f"the identical-rerun spread {bound:.4f}" if limit == bound else
                   f"the sampling bound of one evaluation {limit:.4f} (the recorded spread is "
                   + ("not recorded" if bound is None else f"{bound:.4f}") + ")")
            note = f" {'within' if inside else 'OUTSIDE'} {why}"
        print(f"{label}: committed {a:.4f}, rerun {b:.4f}, |difference| {abs(a - b):.4f}{note}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
