"""Experiment 2 (paper Table 3 and Table 6 analog): the system cost of each reference and exact route.

Usage::

    .venv/bin/python bench/paper/system_cost.py [--quick] [--steps 10]

Runs ``bench/old_logits.py`` in this process (``behavior`` as the baseline, ``ewma``, and the three
exact routes ``snapshot``, ``dedicated``, ``interruptSync``, at W = 3; see that script for what
each column measures) and writes its result as a record (``docs/results/data/system_cost.json``);
:func:`section` renders the per-step extras next to the paper's numbers at 4B/30B and the figure (extra
wall seconds per step in units of the baseline step, and extra resident memory in weight copies). The model here is a 0.3 M-parameter Llama on 2
shared cores, so absolute seconds and bytes are not comparable with the paper's: the ratios
(snapshot vs EWMA, resident versions) are.
"""

import hashlib
import json
import os
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


def record_path(args: object) -> Path:
    """Where the command's record goes: committed at full scale, under the output folder with --quick."""
    return h.out_dir(args) / "system_cost.json" if args.quick else h.ROOT / "docs" / "results" / "data" / "system_cost.json"


def main() -> int:
    p = h.parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="steps per strategy (full scale)")
    args = p.parse_args()
    out = h.out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    import old_logits  # bench/old_logits.py

    js = Path(tempfile.mkdtemp(prefix="asyncrl-paper-cost-")) / "cost.json"
    argv = ["--ws", str(h.W_PAPER), "--json", str(js), "--replicas", "1"]
    # The warm start only has to produce a policy that samples tool calls: the cost is per step.
    argv += ["--quick", "--ws", "1"] if args.quick else ["--steps", str(args.steps), "--warm-start-steps", "20"]
    load0, t0 = os.getloadavg()[0], time.monotonic()
    old_logits.main(argv)
    shown = [a for i, a in enumerate(argv) if a != "--json" and (i == 0 or argv[i - 1] != "--json")]
    data = json.loads(js.read_text())
    data.get("config", {}).pop("json", None)  # a temporary path of the machine that ran it: a record names none
    record = {"schema": 1, "argv": shown, "data": data,
              "wall_s": round(time.monotonic() - t0, 1), "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
              "cpus": os.cpu_count()}
    path = record_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(section(path, out))
    print(f"wrote {path} and {out / 'system_cost.png'}")
    return 0


def section(path: Path, figures: Path | None = None) -> str:
    """The table, the paper's numbers and the targets from the record at ``path``; the figure's PNG into
    ``figures`` when given (the markdown carries the hash of its data either way)."""
    if not path.exists():
        return f"No records yet (`{path.name}`: run `bench/paper/system_cost.py`).\n"
    from old_logits import BASELINE, STRATEGIES  # bench/old_logits.py

    record = json.loads(path.read_text())
    data = record["data"]
    rows_in = {r["strategy"]: r for r in data["rows"]}
    base = rows_in[BASELINE]
    weight = data["weight_bytes"]
    header = ["strategy", "+wall s/step", "(x baseline step)", "+actor s/step", "old-logit fwd s", "in fwds",
              "+memory (weight copies)", "switch s", "resident versions mean/max",
              "paper 4B / 30B: switch s, storage GB, extra s/step"]
    rows = []
    for name in STRATEGIES:
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
    cfg = data["config"]
    bars = {n: [round(rows_in[n]["extra_wall_s"] / max(base["step_wall_s"], 1e-9), 4),
                round(rows_in[n]["extra_memory_bytes"] / weight, 4)] for n in rows_in if n != BASELINE}
    digest = hashlib.sha256(json.dumps(bars, sort_keys=True).encode()).hexdigest()[:16]
    if figures is not None:
        _figure(figures / "system_cost.png", bars)
    return "\n".join([
        f"`bench/old_logits.py {' '.join(record['argv'])}` through `bench/paper/system_cost.py`: {cfg['steps']} steps x "
        f"{cfg['prompts']} prompts x {cfg['group']} samples, task {cfg['task']}, fp32 rollout (exact routes must give "
        f"r_d = 1), one weight copy {weight / 2**20:.3f} MiB; {record['wall_s']:.0f} s, load average "
        f"{record['load_avg'][0]}–{record['load_avg'][1]} on {record['cpus']} cores. The \"+wall\" and \"+actor\" "
        "columns compare runs made one after another on the shared machine (load noise, negative values included); "
        "the \"in fwds\" column (the old-logit forward in units of the same step's gradient forward, back to back in "
        "one process) and the memory columns are the robust ones.", "",
        h.markdown_table(header, rows), f"- {t6}", f"- {ratio}", *targets, "",
        f"![system cost](results/system_cost.png)\n<!-- figure system_cost.png data sha256 {digest} -->", ""])


def _figure(path: Path, bars: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(bars)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
    axes[0].bar(names, [bars[n][0] for n in names], color="tab:blue")
    axes[0].set_title("extra wall time per step (x baseline step)", fontsize=9)
    axes[1].bar(names, [bars[n][1] for n in names], color="tab:orange")
    axes[1].set_title("extra resident memory (weight copies)", fontsize=9)
    for ax in axes:
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
