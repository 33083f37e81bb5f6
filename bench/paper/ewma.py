"""Experiment 4 (paper Figures 4 and 10 analog): EWMA decay 0.5 / 0.75 / 0.9 / auto, each with and without reset.

Usage::

    .venv/bin/python bench/paper/ewma.py [--quick] [--seeds 0 1 2 3 4] [--fresh]

``reference: ewma`` at W = 3 and the paper's thresholds; ``auto`` is the spec's staleness-aware decay
(omitted ``decay``: g/(g+1) with g = W/2, i.e. W/(W+2) = 0.6 here, centre of mass 1.5 versions back, the
mean version gap); decay 0.9 puts the centre of mass 9 versions back, so ``theta_prox`` lags the policies
that sampled the tokens and ``r_d = pi_prox / mu`` drifts out of the mask. Reset on = the paper's rule
(in-bounds ratio below tau for k = 3 consecutive versions, tau chosen below the noise floor, which
:func:`noise_floor` measures on the exact runs, where ``r_d`` is bf16 rounding alone). The auto-with-reset
cell is the methods table's ``ewma`` run. :func:`section` renders the noise floor and tau, the table
(resets per run and their versions, low-streak statistics), the paired tests and the figure.
"""

import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
import render as rd  # noqa: E402

DECAYS: dict[str, float | None] = {"0.5": 0.5, "0.75": 0.75, "0.9": 0.9, "auto": None}


def grid() -> list[h.Config]:
    out = []
    for dname, decay in DECAYS.items():
        for rname, on in (("reset", True), ("no reset", False)):
            if decay is None and on:
                out.append(h.Config(f"decay {dname}, {rname}", h.method("ewma").correction))
                continue
            ewma: dict[str, Any] = {"reset": h.reset_rule(on)}
            if decay is not None:
                ewma["decay"] = decay
            out.append(h.Config(f"decay {dname}, {rname}", h.correction("ewma", ewma=ewma)))
    return out


# Two blocks beside the base scale's, the same rule and thresholds at a higher learning rate per update:
# FAST_LR (3x the base: the rate of this page's earlier base scale) and STRESS_LR (10x). The policy moves
# further per version, so the current weights, the reference a reset restores, sit further from the policies
# that sampled, and a lagging reference drifts out of the mask faster. Each block has decay 0.9 and auto,
# reset on and off, and the ``current`` reference at its rate.
FAST_LR = 3e-4
STRESS_LR = 1e-3
BLOCK_DECAYS: dict[str, float | None] = {"0.9": 0.9, "auto": None}


def lr_grid(lr: float) -> list[h.Config]:
    out = [h.Config(f"lr {lr:g}: current", h.correction("current"), learning_rate=lr)]
    for dname, decay in BLOCK_DECAYS.items():
        for rname, on in (("reset", True), ("no reset", False)):
            ewma: dict[str, Any] = {"reset": h.reset_rule(on)}
            if decay is not None:
                ewma["decay"] = decay
            out.append(h.Config(f"lr {lr:g}: decay {dname}, {rname}", h.correction("ewma", ewma=ewma),
                                learning_rate=lr))
    return out


def stress_grid() -> list[h.Config]:
    return lr_grid(STRESS_LR)


def fast_grid() -> list[h.Config]:
    return lr_grid(FAST_LR)


def cfg(name: str) -> h.Config:
    return next(c for c in [*grid(), *fast_grid(), *stress_grid()] if c.name == name)


def quantile(xs: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = q * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def precision_only(ctx: rd.Context) -> list[dict[str, Any]]:
    """Runs whose ``r_d`` is bf16 rounding alone at every version: ``exact`` (snapshot ``pi_old``) and
    ``sync`` (W = 0: the reference is the weights that sampled)."""
    return [*ctx.runs(h.method("exact")), *ctx.runs(h.method("sync"))]


def longest_below(values: list[float], tau: float) -> int:
    best = run = 0
    for x in values:
        run = run + 1 if x < tau else 0
        best = max(best, run)
    return best


CANDIDATE_TAUS = (0.8, 0.9, 0.95)


def noise_floor(ctx: rd.Context) -> dict[str, Any]:
    """The in-bounds ratio from precision alone (:func:`precision_only`, every version), and at version 1 of
    every EWMA run (``theta_prox`` is still the weights that sampled); per candidate tau, the share of those
    batches below it and the precision-only runs with ``k`` of them in a row (a false reset)."""
    runs = precision_only(ctx)
    per_run = [h.series(r, "in_bounds_ratio")[1] for r in runs]
    flat = [x for xs in per_run for x in xs]
    first = [h.series(r, "in_bounds_ratio")[1][0] for c in grid() for r in ctx.runs(c) if r["curves"]["version"]]
    return {
        "n": len(flat), "runs": len(runs), "mean": statistics.fmean(flat) if flat else float("nan"),
        "p5": quantile(flat, 0.05), "p1": quantile(flat, 0.01), "min": min(flat, default=float("nan")),
        "v1_mean": statistics.fmean(first) if first else float("nan"), "v1_min": min(first, default=float("nan")),
        "v1_n": len(first),
        "taus": {t: (sum(x < t for x in flat), sum(longest_below(xs, t) >= h.RESET_K for xs in per_run))
                 for t in CANDIDATE_TAUS},
    }


def floor_text(f: dict[str, Any]) -> str:
    if not f["n"]:
        return "**Noise floor**: no precision-only records yet (the methods table's `exact` and `sync` runs).\n"
    k = h.RESET_K
    where = ("below the floor's 1st percentile, so a reset means the reference drifted, not rounding noise"
             if f["p1"] > h.RESET_TAU else "NOT below the floor's 1st percentile: precision noise alone crosses it")
    per_tau = "; ".join(f"tau {t}: {below} of {f['n']} batches below ({below / f['n']:.1%}), {runs} of {f['runs']} runs "
                        f"with {k} in a row" for t, (below, runs) in f["taus"].items())
    return (f"**Noise floor of the in-bounds ratio** (share of valid tokens with `r_d` in [0.99, 1.01] when `r_d` is "
            f"bf16 rounding alone): over every version of the `exact` and `sync` runs ({f['n']} batches of "
            f"{f['runs']} runs) mean {f['mean']:.4f}, 5th percentile {f['p5']:.4f}, 1st percentile {f['p1']:.4f}, "
            f"minimum {f['min']:.4f}; at version 1 of every EWMA run ({f['v1_n']} runs, `theta_prox` = the sampling "
            f"weights, so the staleness approximation has not yet erred) mean {f['v1_mean']:.4f}, minimum "
            f"{f['v1_min']:.4f}. Candidate thresholds against the precision-only batches ({k} in a row = a reset "
            f"that precision alone would trigger): {per_tau}. **Chosen: tau = {h.RESET_TAU}, k = {k}** (the paper's "
            f"value), {where}.")


def reset_versions(runs: list[dict[str, Any]]) -> str:
    parts = [f"s{r['seed']}: {r['resets']['versions']}" for r in runs if r["resets"]["count"]]
    return "; ".join(parts) or "none"


HEADER = ["ewma", "seeds", "final held-out success", "AUC", "in-bounds ratio", "in-bounds, last 10 versions",
          "resets / run", "reset versions (seed: versions)", "versions below tau / run", "longest low streak"]


def table_rows(ctx: rd.Context, cfgs: list[h.Config]) -> list[list[str]]:
    lv, rows = ctx.scale.level, []
    for c in cfgs:
        runs = ctx.runs(c)
        rows.append([c.name, str(len(runs)), rd.cell(rd.metric(runs, "final", lv)), rd.cell(rd.metric(runs, "auc", lv)),
                     rd.cell(rd.metric(runs, "mean:in_bounds_ratio", lv), 4),
                     rd.cell(rd.metric(runs, "late:in_bounds_ratio", lv), 4), rd.cell(rd.metric(runs, "resets", lv), 1),
                     reset_versions(runs), rd.cell([float(r["low_streak"]["versions_below"]) for r in runs], 1),
                     str(max((r["low_streak"]["longest"] for r in runs), default=0))])
    return rows


WINDOWS = ((1, 1), (2, 10), (11, 30), (31, 60))


def window_rows(ctx: rd.Context, cfgs: list[h.Config]) -> list[list[str]]:
    lv = ctx.scale.level
    return [[c.name, str(len(runs := ctx.runs(c))),
             *(rd.cell(rd.metric(runs, f"range:{a}:{b}:in_bounds_ratio", lv), 4) for a, b in WINDOWS)] for c in cfgs]


WINDOW_HEADER = ["run", "seeds", *(f"versions {a}-{b}" if a != b else f"version {a}" for a, b in WINDOWS)]


def collapse_text(ctx: rd.Context, lr: float, run: Mapping[str, list[dict[str, Any]]]) -> str:
    """Figure 10's reset-off twin at ``lr``: how far decay 0.9 without the reset falls, beside the reset-on twin
    and the ``current`` reference at the same rate (what a reset restores)."""
    off = run["decay 0.9, no reset"]
    lows = [min(h.series(r, "in_bounds_ratio")[1]) for r in off if r["curves"]["version"]]
    if not lows:
        return "**How far the mask falls without the reset (Figure 10's reset-off twin).** No records yet."
    lv = ctx.scale.level
    late = {n: rd.metric(run[n], "late:in_bounds_ratio", lv) for n in ("decay 0.9, no reset", "decay 0.9, reset", "current")}
    floor = noise_floor(ctx)
    return (f"**How far the mask falls without the reset (Figure 10's reset-off twin) at lr {lr:g}.** Over its last "
            f"10 versions decay 0.9 with the reset off keeps an in-bounds ratio of {rd.cell(late['decay 0.9, no reset'], 4)} (its lowest single version over all "
            f"{len(lows)} seeds {min(lows):.4f}), against a precision-only floor of {floor['mean']:.4f} (mean), "
            f"{rd.cell(late['decay 0.9, reset'], 4)} with the reset on, and {rd.cell(late['current'], 4)} for the "
            "current weights at the same rate (the reference a reset restores).")


def lr_section(ctx: rd.Context, lr: float) -> str:
    """The block of :data:`BLOCKS` at ``lr``: its table, in-bounds by window, the reset-off twin and the tests."""
    lv = ctx.scale.level
    cfgs = lr_grid(lr)
    run = {c.name.split(": ", 1)[1]: ctx.runs(c) for c in cfgs}
    tests = [
        rd.verdict_row(f"Fig. 10 at lr {lr:g}: the reset keeps decay 0.9's in-bounds ratio up", "reset",
                       run["decay 0.9, reset"], "no reset", run["decay 0.9, no reset"], "late:in_bounds_ratio", lv),
        rd.verdict_row(f"Fig. 4 at lr {lr:g}: decay 0.9 lags: its in-bounds ratio falls below auto's (no reset)",
                       "0.9", run["decay 0.9, no reset"], "auto", run["decay auto, no reset"], "late:in_bounds_ratio",
                       lv, -1),
        rd.verdict_row(f"Fig. 10 at lr {lr:g}: the reset fires more at decay 0.9 than at auto", "0.9",
                       run["decay 0.9, reset"], "auto", run["decay auto, reset"], "resets", lv),
        rd.verdict_row(f"Fig. 10 at lr {lr:g}: the reset helps decay 0.9 learn", "reset", run["decay 0.9, reset"],
                       "no reset", run["decay 0.9, no reset"], "auc", lv),
        rd.verdict_row(f"Fig. 4 at lr {lr:g}: auto above decay 0.9 (no reset)", "auto", run["decay auto, no reset"],
                       "0.9", run["decay 0.9, no reset"], "auc", lv),
        rd.verdict_row(f"§5.2 at lr {lr:g}: the EWMA (auto) tracks the sampling policies closer than the current "
                       "weights", "auto", run["decay auto, no reset"], "current", run["current"],
                       "mean:in_bounds_ratio", lv),
    ]

    def resets_at(name: str, runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
        return [(float(v), h.RESET_TAU - 0.02) for r in runs for v in r["resets"]["versions"]]

    fig = rd.figure(ctx, f"ewma_{BLOCKS[lr][0]}", f"EWMA at learning rate {lr:g}", [
        ("in-bounds ratio of r_d, 5-version mean (triangles: resets, every seed)", "in-bounds ratio", run,
         "in_bounds_ratio"),
        ("held-out success", "success", run, None),
    ], markers={0: resets_at}, hlines={0: [(h.RESET_TAU, f"tau = {h.RESET_TAU}")]}, smooth=5)
    return "\n".join([
        block_intro(lr), "", rd.markdown_table(HEADER, table_rows(ctx, cfgs[1:])), "",
        f"The in-bounds ratio by version window at lr {lr:g} (`current`: the reference a reset restores):", "",
        rd.markdown_table(WINDOW_HEADER, window_rows(ctx, cfgs)), "", collapse_text(ctx, lr, run),
        "", rd.markdown_table(rd.VERDICT_HEADER, ctx.tested(tests)), "", fig])


def block_intro(lr: float) -> str:
    """The opening paragraph of the block at ``lr``: its name, its rate and the question it asks (:data:`BLOCKS`)."""
    name, question = BLOCKS[lr]
    return (f"**The {name} block.** The same rule and thresholds with the policy moving faster per version: learning "
            f"rate {lr:g} per update (the base scale's {h.FULL.learning_rate:g} x {lr / h.FULL.learning_rate:.0f}), "
            f"everything else as above. {question}")


# Section 2's blocks at other rates: (name, what the block asks); the figure is ewma_<name>.png.
BLOCKS: dict[float, tuple[str, str]] = {
    FAST_LR: ("fast", "It is the base rate of earlier versions of this page. The tokens of every run are W = 3 "
                      "versions old when they train (the rollout worker runs ahead of the actor: the records' "
                      "`staleness_mean` is 3.0 from version 6 on), so the current weights, the reference a reset "
                      "restores, are 3 versions ahead of the policies that sampled: the faster the policy moves, the "
                      "further they are, and the more often the rule fires."),
    STRESS_LR: ("stress", "Does a lagging reference (decay 0.9) drift out of the mask when the policy moves faster, does "
                          "the mask collapse without the reset, and does the staleness-aware decay avoid both? (Before "
                          "commit 22e935d a job that loaded a cached warm start trained at the rate of the job that made "
                          "the cache, so earlier versions of this block ran at the base rate of that time, 3e-4; these "
                          "records ran at the rate the block names.)"),
}


def section(ctx: rd.Context) -> str:
    lv = ctx.scale.level
    header = HEADER
    rows = table_rows(ctx, grid())
    run = {c.name: ctx.runs(c) for c in grid()}
    tests = [
        rd.verdict_row("Fig. 4: decay 0.9 lags: its in-bounds ratio falls below auto's (no reset)", "0.9",
                       run["decay 0.9, no reset"], "auto", run["decay auto, no reset"], "late:in_bounds_ratio", lv, -1),
        rd.verdict_row("Fig. 4: decay 0.9 lags more than 0.75 (no reset)", "0.9", run["decay 0.9, no reset"], "0.75",
                       run["decay 0.75, no reset"], "late:in_bounds_ratio", lv, -1),
        rd.verdict_row("Fig. 10: the reset fires more at decay 0.9 than at auto", "0.9", run["decay 0.9, reset"], "auto",
                       run["decay auto, reset"], "resets", lv),
        rd.verdict_row("Fig. 10: the reset keeps decay 0.9's in-bounds ratio up", "reset", run["decay 0.9, reset"],
                       "no reset", run["decay 0.9, no reset"], "late:in_bounds_ratio", lv),
        rd.verdict_row("Fig. 10: the reset helps decay 0.9 learn", "reset", run["decay 0.9, reset"], "no reset",
                       run["decay 0.9, no reset"], "auc", lv),
        rd.verdict_row("Fig. 4: auto above decay 0.9 (no reset)", "auto", run["decay auto, no reset"], "0.9",
                       run["decay 0.9, no reset"], "auc", lv),
        rd.verdict_row("Fig. 4: decay 0.5 less efficient than auto", "auto", run["decay auto, no reset"], "0.5",
                       run["decay 0.5, no reset"], "auc", lv),
    ]
    by_window = window_rows(ctx, [h.method("sync"), h.method("exact"), h.method("current"), *grid()])
    floor = noise_floor(ctx)
    shown = ["decay 0.9, reset", "decay 0.9, no reset", "decay auto, reset", "decay auto, no reset", "decay 0.5, no reset"]
    groups = {n: run[n] for n in shown}

    def resets_at(name: str, runs: list[dict[str, Any]]) -> list[tuple[float, float]]:
        return [(float(v), h.RESET_TAU - 0.02) for r in runs for v in r["resets"]["versions"]]

    fig = rd.figure(ctx, "ewma", "EWMA in-bounds ratio and resets", [
        ("in-bounds ratio of r_d, 5-version mean (triangles: resets, every seed)", "in-bounds ratio", groups,
         "in_bounds_ratio"),
        ("held-out success", "success", groups, None),
    ], markers={0: resets_at}, hlines={0: [(h.RESET_TAU, f"tau = {h.RESET_TAU}"),
                                           (round(floor["mean"], 4), "noise floor (precision-only mean)")] if floor["n"] else []},
       smooth=5)
    return "\n".join([floor_text(floor), "", rd.markdown_table(header, rows), "",
                      "When the in-bounds ratio falls: its mean by version window (version 1: `theta_prox` is still the "
                      "sampling weights, so only precision counts; `sync` and `exact`: precision at every version; "
                      "`current`: the reference a reset restores, the weights at the batch's arrival):", "",
                      rd.markdown_table(WINDOW_HEADER, by_window), "",
                      f"tau = {h.RESET_TAU}, k = {h.RESET_K}; \"versions below tau\" and \"longest low streak\" count the "
                      "versions whose in-bounds ratio was below tau (with the reset off too: what the rule would have "
                      "seen). Paired tests over the seeds:", "",
                      rd.markdown_table(rd.VERDICT_HEADER, ctx.tested(tests)), "", fig, "",
                      *(part for lr in BLOCKS for part in (lr_section(ctx, lr), ""))])


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    # The noise floor reads the methods table's exact runs. --quick runs neither block at another rate: their cells
    # are the base grid's at another learning rate (the same code), their sections render empty there, and the
    # sections with records are rendered from the committed ones by tests/trainer/test_results_report.py.
    h.run_experiment(args, [*grid(), *([] if args.quick else [*fast_grid(), *stress_grid()])])
    import report

    print(report.render_one(args, "ewma", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
