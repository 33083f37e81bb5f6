"""Experiment 1 (paper Table 2 analog): every reference policy against sync, at the paper's thresholds.

Usage::

    .venv/bin/python bench/paper/methods.py [--quick] [--seeds 0 1 2 3 4] [--fresh]

Runs ``behavior``, ``current`` (decoupled PPO with the weights at arrival), ``linear``, ``loglinear``,
``ewma`` (the staleness-aware decay W/(W+2), with the reset rule) and ``exact`` (snapshot old logits)
at W = 3, and synchronous training (W = 0, ``current`` = on-policy PPO) as the ceiling, each for every
seed, with the mask ``[0.99, 1.01]`` on ``r_d`` and the clip ``[0.997, 1.004]`` on ``r_s`` (paper Table 4,
first block). Writes one record per run; :func:`section` renders the table, the paired tests of the
paper's orderings and the figure (``bench/paper/report.py`` puts it in ``docs/results.md``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
import render as rd  # noqa: E402

COLUMNS = ["method", "W", "seeds", "final held-out success", "AUC (eval curve)", "keep ratio", "in-bounds ratio",
           "clip fraction", "resets / run"]


def method_rows(ctx: rd.Context, cfgs: list[h.Config], label: str = "") -> list[list[str]]:
    lv = ctx.scale.level
    rows = []
    for cfg in cfgs:
        runs = ctx.runs(cfg)
        rows.append([cfg.name + label, str(cfg.max_staleness), str(len(runs)), rd.cell(rd.metric(runs, "final", lv)),
                     rd.cell(rd.metric(runs, "auc", lv)), rd.cell(rd.metric(runs, "mean:keep_ratio", lv), 4),
                     rd.cell(rd.metric(runs, "mean:in_bounds_ratio", lv), 4),
                     rd.cell(rd.metric(runs, "mean:clip_or_reject_frac", lv), 4), rd.cell(rd.metric(runs, "resets", lv), 1)])
    return rows


def orderings(ctx: rd.Context) -> list[list[str]]:
    """The paper's orderings of Table 2, each a paired test over the seeds (AUC and final success)."""
    r = {c.name: ctx.runs(c) for c in h.METHODS}
    lv = ctx.scale.level
    rows = []
    for what in ("auc", "final"):
        rows += [
            rd.verdict_row("PPO-EWMA above Decoupled PPO (current)", "ewma", r["ewma"], "current", r["current"], what, lv),
            rd.verdict_row("PPO-EWMA above Linear_prox", "ewma", r["ewma"], "linear", r["linear"], what, lv),
            rd.verdict_row("Loglinear_prox above Linear_prox", "loglinear", r["loglinear"], "linear", r["linear"], what, lv),
            rd.verdict_row("Snapshot (exact) above PPO-EWMA", "exact", r["exact"], "ewma", r["ewma"], what, lv),
            rd.verdict_row("Snapshot (exact) above behavior (bypass)", "exact", r["exact"], "behavior", r["behavior"], what, lv),
            rd.verdict_row("sync above async exact (per version)", "sync", r["sync"], "exact", r["exact"], what, lv),
        ]
    return rows


def section(ctx: rd.Context) -> str:
    out = [rd.markdown_table(COLUMNS, method_rows(ctx, list(h.METHODS))), "",
           "Mean ± 95 % confidence half-width over the seeds (Student t); keep ratio, in-bounds ratio and clip "
           "fraction are each run's mean over its versions. The paper's orderings, each a paired t test over the "
           "same seeds (same warm start, same held-out prompts):", "",
           rd.markdown_table(rd.VERDICT_HEADER, ctx.tested(orderings(ctx))), ""]
    groups = {c.name: ctx.runs(c) for c in h.METHODS}
    out.append(rd.figure(ctx, "methods", "methods at the paper's thresholds", [
        ("held-out success (mean ± std over seeds)", "success", groups, None),
        ("keep ratio (mask [0.99, 1.01] on r_d), 5-version mean", "keep ratio", groups, "keep_ratio"),
        ("clip fraction (clip [0.997, 1.004] on r_s), 5-version mean", "fraction", groups, "clip_or_reject_frac"),
    ], smooth=5))
    return "\n".join(out)


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    h.run_experiment(args, h.METHODS)
    import report

    print(report.render_one(args, "methods", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
