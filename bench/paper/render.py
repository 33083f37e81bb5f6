"""Rendering of the paper experiments' sections: markdown tables, verdict lines and figures from records.

Figures are checked by their data, not their pixels: :func:`figure` hashes the numbers it plots (rounded,
JSON, sha256) and the markdown it returns carries that hash, so ``report.py --check`` compares text only
and stays exact across machines whatever the fonts or the matplotlib build; the PNG is written only when
``Context.write_figures`` (with fixed metadata, so a rerun on one machine gives the same bytes).
"""

import hashlib
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness as h
import records as rec
import stats as st

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Context:
    """What a section renders from: the records, the scale they ran at, and where figures go."""

    store: rec.Store
    scale: h.Scale
    figures: Path  # docs/results/
    write_figures: bool
    verdicts: list[list[str]] = field(default_factory=list)  # every orderings row rendered, for the summary

    def tested(self, rows: list[list[str]]) -> list[list[str]]:
        """Keep ``rows`` (orderings-table rows) for the page's summary and return them."""
        self.verdicts.extend(rows)
        return rows

    def runs(self, cfg: h.Config, tag: str = "") -> list[dict[str, Any]]:
        """The records of ``cfg`` at this section's seeds; a record that ran at another scale is refused."""
        out = self.store.runs(cfg.key(), self.scale.seeds, tag)
        for r in out:
            check_scale(r, cfg, self.scale)
        return out


class ScaleMismatch(ValueError):
    """A record whose scale (or learning rate actually used) differs from its section's."""


def check_scale(record: Mapping[str, Any], cfg: h.Config, scale: h.Scale) -> None:
    """Refuse ``record`` unless it ran at ``scale`` (every field but the seeds) and at the configuration's
    learning rate: the scale's unless the configuration overrides it; the optimizer's own rate too where the
    record stored it (``actor_learning_rate``)."""
    want = h.scale_record(scale)
    got = dict(record.get("scale", {}))
    lr = cfg.learning_rate if cfg.learning_rate is not None else scale.learning_rate
    ran = record.get("config", {}).get("learning_rate", got.get("learning_rate"))
    bad = {k: (got.get(k), v) for k, v in want.items() if k != "learning_rate" and got.get(k) != v}
    actor = record.get("actor_learning_rate")
    if ran is None or not math.isclose(float(ran), lr, rel_tol=1e-9):
        bad["learning_rate"] = (ran, lr)
    actors = [] if actor is None else [float(actor)] if isinstance(actor, (int, float)) else [float(x) for x in actor]
    if any(not math.isclose(x, lr, rel_tol=1e-6) for x in actors):
        bad["actor_learning_rate"] = (actor, lr)
    if bad:
        raise ScaleMismatch(f"record {cfg.key()} seed {record.get('seed')} ({cfg.name}) ran at another scale than its "
                            f"section: {', '.join(f'{k} {a!r} (section: {b!r})' for k, (a, b) in sorted(bad.items()))}; "
                            "refused: rerun it at the section's scale")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def metric(runs: Sequence[Record], name: str, level: float) -> list[float]:
    """One number per run: ``final``/``auc``/``versions_to_level`` of the eval curve, ``resets``, or
    ``mean:<curve>`` (a per-version curve's run mean), ``early:<curve>`` (versions 1-10), ``late:<curve>``
    (the last 10 versions), ``range:<first>:<last>:<curve>`` (versions first..last)."""
    out = []
    for r in runs:
        if name == "resets":
            out.append(float(r["resets"]["count"]))
        elif name.startswith("range:"):  # range:<first>:<last>:<curve>, versions inclusive
            _, first, last, key = name.split(":", 3)
            out.append(h.series_mean(r, key, (int(first), int(last))))
        elif ":" in name:
            kind, key = name.split(":", 1)
            last = r["curves"]["version"][-1] if r["curves"]["version"] else 0
            window = {"mean": None, "early": (1, 10), "late": (last - 9, last)}[kind]
            out.append(h.series_mean(r, key, window))
        else:
            out.append(h.eval_metrics(h.eval_curve(r), level)[name])
    return out


def cell(values: Sequence[float], digits: int = 3) -> str:
    return st.interval(values).cell(digits)


def seeds_text(runs: Sequence[Record]) -> str:
    return ", ".join(str(r["seed"]) for r in runs) or "none"


TAUTOLOGIES = ("tighter mask keeps fewer tokens", "looser clip clips fewer tokens")  # cannot fail: checks
LEARNING_METRICS = ("auc", "final", "versions_to_level")
PAIR_R = 0.25  # pair by seed only when the two sides' per-seed values correlate at least this much
PAPER_SIZED = 0.02  # success / AUC: the smallest Snapshot - Decoupled PPO gap of the paper's Table 2 (2.3 points)


class VerdictRow(list):
    """An orderings-table row (strings) that also carries what the page summary needs: the class
    (``paper ordering`` / ``mechanism`` / ``tautology``), the test, its raw p, the difference and its CI,
    and the expected sign."""

    kind: str = "mechanism"
    p: float = float("nan")
    diff: float = float("nan")
    low: float = float("nan")
    high: float = float("nan")
    expected: int = +1
    test_name: str = ""


def classify(claim: str, what: str) -> str:
    """``tautology`` (a check that cannot fail), ``paper ordering`` (a learning outcome the paper orders),
    or ``mechanism`` (a measured ratio, resets or clip fraction)."""
    if claim in TAUTOLOGIES:
        return "tautology"
    return "paper ordering" if what in LEARNING_METRICS else "mechanism"


def verdict_row(claim: str, a_name: str, a: Sequence[Record], b_name: str, b: Sequence[Record], what: str,
                level: float, expected: int = +1) -> list[str]:
    """One row of an orderings table: ``a`` above ``b`` on ``what`` (``expected`` -1: below) over the seeds
    both have: the paired t test when the two sides' per-seed values correlate at r >= PAIR_R (pairing then
    reduces the variance), else Welch's unpaired t test. The verdict here is at raw p < 0.05; the page's
    summary applies Holm within each family."""
    seeds = sorted({r["seed"] for r in a} & {r["seed"] for r in b})
    av = metric([r for r in a if r["seed"] in seeds], what, level)
    bv = metric([r for r in b if r["seed"] in seeds], what, level)
    row = VerdictRow()
    row.kind, row.expected = classify(claim, what), expected
    if len(seeds) < 2:
        row.extend([claim, what, f"{a_name} vs {b_name}", "-", "-", "not resolved (fewer than 2 paired seeds)"])
        return row
    r = st.pearson(av, bv)
    if not math.isnan(r) and r >= PAIR_R:
        p = st.paired(av, bv)
        row.test_name, row.p, row.diff = "paired t", p.p, p.diff
        row.low, row.high = p.diff - p.half_width, p.diff + p.half_width
        test = f"paired t({p.n - 1}) = {p.t:.2f}, p = {p.p:.2g} (r {r:+.2f})"
        verdict = p.verdict(expected)
    else:
        w = st.welch(av, bv)
        row.test_name, row.p, row.diff, row.low, row.high = "Welch t", w.p, w.diff, w.diff - w.half_width, w.diff + w.half_width
        test = f"Welch t({w.dof:.1f}) = {w.t:.2f}, p = {w.p:.2g} (r {r:+.2f})"
        verdict = "not resolved" if w.p >= st.ALPHA else ("held" if (w.diff > 0) == (expected > 0) else "reversed")
    row.extend([claim, what, f"{a_name} − {b_name}", f"{row.diff:+.3f} ± {(row.high - row.low) / 2:.3f}", test,
                f"**{verdict}**"])
    return row


VERDICT_HEADER = ["paper's claim", "metric", "difference", "Δ (95 % CI)", "test (paired iff r >= 0.25, else Welch)",
                  "verdict (raw p < 0.05; Holm in the summary)"]


# --- figures ---------------------------------------------------------------------------------
Panel = tuple[str, str, Mapping[str, Sequence[Record]], str | None]  # (title, y label, {series: runs}, curve or None)


def mean_curve(runs: Sequence[Record], key: str | None) -> tuple[list[float], list[float], list[float]]:
    """Mean and std across seeds of the eval curve (``key`` None) or of a per-version curve, on the
    versions every run has; rounded to 4 digits (what the figure's hash covers)."""
    if not runs:
        return [], [], []
    series = [({c["version"]: c["success"] for c in h.eval_curve(r)} if key is None
               else dict(zip(*h.series(r, key), strict=True))) for r in runs]
    common = sorted(set.intersection(*(set(s) for s in series)))
    means = [round(statistics.fmean(s[v] for s in series), 4) for v in common]
    stds = [round(statistics.stdev([s[v] for s in series]), 4) if len(series) > 1 else 0.0 for v in common]
    return [float(v) for v in common], means, stds


Markers = Callable[[str, Sequence[Record]], list[tuple[float, float]]]


def smoothed(curve: tuple[list[float], list[float], list[float]], window: int) -> tuple[list[float], list[float], list[float]]:
    """A trailing moving average of ``window`` versions over a mean curve and its std band (1: unchanged)."""
    xs, m, s = curve
    if window <= 1:
        return xs, m, s

    def avg(v: list[float]) -> list[float]:
        return [round(statistics.fmean(v[max(0, i - window + 1): i + 1]), 4) for i in range(len(v))]

    return xs, avg(m), avg(s)


def figure(ctx: Context, name: str, caption: str, panels: Sequence[Panel], *,
           markers: Mapping[int, Markers] | None = None, hlines: Mapping[int, Sequence[tuple[float, str]]] | None = None,
           ylims: Mapping[int, tuple[float, float]] | None = None, smooth: int = 1) -> str:
    """A row of panels (mean over seeds, ±std band); ``markers[i]`` gives (x, y) points per series of
    panel ``i`` (e.g. resets), ``hlines[i]`` horizontal reference lines; per-version curves (not the eval
    curve) are a trailing mean over ``smooth`` versions. Returns the markdown (image and the hash of the
    plotted data)."""
    data: list[Any] = []
    for i, (title, ylabel, groups, key) in enumerate(panels):
        data.append([title, ylabel, key, [[n, *smoothed(mean_curve(runs, key), smooth if key else 1),
                                          (markers or {}).get(i, lambda *_: [])(n, runs)] for n, runs in groups.items()],
                     list((hlines or {}).get(i, ())), list((ylims or {}).get(i, ()))])
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    path = ctx.figures / f"{name}.png"
    if ctx.write_figures:
        _draw(path, data)
    return f"![{caption}](results/{name}.png)\n<!-- figure {name}.png data sha256 {digest} -->\n"


def _draw(path: Path, data: Sequence[Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(data), figsize=(4.4 * len(data), 3.3), squeeze=False)
    for ax, (title, ylabel, _key, lines, hl, ylim) in zip(axes[0], data, strict=True):
        for n, xs, m, s, pts in lines:
            (line,) = ax.plot(xs, m, label=n, lw=1.3)
            ax.fill_between(xs, [a - b for a, b in zip(m, s, strict=True)], [a + b for a, b in zip(m, s, strict=True)],
                            color=line.get_color(), alpha=0.15, lw=0)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "v", color=line.get_color(), ms=5, alpha=0.9)
        for y, label in hl:
            ax.axhline(y, color="k", ls="--", lw=0.8)
            ax.text(ax.get_xlim()[0], y, " " + label, fontsize=6, va="bottom")
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("policy version", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, metadata={"Software": None})
    plt.close(fig)
