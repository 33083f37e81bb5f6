"""Experiment 5 (paper Figure 5 analog): Proposition 1 in practice, loglinear vs the single total ratio.

Usage::

    .venv/bin/python bench/paper/prop1.py [--quick] [--seeds 0 1 2 3 4] [--fresh]

With a log-linear reference the decoupled ratios are powers of the total ratio ``r = pi_theta / mu``
(``asyncrl thresholds``, :mod:`asyncrl.trainer.thresholds`), so a run with ``reference: loglinear``
should be a run on ``r`` alone with re-parameterized bounds. The job spec has one clip for all
tokens while the effective bounds depend on each token's version gap ``n``, so the single-ratio
run (``reference: behavior``: ``r_s = r``, ``r_d = 1``) uses the bounds of the loglinear runs'
mean gap rounded: the effective clip of ``r_s`` on ``r``, and the upper effective mask bound as a
dual clip (a negative-advantage token above it gets no gradient, as the mask would reject it).
:func:`section` renders the bounds used, final success and AUC per run, the paired test, the exact
per-token check and the figure (held-out success and clip fraction per version).

The exact part -- the per-token keep decisions of the decoupled loss equal those of the single
ratio with per-gap effective bounds -- is :func:`keep_disagreements` on one batch with this run's
gap distribution (also a unit test, ``tests/trainer/test_bench_paper.py``).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402
import render as rd  # noqa: E402

W = h.W_PAPER


def effective(gap: int) -> tuple[dict, dict]:
    """(clip spec, dual clip) on ``r`` for a token of version gap ``gap`` under the base mask and clip."""
    from asyncrl.trainer.thresholds import effective_bounds

    m, c = h.BASE_MASK["bounds"], h.BASE_CLIP
    eb = effective_bounds((m["low"], m["high"]), (1 - c["low"], 1 + c["high"]), gap, "loglinear")
    return {"low": round(1 - eb.clip[0], 6), "high": round(eb.clip[1] - 1, 6)}, {"dualClip": round(eb.mask[1], 6)}


def single_ratio(gap: int) -> h.Config:
    clip, dual = effective(gap)
    return h.Config(f"single ratio (gap {gap} bounds)", h.correction("behavior", clip={**clip, **dual}))


def keep_disagreements(gaps: list[int], B: int = 64, T: int = 32, seed: int = 0) -> tuple[int, int]:
    """(tokens whose keep-and-unclipped decision differs, tokens) between the decoupled loglinear loss
    and the single ratio with per-gap effective bounds, on one batch whose gaps are drawn from ``gaps``."""
    import torch

    from asyncrl.trainer.correction import decoupled_pg_loss
    from asyncrl.trainer.oldlogits import reference_logp
    from asyncrl.trainer.thresholds import effective_bounds

    g = torch.Generator().manual_seed(seed)
    m, c = h.BASE_MASK["bounds"], h.BASE_CLIP
    log_mu = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3.0
    log_theta = (log_mu + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_(True)
    gap = torch.tensor(gaps)[torch.randint(len(gaps), (B, T), generator=g)]
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    actor = 10
    ref = reference_logp("loglinear", logp_mu=log_mu, logp_theta=log_theta, versions=actor - gap, actor_version=actor)
    res = decoupled_pg_loss(log_theta, ref, log_mu, adv, torch.ones(B, T, dtype=torch.bool), mode="mask",
                            level="token", mask_low=m["low"], mask_high=m["high"], veto_below=None,
                            clip_low=c["low"], clip_high=c["high"], dual_clip=None, aggregation="tokenMean")
    (grad,) = torch.autograd.grad(res.loss, log_theta)
    r = (log_theta.detach() - log_mu).exp()
    bounds = {n: effective_bounds((m["low"], m["high"]), (1 - c["low"], 1 + c["high"]), n, "loglinear")
              for n in set(gaps)}
    single = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            eb, x, a = bounds[int(gap[b, t])], float(r[b, t]), float(adv[b])
            kept = eb.mask[0] <= x <= eb.mask[1]
            single[b, t] = kept and ((a > 0 and x <= eb.clip[1]) or (a < 0 and x >= eb.clip[0]))
    return int((grad.ne(0) != single).sum()), B * T


def reference_runs(ctx: rd.Context) -> list[dict]:
    return ctx.runs(h.method("loglinear"))


def gap_of(ref_runs: list[dict]) -> tuple[float, int]:
    """The loglinear runs' mean version gap and the gap whose bounds the single-ratio run uses."""
    gaps = [x for r in ref_runs for x in h.series(r, "staleness_mean")[1]]
    mean_gap = sum(gaps) / len(gaps) if gaps else float(W) / 2
    return mean_gap, min(W, max(1, round(mean_gap)))


def section(ctx: rd.Context) -> str:
    ref_runs = reference_runs(ctx)
    mean_gap, gap = gap_of(ref_runs)
    cfg = single_ratio(gap)
    single_runs = ctx.runs(cfg)
    observed = sorted({int(x) for r in ref_runs for x in h.series(r, "staleness_max")[1]} | {0})
    bad, n = keep_disagreements(list(range(0, max(observed) + 1)))
    lv = ctx.scale.level
    header = ["run", "reference", "clip on the ratio", "seeds", "final held-out success", "AUC", "clip fraction"]
    rows = []
    for name, runs, c in (("loglinear", ref_runs, h.method("loglinear")), (cfg.name, single_runs, cfg)):
        cl = c.correction["clip"]
        clip_txt = f"[{1 - cl['low']:.4f}, {1 + cl['high']:.4f}]" + (
            f", dual {cl['dualClip']:.4f}" if "dualClip" in cl else "")
        rows.append([name, c.correction["reference"], clip_txt, str(len(runs)), rd.cell(rd.metric(runs, "final", lv)),
                     rd.cell(rd.metric(runs, "auc", lv)), rd.cell(rd.metric(runs, "mean:clip_or_reject_frac", lv), 4)])
    tests = [rd.verdict_row("Prop. 1: loglinear = single ratio (a difference would be the per-gap bounds)", "loglinear",
                            ref_runs, "single", single_runs, what, lv) for what in ("auc", "final")]
    notes = [
        f"- loglinear runs' mean version gap {mean_gap:.2f} -> single-ratio bounds of gap {gap} "
        f"(mask [{h.BASE_MASK['bounds']['low']}, {h.BASE_MASK['bounds']['high']}] on r_d, clip "
        f"[{1 - h.BASE_CLIP['low']}, {1 + h.BASE_CLIP['high']}] on r_s)",
        f"- exact per-token check on one batch (gaps {list(range(0, max(observed) + 1))}, per-gap effective bounds): "
        f"{bad} of {n} keep decisions differ",
    ]
    groups = {"loglinear": ref_runs, cfg.name: single_runs}
    return "\n".join([rd.markdown_table(header, rows), *notes, "", rd.markdown_table(rd.VERDICT_HEADER, ctx.tested(tests)), "",
                      rd.figure(ctx, "prop1", "Proposition 1", [
                          ("held-out success", "success", groups, None),
                          ("clip-or-reject fraction", "fraction", groups, "clip_or_reject_frac")])])


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    r = h.runner(args)
    try:
        ref_runs = r.results([h.method("loglinear")])["loglinear"]
        cfg = single_ratio(gap_of(ref_runs)[1])
        r.results([cfg])
    finally:
        r.close()
    import report

    print(report.render_one(args, "prop1", section))
    return 0


if __name__ == "__main__":
    sys.exit(main())
