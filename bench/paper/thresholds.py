"""Experiment 3 (paper Figure 3 / Table 4 analog): discrepancy-mask bounds x clip bounds with exact old logits.

Usage::

    .venv/bin/python bench/paper/thresholds.py [--quick] [--seeds 0 1 2 3 4] [--fresh]

``reference: exact`` (snapshot), so ``r_d`` is the true train-inference ratio (bf16 rollout against the
fp32 actor, nothing else) and ``r_s`` the true staleness ratio. The grid is the paper's Table 4 block
around its main cell: mask ``[0.99, 1.01]`` with clip ``[0.997, 1.004]`` (the methods table's ``exact``
run, shared), the masks ``[0.995, 1.005]`` and ``[0.98, 1.02]`` at that clip, the clip ``[0.996, 1.006]``
at that mask, and the loose ``[0.5, 2]`` / 0.2 block of earlier versions of this page as a contrast.
:func:`section` renders the table, the Figure 3(b) coupling (with the mask fixed, a looser clip lowers
the keep ratio early, a tighter one lets it recover) as paired tests, and the figure.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
import render as rd  # noqa: E402

SNAPSHOT = {"strategy": "snapshot"}


def _cell(name: str, mask: tuple[float, float], clip: tuple[float, float]) -> h.Config:
    corr = h.correction("exact", mask={"mode": "mask", "level": "token", "bounds": {"low": mask[0], "high": mask[1]}},
                        clip={"low": round(1 - clip[0], 6), "high": round(clip[1] - 1, 6)})
    return h.Config(name, corr, SNAPSHOT)


def grid() -> list[h.Config]:
    paper = h.method("exact")
    return [
        h.Config("mask [0.99, 1.01], clip [0.997, 1.004] (paper)", paper.correction, SNAPSHOT),
        _cell("mask [0.995, 1.005], clip [0.997, 1.004]", (0.995, 1.005), (0.997, 1.004)),
        _cell("mask [0.98, 1.02], clip [0.997, 1.004]", (0.98, 1.02), (0.997, 1.004)),
        _cell("mask [0.99, 1.01], clip [0.996, 1.006]", (0.99, 1.01), (0.996, 1.006)),
        _cell("contrast: mask [0.5, 2], clip [0.8, 1.2]", (0.5, 2.0), (0.8, 1.2)),
    ]


def section(ctx: rd.Context) -> str:
    cfgs = grid()
    lv = ctx.scale.level
    header = ["exact (snapshot)", "seeds", "final held-out success", "AUC", "keep ratio", "keep ratio, versions 1-10",
              "keep ratio, last 10", "clip fraction"]
    rows = []
    for c in cfgs:
        runs = ctx.runs(c)
        rows.append([c.name, str(len(runs)), rd.cell(rd.metric(runs, "final", lv)), rd.cell(rd.metric(runs, "auc", lv)),
                     rd.cell(rd.metric(runs, "mean:keep_ratio", lv), 4), rd.cell(rd.metric(runs, "early:keep_ratio", lv), 4),
                     rd.cell(rd.metric(runs, "late:keep_ratio", lv), 4),
                     rd.cell(rd.metric(runs, "mean:clip_or_reject_frac", lv), 4)])
    tight, loose = ctx.runs(cfgs[0]), ctx.runs(cfgs[3])
    coupling = [
        rd.verdict_row("Fig. 3(b): looser clip lowers the keep ratio early", "clip [0.996, 1.006]", loose,
                       "clip [0.997, 1.004]", tight, "early:keep_ratio", lv, expected=-1),
        rd.verdict_row("Fig. 3(b): the tighter clip's keep ratio recovers late", "clip [0.997, 1.004]", tight,
                       "clip [0.996, 1.006]", loose, "late:keep_ratio", lv),
        rd.verdict_row("looser clip clips fewer tokens", "clip [0.996, 1.006]", loose, "clip [0.997, 1.004]", tight,
                       "mean:clip_or_reject_frac", lv, expected=-1),
        rd.verdict_row("tighter mask keeps fewer tokens", "mask [0.995, 1.005]", ctx.runs(cfgs[1]),
                       "mask [0.99, 1.01]", tight, "mean:keep_ratio", lv, expected=-1),
        rd.verdict_row("paper thresholds vs the loose contrast block", "paper", tight, "contrast", ctx.runs(cfgs[4]),
                       "auc", lv),
    ]
    groups = {c.name: ctx.runs(c) for c in cfgs}
    return "\n".join([
        rd.markdown_table(header, rows), "",
        "With exact old logits `r_d` is the bf16-vs-fp32 ratio alone, so the keep ratio here is the noise floor of "
        "each mask. Figure 3(b)'s coupling and the grid's orderings, paired over the seeds:", "",
        rd.markdown_table(rd.VERDICT_HEADER, ctx.tested(coupling)), "",
        rd.figure(ctx, "thresholds", "threshold grid", [
            ("held-out success", "success", groups, None),
            ("keep ratio of the mask on r_d, 5-version mean", "keep ratio", groups, "keep_ratio"),
            ("clip fraction on r_s, 5-version mean", "fraction", groups, "clip_or_reject_frac"),
        ], smooth=5),
    ])


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    h.run_experiment(args, grid())
    import report

    print(report.render_one(args, "thresholds", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
