"""Experiment 4 (paper Figures 4 and 10 analog): EWMA decay 0.5 / auto / 0.9, each with and without reset.

Usage::

    .venv/bin/python bench/paper/ewma.py [--quick] [--seeds 0 1 2] [--steps 40] [--out runs/paper]

``reference: ewma`` at W = 3; ``auto`` is the spec's staleness-aware decay (omitted ``decay``:
g/(g+1) with g = W/2, i.e. W/(W+2) = 0.6 here); reset on = the quickstart's rule (keep ratio below
0.8 for 3 consecutive versions). The auto-with-reset cell is the methods table's ``ewma`` run.
Writes ``ewma.md`` (final held-out success, AUC, keep ratio mean and minimum, resets per run) and
``ewma.png`` (held-out success and keep ratio per version, reset versions marked).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h  # noqa: E402

RESET_ON = {"enabled": True, "keepRatioBelow": 0.8, "consecutiveSteps": 3}
RESET_OFF = {"enabled": False}
DECAYS: dict[str, float | None] = {"0.5": 0.5, "auto": None, "0.9": 0.9}


def grid() -> list[h.Config]:
    out = []
    for dname, decay in DECAYS.items():
        for rname, reset in (("reset", RESET_ON), ("no reset", RESET_OFF)):
            if decay is None and reset is RESET_ON:
                out.append(h.Config(f"decay {dname}, {rname}", h.method("ewma").correction))
                continue
            ewma = {"reset": reset} if decay is None else {"decay": decay, "reset": reset}
            out.append(h.Config(f"decay {dname}, {rname}", h.correction("ewma", ewma=ewma)))
    return out


def resets(run: dict) -> list[int]:
    return [s["version"] for s in run["steps"] if s.get("ewma_reset")]


def main() -> int:
    args = h.parser(__doc__.splitlines()[0]).parse_args()
    cfgs = grid()
    scale, out, started, results = h.run_experiment(args, cfgs)
    header = ["ewma", "final held-out success", "AUC", "keep ratio mean", "keep ratio min", "resets per run",
              "reset versions (seed 0)"]
    rows = []
    for c in cfgs:
        runs = results[c.name]
        rows.append([c.name, *h.success_and_keep(runs, scale.level),
                     h.fmt([float(len(resets(r))) for r in runs], 1), str(resets(runs[0])) or "-"])
    table = h.markdown_table(header, rows)
    path = h.write_outputs(out, "ewma", table, [f"seeds: {list(scale.seeds)}", *h.describe(scale, started)])
    groups = {c.name: results[c.name] for c in cfgs}

    figure(out / "ewma.png", groups)
    print(table)
    print(f"wrote {path} and {out / 'ewma.png'}")
    return 0


def figure(path: Path, groups: dict) -> None:
    """Held-out success and keep ratio (means over seeds), a triangle per reset of every seed under the keep curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.2))
    for name, runs in groups.items():
        xs, m, s = h.mean_curve(runs)
        (line,) = axes[0].plot(xs, m, label=name, lw=1.4)
        xs, m, s = h.mean_curve(runs, "keep_ratio")
        axes[1].plot(xs, m, color=line.get_color(), lw=1.4, label=name)
        vs = [v for r in runs for v in resets(r)]
        axes[1].plot(vs, [min(m, default=1.0) - 0.01] * len(vs), "v", color=line.get_color(), ms=4, alpha=0.8)
    axes[0].set_title("held-out success (mean over seeds)", fontsize=9)
    axes[1].set_title("train-infer keep ratio (triangles: resets)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("policy version", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
