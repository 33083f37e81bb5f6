"""Experiment 1 (paper Table 2 analog): every reference policy against sync, held-out success.

Usage::

    .venv/bin/python bench/paper/methods.py [--quick] [--seeds 0 1 2] [--steps 40] [--out runs/paper]

Runs ``behavior``, ``current`` (decoupled PPO with the weights at arrival), ``linear``, ``loglinear``,
``ewma`` (automatic decay W/(W+2)... as the spec computes it, with reset) and ``exact`` (snapshot
old logits) at W = 3, and synchronous training (W = 0, ``current`` = on-policy PPO) as the ceiling,
each for every seed, on the scale of :mod:`harness` (several minibatches per version so that the
staleness clip binds). Writes ``methods.md`` (final held-out success, area under the eval curve,
versions and training-loop seconds to the success level, loop seconds; mean ± std over seeds) and
``methods.png`` (mean held-out success per version, ±std band) into the output folder.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    scale, out, started, results = h.run_experiment(args, h.METHODS)
    header = ["method", "W", "final held-out success", "AUC (eval curve)",
              f"versions to {scale.level:.0%}", f"loop s to {scale.level:.0%}", "loop s"]
    rows = []
    for cfg in h.METHODS:
        m = [h.curve_metrics(r, scale.level) for r in results[cfg.name]]
        label = cfg.name + (" (snapshot)" if cfg.name == "exact" else "")
        rows.append([label, str(cfg.max_staleness), h.fmt([x["final"] for x in m]), h.fmt([x["auc"] for x in m]),
                     h.fmt([x["versions_to_level"] for x in m], 1), h.fmt([x["seconds_to_level"] for x in m], 1),
                     h.fmt([x["loop_s"] for x in m], 1)])
    table = h.markdown_table(header, rows)
    path = h.write_outputs(out, "methods", table, [f"seeds: {list(scale.seeds)}", *h.describe(scale, started)])
    h.figure(out / "methods.png", [
        ("held-out success (mean ± std over seeds)", "success", {c.name: results[c.name] for c in h.METHODS}, None),
        ("train-infer keep ratio", "keep ratio", {c.name: results[c.name] for c in h.METHODS}, "keep_ratio"),
    ])
    print(table)
    print(f"wrote {path} and {out / 'methods.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
