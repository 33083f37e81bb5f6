"""Experiment 2 (paper Table 3 and Table 6 analog): the system cost of each reference and exact route.

Usage::

    .venv/bin/python bench/paper/system_cost.py [--quick] [--steps 10] [--out runs/paper]

Runs ``bench/old_logits.py`` in this process (``behavior`` as the baseline, ``ewma``, and the three
exact routes ``snapshot``, ``dedicated``, ``interruptSync``, at W = 3; see that script for what
each column measures) and writes ``system_cost.md`` -- its per-step extras next to the paper's
numbers at 4B/30B -- and ``system_cost.png`` (extra wall seconds per step in units of the baseline
step, and extra resident memory in weight copies). The model here is a 0.3 M-parameter Llama on 2
shared cores, so absolute seconds and bytes are not comparable with the paper's: the ratios
(snapshot vs EWMA, resident versions) are.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import harness as h  # noqa: E402

# Paper Table 3(b) (left: snapshot vs PPO-EWMA) and Table 6 (snapshot, 4B / 30B-A3B).
PAPER = {
    "snapshot": {"switch_s": (7.0, 14.2), "storage_gb": (40.0, 76.4), "extra_s": (25.0, 150.0)},
    "ewma": {"switch_s": (7.0, 14.2), "storage_gb": (7.9, 15.2), "extra_s": (8.0, 34.0)},
}
PAPER_TABLE6 = {"snapshot_stage_s_per_step": (95.20, 178.22), "historical_forward_s": (45.05, 147.18),
                "max_resident_snapshots": (5, 5), "snapshot_size_gb": (8.04, 15.29)}


def main() -> int:
    p = h.parser(__doc__.splitlines()[0])
    args = p.parse_args()
    out = h.out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    import old_logits  # bench/old_logits.py

    js = Path(tempfile.mkdtemp(prefix="asyncrl-paper-cost-")) / "cost.json"
    argv = ["--ws", str(h.W_PAPER), "--json", str(js), "--replicas", "1"]
    # The warm start only has to produce a policy that samples tool calls: the cost is per step.
    argv += ["--quick", "--ws", "1"] if args.quick else ["--steps", str(args.steps or 10), "--warm-start-steps", "20"]
    old_logits.main(argv)
    data = json.loads(js.read_text())
    rows_in = {r["strategy"]: r for r in data["rows"]}
    base = rows_in[old_logits.BASELINE]
    weight = data["weight_bytes"]
    header = ["strategy", "+wall s/step", "(x baseline step)", "+actor s/step", "old-logit fwd s", "in fwds",
              "+memory (weight copies)", "switch s", "resident versions mean/max",
              "paper 4B / 30B: switch s, storage GB, extra s/step"]
    rows = []
    for name in old_logits.STRATEGIES:
        r = rows_in.get(name)
        if r is None:
            continue
        paper = PAPER.get(name)
        ptxt = "-" if paper is None else "; ".join(
            f"{a:g} / {b:g}" for a, b in (paper["switch_s"], paper["storage_gb"], paper["extra_s"]))
        resident = "-" if r["resident_mean"] is None else f"{r['resident_mean']:.2f} / {r['resident_max']}"
        rows.append([name, f"{r['extra_wall_s']:+.4f}", f"{r['extra_wall_s'] / max(base['step_wall_s'], 1e-9):+.2f}",
                     f"{r['extra_step_s']:+.4f}", f"{r['reference_s']:.4f}", f"{r['reference_forwards']:.2f}",
                     f"{r['extra_memory_bytes'] / weight:.2f}", "-" if r["switch_s"] is None else f"{r['switch_s']:.4f}",
                     resident, ptxt])
    table = h.markdown_table(header, rows)
    t6 = ("paper Table 6 (snapshot, 4B / 30B-A3B): snapshot-old stage "
          f"{PAPER_TABLE6['snapshot_stage_s_per_step'][0]} / {PAPER_TABLE6['snapshot_stage_s_per_step'][1]} s per step, "
          f"historical forward {PAPER_TABLE6['historical_forward_s'][0]} / {PAPER_TABLE6['historical_forward_s'][1]} s, "
          f"max resident snapshots 5 / 5, snapshot size {PAPER_TABLE6['snapshot_size_gb'][0]} / "
          f"{PAPER_TABLE6['snapshot_size_gb'][1]} GB; paper snapshot/EWMA extra time 25/8 = 3.1x (4B), 150/34 = 4.4x (30B)")
    snap, ew = rows_in.get("snapshot"), rows_in.get("ewma")
    ratio = (f"here snapshot/EWMA extra actor time: {snap['extra_step_s']:.4f} / {ew['extra_step_s']:.4f} s; "
             f"old-logit forward {snap['reference_s']:.4f} / {ew['reference_s']:.4f} s"
             if snap and ew else "snapshot or ewma not run")
    targets = [f"- [{ {True: 'met', False: 'NOT MET', None: 'not measured'}[t['met']] }] {t['name']}: {t['detail']}"
               for t in data["targets"]]
    body = table + "\n" + "\n".join([f"- {t6}", f"- {ratio}", *targets]) + "\n"
    cfg = data["config"]
    shown = [a for i, a in enumerate(argv) if a != "--json" and (i == 0 or argv[i - 1] != "--json")]
    path = h.write_outputs(out, "system_cost", body, [
        *h.describe(h.QUICK if args.quick else h.FULL, started)[:1],
        f"runs: bench/old_logits.py {' '.join(shown)}",
        f"{cfg['steps']} steps x {cfg['prompts']} prompts x {cfg['group']} samples, task {cfg['task']}, "
        f"one weight copy {weight / 2**20:.3f} MiB", *h.describe(h.QUICK if args.quick else h.FULL, started)[1:]])
    _figure(out / "system_cost.png", rows_in, base, weight)
    print(body)
    print(f"wrote {path} and {out / 'system_cost.png'}")
    return 0


def _figure(path: Path, rows: dict, base: dict, weight: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in rows if n != "behavior"]
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
    axes[0].bar(names, [rows[n]["extra_wall_s"] / max(base["step_wall_s"], 1e-9) for n in names], color="tab:blue")
    axes[0].set_title("extra wall time per step (x baseline step)", fontsize=9)
    axes[1].bar(names, [rows[n]["extra_memory_bytes"] / weight for n in names], color="tab:orange")
    axes[1].set_title("extra resident memory (weight copies)", fontsize=9)
    for ax in axes:
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
