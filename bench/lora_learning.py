"""LoRA against full fine-tuning: learning at equal wall time (issue 38; plan: docs/results/lora-learning-plan.md).

Usage::

    nice -n 10 .venv/bin/python bench/lora_learning.py base      # the warm start, exported as the HF base folder
    nice -n 10 .venv/bin/python bench/lora_learning.py tune      # the rates, on seeds 100 and 101 (the plan's grid)
    nice -n 10 .venv/bin/python bench/lora_learning.py confirm [--stop-at HH:MM]   # seeds 0..9, both arms
    .venv/bin/python bench/lora_learning.py report [--check]     # the table and verdict into docs/lora.md

Both arms start from one full-weight base: the paper harness's supervised warm start of the calculator task
(``bench/paper/harness.py``, made once and cached), exported as a Hugging Face folder and set as
``model.weights`` with no warm start of their own. ``full`` trains every weight, ``lora`` rank-16 adapters on
every projection; both run ``reference: exact`` with ``oldLogits.strategy: snapshot``. Each (arm, seed) is one
run of the harness (:class:`harness.Runner`, its records and statistics), its JSON record in
``docs/results/data/lora_learning/`` (``tuning/`` for the rate grid). The LoRA arm's records also keep every
trained batch's per-token versions, run-length encoded (``batches``): ``bench/lora_spans.py --mix-from`` replays
them to time the exact route on the batches a job makes.

**Equal wall time.** A run's curve is held-out success against training-loop seconds (the evaluations taken
out). For each seed both arms are read at ``T = min`` of their final loop seconds, the faster arm at its last
evaluation and the other interpolated linearly (:func:`success_at`); the two arms of a seed run back to back,
the first one alternating with the seed's parity, so the shared machine's drifting load hits both alike.
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "paper"))

import harness as h  # noqa: E402
import page_blocks  # noqa: E402
import records as rec  # noqa: E402
import stats  # noqa: E402

ROOT = HERE.parent
DATA = ROOT / "docs" / "results" / "data" / "lora_learning"
TUNING = DATA / "tuning"
DOC = ROOT / "docs" / "lora.md"
FIGURE = ROOT / "docs" / "results" / "lora_learning.png"
BEGIN, END = "<!-- BEGIN GENERATED lora_learning -->", "<!-- END GENERATED lora_learning -->"

SCALE = replace(h.FULL, eval_every=10, seeds=tuple(range(10)))  # the plan: evaluations every 10 versions
TUNING_SEEDS = (100, 101)
LORA = {"lora": {"rank": 16, "alpha": 32.0, "dropout": 0.0,
                 "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}}
EXACT = h.correction("exact")
SNAPSHOT = {"strategy": "snapshot"}
RATES = {"full": (1e-4, 3e-4), "lora": (3e-4, 1e-3, 3e-3)}  # the plan's tuning grid
MIN_SEEDS = 5  # the plan's least number of paired seeds for a report (it runs 10)
MARGIN = 0.05  # the plan's equivalence / non-inferiority margin (held-out success)
LATE = (40, 50, 60)  # S1 and the tuning score: mean success at these versions minus version 0
BOOT_RESAMPLES, BOOT_SEED = 10_000, 0


def arm(name: str, learning_rate: float) -> h.Config:
    """One arm of the plan at ``learning_rate`` (the record's key digests the rate and, for LoRA, the adapters)."""
    if name not in RATES:
        raise ValueError(f"arm {name!r}: valid arms are {', '.join(RATES)}")
    return h.Config(f"{name}@{learning_rate:g}", EXACT, old_logits=SNAPSHOT, learning_rate=learning_rate,
                    model=LORA if name == "lora" else None)


# --- the equal-time reading and the statistics (pure) ------------------------------------------
def success_at(loop_s: Sequence[float], success: Sequence[float], t: float) -> float:
    """Held-out success at training-loop second ``t``: linear between the two evaluations around ``t``.

    ``loop_s`` rises (the evaluations in order); ``t`` must lie within it (the fair reading never extrapolates)."""
    if len(loop_s) != len(success) or not loop_s:
        raise ValueError(f"success_at needs one success per evaluation; got {len(loop_s)} and {len(success)}")
    if any(b < a for a, b in zip(loop_s, loop_s[1:], strict=False)):
        raise ValueError(f"evaluation seconds must not fall: {list(loop_s)}")
    if not loop_s[0] <= t <= loop_s[-1]:
        raise ValueError(f"second {t} lies outside the curve's [{loop_s[0]}, {loop_s[-1]}]: never extrapolated")
    for i in range(1, len(loop_s)):
        a, b = loop_s[i - 1], loop_s[i]
        if t <= b:
            if b == a:
                return float(success[i])
            w = (t - a) / (b - a)
            return float(success[i - 1] + w * (success[i] - success[i - 1]))
    return float(success[-1])


@dataclass(frozen=True)
class EqualTime:
    """One seed's two arms read at the same training-loop second."""

    seconds: float  # T = the smaller of the two arms' final loop seconds
    a: float  # each arm's held-out success at T minus its version-0 success
    b: float


def equal_time(a: Mapping[str, Any], b: Mapping[str, Any]) -> EqualTime:
    """The primary endpoint of two records of one seed (:func:`success_at` at ``T = min`` of their last loop seconds)."""
    ea, eb = a["eval"], b["eval"]
    t = min(ea["loop_s"][-1], eb["loop_s"][-1])
    return EqualTime(t, success_at(ea["loop_s"], ea["success"], t) - ea["success"][0],
                     success_at(eb["loop_s"], eb["success"], t) - eb["success"][0])


def late_gain(record: Mapping[str, Any], versions: Sequence[int] = LATE) -> float:
    """Mean held-out success at ``versions`` minus version 0 (S1 and the tuning score)."""
    by = dict(zip(record["eval"]["version"], record["eval"]["success"], strict=True))
    missing = [v for v in versions if v not in by]
    if missing or 0 not in by:
        raise ValueError(f"record {record.get('key')} seed {record.get('seed')}: no evaluation at {missing or [0]}")
    return statistics.fmean(by[v] for v in versions) - by[0]


def seconds_per_version(record: Mapping[str, Any]) -> float:
    return float(record["loop_s"]) / float(record["scale"]["steps"])


def bootstrap_ci(diffs: Sequence[float], resamples: int = BOOT_RESAMPLES, seed: int = BOOT_SEED,
                 level: float = 0.95) -> tuple[float, float]:
    """The paired bootstrap's percentile interval of the mean of ``diffs`` (seeds resampled with replacement)."""
    d = [float(x) for x in diffs]
    if len(d) < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 paired values; got {len(d)}")
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(d, k=len(d))) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    lo = means[int(math.floor(tail * (resamples - 1)))]
    hi = means[int(math.ceil((1.0 - tail) * (resamples - 1)))]
    return lo, hi


def verdict(diff: float, holm_p: float, intervals: Sequence[tuple[float, float]], margin: float = MARGIN) -> str:
    """The plan's reading of ``lora − full``: worse / better at Holm p < 0.05, else equivalent (every interval
    inside ±margin), non-inferior (every interval's low end above −margin), else not resolved."""
    if holm_p < stats.ALPHA:
        return "LoRA learns worse" if diff < 0 else "LoRA learns better"
    if all(-margin < lo and hi < margin for lo, hi in intervals):
        return f"as well (equivalent within ±{margin:g})"
    if all(lo > -margin for lo, _ in intervals):
        return f"no worse (non-inferior by {margin:g})"
    return "not resolved"


# --- the batches a job trains on -----------------------------------------------------------------
def runs_of(values: Sequence[int]) -> list[list[int]]:
    """Run-length code ``[[value, count], ...]`` of ``values``."""
    out: list[list[int]] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([int(v), 1])
    return out


def expand(runs: Sequence[Sequence[int]]) -> list[int]:
    return [v for v, n in runs for _ in range(n)]


class BatchProbe:
    """``run_job``'s ``on_batch``: each trained batch's rows as the run-length code of their per-token versions
    (``-1`` where the actor trains nothing: prompt and tool tokens), with the actor's version."""

    def __init__(self, keep: bool = True) -> None:
        self.batches: list[dict[str, Any]] = []
        self.keep = keep  # the record keeps the batches (the LoRA arm's: bench/lora_spans.py --mix-from), else the summary

    def __call__(self, groups: Sequence[Sequence[Any]], version: int) -> None:
        rows = [runs_of([v if m else -1 for v, m in zip(t.versions, t.loss_mask, strict=True)])
                for g in groups for t in g]
        self.batches.append({"actor_version": int(version), "rows": rows})

    def record(self) -> dict[str, Any]:
        return {**({"batches": self.batches} if self.keep else {}), "spans": span_summary(self.batches)}


def span_summary(batches: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Which share of a job's rows span versions, and where they switch.

    Per row: its sampled versions (distinct), and for a row of several, the share of its length that the
    exact route scores beyond one pass: the sum over its versions but the last of ``needed length / row length``
    (``span_plan``'s cut: a version's pair ends after its last token). ``cost_rows``: the exact route's rows
    of work per row of the batch by that rule (1 + that share; ignoring padding and grouping)."""
    counts: dict[int, int] = {}
    extra: list[float] = []
    rows = 0
    for b in batches:
        for r in b["rows"]:
            vs = expand(r)
            sampled = [v for v in vs if v >= 0]
            if not sampled:
                continue
            rows += 1
            distinct = sorted(set(sampled))
            counts[len(distinct)] = counts.get(len(distinct), 0) + 1
            if len(distinct) > 1:
                last = {v: max(i for i, x in enumerate(vs) if x == v) + 1 for v in distinct}
                extra.append(sum(last[v] for v in distinct[:-1]) / len(vs))
    spanning = sum(n for k, n in counts.items() if k > 1)
    q = sorted(extra)

    def pct(p: float) -> float | None:
        return rec.sig(q[min(len(q) - 1, int(p * len(q)))]) if q else None

    return {"rows": rows, "by_versions": {str(k): counts[k] for k in sorted(counts)},
            "spanning_share": rec.sig(spanning / rows) if rows else None,
            "extra_share_of_spanning": {"mean": rec.sig(statistics.fmean(q)) if q else None, "p10": pct(0.1),
                                        "p50": pct(0.5), "p90": pct(0.9)},
            "cost_rows": rec.sig(1.0 + sum(extra) / rows) if rows else None}


# --- running ------------------------------------------------------------------------------------
def work_dir(args: argparse.Namespace) -> Path:
    return Path(args.out)


def base_dir(work: Path) -> Path:
    return work / "base-hf"


def make_base(work: Path, log: Callable[[str], None] = print) -> Path:
    """The harness's warm start of :data:`SCALE` (made if not cached), exported as a full-weight HF folder."""
    out = base_dir(work)
    if (out / "config.json").exists():
        return out
    warm = h.make_warm_start(work, SCALE)
    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.run.export import export_checkpoint

    job = validate_job(h.job_doc(h.method("exact"), SCALE, h.WARM_SEED))  # the preset job the warm start ran
    result = export_checkpoint(warm, out, job=job, dtype="float32")
    log(f"base: exported the warm start {warm} to {out} ({result.weight_bytes} bytes, tokenizer: {result.tokenizer})")
    return out


def runner(args: argparse.Namespace, records: Path, probe: bool) -> h.Runner:
    work = work_dir(args)
    return h.Runner(SCALE, records, work=work, base=make_base(work).resolve(),
                    batch_probe=(lambda cfg: BatchProbe(keep=cfg.model is not None)) if probe else None)


def _run(r: h.Runner, cfg: h.Config, seed: int) -> dict[str, Any]:
    t0 = time.monotonic()
    print(f"[{time.strftime('%H:%M:%S')}] {cfg.name} seed {seed} (load {os.getloadavg()[0]:.1f})", flush=True)
    out = r.result(cfg, seed)
    print(f"    {time.monotonic() - t0:.0f} s: held-out {out['eval']['success']}, loop {out['loop_s']} s", flush=True)
    return out


def pick_rate(scores: Mapping[float, float]) -> float:
    """The plan's rule: the rate of the best tuning score, ties (within 0.005) going to the lower rate."""
    best = max(scores.values())
    return min(lr for lr, sc in scores.items() if sc >= best - 0.005)


def tune(args: argparse.Namespace) -> dict[str, float]:
    """The plan's rate grid on :data:`TUNING_SEEDS`; returns each arm's chosen rate."""
    chosen = {}
    for name, rates in RATES.items():
        r_full = runner(args, TUNING, probe=False)
        try:
            scores = {}
            for lr in rates:
                scores[lr] = statistics.fmean(late_gain(_run(r_full, arm(name, lr), s)) for s in TUNING_SEEDS)
        finally:
            r_full.close()
        chosen[name] = pick_rate(scores)
        print(f"{name}: tuning score (mean late gain over seeds {TUNING_SEEDS}) "
              + ", ".join(f"{lr:g}: {sc:+.3f}" for lr, sc in scores.items()) + f" -> {chosen[name]:g}", flush=True)
    return chosen


def chosen_rates(folder: Path = TUNING) -> dict[str, float]:
    """Each arm's rate by the plan's rule, from the committed tuning records."""
    store = rec.Store(folder)
    out = {}
    for name, rates in RATES.items():
        scores = {}
        for lr in rates:
            runs = store.runs(arm(name, lr).key(), TUNING_SEEDS)
            if len(runs) == len(TUNING_SEEDS):
                scores[lr] = statistics.fmean(late_gain(r) for r in runs)
        if len(scores) != len(rates):
            raise SystemExit(f"{folder}: the tuning grid of {name} is incomplete (have {sorted(scores)}); run tune")
        out[name] = pick_rate(scores)
    return out


def confirm(args: argparse.Namespace) -> None:
    rates = chosen_rates()
    arms = {name: arm(name, lr) for name, lr in rates.items()}
    stop = None
    if args.stop_at:
        hh, mm = (int(x) for x in args.stop_at.split(":"))
        stop = (hh, mm)
    r_conf = runner(args, DATA, probe=True)
    try:
        for seed in SCALE.seeds:
            now = time.gmtime()
            if stop is not None and (now.tm_hour, now.tm_min) >= stop:
                print(f"stopping rule: {time.strftime('%H:%M', now)} UTC >= {args.stop_at}; seed {seed} not started")
                break
            order = ["full", "lora"] if seed % 2 == 0 else ["lora", "full"]
            for name in order:
                _run(r_conf, arms[name], seed)
    finally:
        r_conf.close()


# --- the report ----------------------------------------------------------------------------------
def pairs(folder: Path = DATA) -> tuple[dict[str, h.Config], list[tuple[int, dict[str, Any], dict[str, Any]]]]:
    """The arms at their chosen rates and every seed whose two arms both have a record: (seed, lora, full)."""
    rates = chosen_rates(folder / "tuning")
    arms = {name: arm(name, lr) for name, lr in rates.items()}
    store = rec.Store(folder)
    out = []
    for seed in SCALE.seeds:
        lo, fu = store.get(arms["lora"].key(), seed), store.get(arms["full"].key(), seed)
        if lo is not None and fu is not None:
            out.append((seed, lo, fu))
    return arms, out


def analyse(folder: Path = DATA) -> dict[str, Any]:
    """Every number the report shows, from the records."""
    arms, got = pairs(folder)
    if len(got) < MIN_SEEDS:
        raise SystemExit(f"{folder}: {len(got)} complete seed(s); the plan needs at least {MIN_SEEDS} (run confirm)")
    eq = [equal_time(lo, fu) for _, lo, fu in got]
    endpoints = {
        "P": ([e.a for e in eq], [e.b for e in eq]),
        "S1": ([late_gain(lo) for _, lo, _ in got], [late_gain(fu) for _, _, fu in got]),
    }
    tests = {k: stats.paired(a, b) for k, (a, b) in endpoints.items()}
    adj = dict(zip(tests, stats.holm([t.p for t in tests.values()]), strict=True))
    out: dict[str, Any] = {"seeds": [s for s, _, _ in got], "arms": {k: c.spec() for k, c in arms.items()},
                           "T": [e.seconds for e in eq], "tests": {}}
    for k, (a, b) in endpoints.items():
        t = tests[k]
        d = [x - y for x, y in zip(a, b, strict=True)]
        boot = bootstrap_ci(d)
        tci = (t.diff - t.half_width, t.diff + t.half_width)
        out["tests"][k] = {"lora": stats.interval(a), "full": stats.interval(b), "diff": t.diff, "t_ci": tci,
                           "boot_ci": boot, "t": t.t, "p": t.p, "holm_p": adj[k], "n": t.n,
                           "verdict": verdict(t.diff, adj[k], [tci, boot])}
    per = {name: [seconds_per_version(lo if name == "lora" else fu) for _, lo, fu in got] for name in arms}
    out["seconds_per_version"] = {name: stats.interval(v) for name, v in per.items()}
    out["time_ratio"] = stats.interval([a / b for a, b in zip(per["lora"], per["full"], strict=True)])
    out["v0"] = stats.interval([fu["eval"]["success"][0] for _, _, fu in got])
    out["final"] = {name: stats.interval([(lo if name == "lora" else fu)["eval"]["success"][-1] for _, lo, fu in got])
                    for name in arms}
    out["keep"] = {name: stats.interval([h.series_mean(lo if name == "lora" else fu, "keep_ratio")
                                         for _, lo, fu in got]) for name in arms}
    loads = {name: [x for _, lo, fu in got for x in (lo if name == "lora" else fu)["load_avg"]] for name in arms}
    out["load"] = {name: (statistics.median(v), min(v), max(v)) for name, v in loads.items()}
    out["full_learns"] = out["tests"]["P"]["full"].mean > 0.02
    spans = [lo.get("spans") for _, lo, _ in got if lo.get("spans")]
    out["spans"] = spans
    out["rates"] = {name: c.learning_rate for name, c in arms.items()}
    return out


def table(a: Mapping[str, Any]) -> str:
    rows = []
    names = {"P": "held-out success at equal wall time − v0 (primary)",
             "S1": "mean held-out success at v40, 50, 60 − v0 (equal versions)"}
    for k, t in a["tests"].items():
        rows.append([names[k], t["lora"].cell(), t["full"].cell(), f"{t['diff']:+.3f}",
                     f"[{t['t_ci'][0]:+.3f}, {t['t_ci'][1]:+.3f}]", f"[{t['boot_ci'][0]:+.3f}, {t['boot_ci'][1]:+.3f}]",
                     f"{t['p']:.3g}", f"{t['holm_p']:.3g}", f"**{t['verdict']}**"])
    out = (f"Seeds {a['seeds']} ({len(a['seeds'])} pairs); rates: LoRA {a['rates']['lora']:g}, full "
           f"{a['rates']['full']:g} (tuned on seeds {list(TUNING_SEEDS)}). Mean ± 95 % t half-width over seeds; "
           "`lora − full` paired by seed.\n\n")
    out += h.markdown_table(["endpoint", "LoRA", "full", "lora − full", "95 % CI (paired t)",
                             "95 % CI (paired bootstrap)", "p (paired t)", "Holm p", "reading"], rows)
    sp = a["seconds_per_version"]
    lf, ll = a["load"]["full"], a["load"]["lora"]
    out += ("\n" + h.markdown_table(["", "LoRA", "full"], [
        ["training-loop seconds per version", sp["lora"].cell(2), sp["full"].cell(2)],
        ["held-out success at v0 (the shared base)", a["v0"].cell(), a["v0"].cell()],
        ["held-out success at v60", a["final"]["lora"].cell(), a["final"]["full"].cell()],
        ["keep ratio (mean over versions)", a["keep"]["lora"].cell(), a["keep"]["full"].cell()],
        ["1-min load average at start/end (median, range)", f"{ll[0]:.1f} ({ll[1]:.1f}–{ll[2]:.1f})",
         f"{lf[0]:.1f} ({lf[1]:.1f}–{lf[2]:.1f})"],
    ]))
    T = a["T"]
    out += (f"\nEqual wall time T per seed (the smaller final loop seconds of the pair): {min(T):.0f}–{max(T):.0f} s. "
            f"LoRA's seconds per version / full's, per seed: {a['time_ratio'].cell(3)}.")
    if not a["full_learns"]:
        out += " **Uninformative by the plan's rule: the full arm did not learn (mean primary endpoint <= 0.02).**"
    return out + "\n"


def figure(folder: Path = DATA, path: Path = FIGURE) -> None:
    """Mean held-out success against training-loop seconds per arm, with its 95 % t band (each seed's curve
    interpolated onto a common grid up to the shortest run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms, got = pairs(folder)
    end = min(min(lo["eval"]["loop_s"][-1], fu["eval"]["loop_s"][-1]) for _, lo, fu in got)
    grid = [end * i / 40 for i in range(41)]
    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    for name in ("full", "lora"):
        curves = [[success_at((lo if name == "lora" else fu)["eval"]["loop_s"],
                              (lo if name == "lora" else fu)["eval"]["success"], t) for t in grid] for _, lo, fu in got]
        iv = [stats.interval([c[i] for c in curves]) for i in range(len(grid))]
        m = [x.mean for x in iv]
        (line,) = ax.plot(grid, m, label=f"{name} (lr {arms[name].learning_rate:g})", lw=1.5)
        ax.fill_between(grid, [x.mean - x.half_width for x in iv], [x.mean + x.half_width for x in iv],
                        color=line.get_color(), alpha=0.18, lw=0)
    ax.set_xlabel("training-loop seconds (evaluations excluded)", fontsize=8)
    ax.set_ylabel("held-out success", fontsize=8)
    ax.set_title(f"calculator, tiny-llama, {len(got)} seeds: mean and 95 % band", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def render(folder: Path = DATA, doc: Path = DOC) -> str:
    return page_blocks.fill_block(doc.read_text(), BEGIN, END, table(analyse(folder)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("base", "tune", "confirm", "report"))
    p.add_argument("--out", default="runs/lora_learning", help="working folder: warm start, base, run folders")
    p.add_argument("--stop-at", default=None, metavar="HH:MM", help="confirm: start no seed at or after this UTC time")
    p.add_argument("--check", action="store_true", help="report: exit 1 when docs/lora.md differs from the records")
    p.add_argument("--no-figure", action="store_true", help="report: leave the PNG alone")
    args = p.parse_args(argv)
    if args.command == "base":
        print(make_base(work_dir(args)))
    elif args.command == "tune":
        print(json.dumps(tune(args)))
    elif args.command == "confirm":
        confirm(args)
    else:
        text = render()
        if args.check:
            same = text == DOC.read_text()
            print("docs/lora.md matches its records" if same else "docs/lora.md differs: run bench/lora_learning.py report")
            return 0 if same else 1
        DOC.write_text(text)
        if not args.no_figure:
            figure()
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
