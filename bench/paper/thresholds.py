"""Experiment 3 (paper Figure 3 analog): discrepancy-mask bounds x clip bounds with exact old logits.

Usage::

    .venv/bin/python bench/paper/thresholds.py [--quick] [--seeds 0 1 2] [--steps 40] [--out runs/paper]

``reference: exact`` (snapshot), so ``r_d`` is the true train-inference ratio and ``r_s`` the true
staleness ratio; the grid crosses a tight and a loose mask on ``r_d`` (``mode: mask``, token level)
with a tight and a loose PPO clip on ``r_s``. The loose mask with clip 0.2 is the methods table's
``exact`` run (shared from the cache). Writes ``thresholds.md`` (final held-out success, AUC,
mean and minimum keep ratio, mean clip fraction; mean ± std over seeds) and ``thresholds.png``
(held-out success and keep ratio per version).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402

MASKS = {"mask 0.98-1.02": (0.98, 1.02), "mask 0.5-2": (0.5, 2.0)}
CLIPS = {"clip 0.1": 0.1, "clip 0.2": 0.2}


def grid() -> list[h.Config]:
    out = []
    for mname, (lo, hi) in MASKS.items():
        for cname, eps in CLIPS.items():
            if (lo, hi) == (0.5, 2.0) and eps == 0.2:
                out.append(h.Config(f"{mname}, {cname}", h.method("exact").correction, {"strategy": "snapshot"}))
                continue
            corr = h.correction("exact", mask={"mode": "mask", "level": "token", "bounds": {"low": lo, "high": hi}},
                                clip={"low": eps, "high": eps})
            out.append(h.Config(f"{mname}, {cname}", corr, {"strategy": "snapshot"}))
    return out


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    cfgs = grid()
    scale, out, started, results = h.run_experiment(args, cfgs)
    header = ["exact (snapshot)", "final held-out success", "AUC", "keep ratio mean", "keep ratio min",
              "clip fraction mean"]
    rows = []
    for c in cfgs:
        runs = results[c.name]
        clip = [h.step_series(r, "clip_or_reject_frac")[1] for r in runs]
        rows.append([c.name, *h.success_and_keep(runs, scale.level), h.fmt([sum(k) / len(k) for k in clip], 4)])
    table = h.markdown_table(header, rows)
    path = h.write_outputs(out, "thresholds", table, [f"seeds: {list(scale.seeds)}", *h.describe(scale, started)])
    groups = {c.name: results[c.name] for c in cfgs}
    h.figure(out / "thresholds.png", [("held-out success", "success", groups, None),
                                       ("train-infer keep ratio", "keep ratio", groups, "keep_ratio")])
    print(table)
    print(f"wrote {path} and {out / 'thresholds.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
