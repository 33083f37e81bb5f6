"""The measured numbers the EWMA reset runbooks quote, generated from the committed records.

``docs/runbooks/AsyncRLEwmaReset.md`` and ``AsyncRLEwmaResetStorm.md`` carry blocks between
``<!-- BEGIN GENERATED runbook_numbers:<name> -->`` and ``<!-- END GENERATED runbook_numbers:<name> -->``;
:func:`render` rewrites them from ``docs/results/data/`` (``bench/paper/report.py`` does, and ``--check`` fails
when they differ), so a runbook cannot quote a figure its records no longer give.
"""

import statistics
from collections.abc import Mapping
from pathlib import Path

import confirm_report as cr
import ewma
import harness as h
import page_blocks
import records as rec
import render as rd

RUNBOOKS = h.ROOT / "docs" / "runbooks"
BEGIN, END = "<!-- BEGIN GENERATED runbook_numbers:{} -->", "<!-- END GENERATED runbook_numbers:{} -->"


def _mean(ctx: rd.Context, cfg: h.Config, what: str) -> float:
    return statistics.fmean(rd.metric(ctx.runs(cfg), what, ctx.scale.level))


def blocks(data: Path) -> dict[str, dict[str, str]]:
    """``{runbook file: {block name: markdown}}`` from the records."""
    ctx = rd.Context(rec.Store(data / "cells"), h.FULL, h.ROOT / "docs" / "results", False)
    cur = next(c for c in h.METHODS if c.name == "current")
    early, late = _mean(ctx, cur, "range:2:10:in_bounds_ratio"), _mean(ctx, cur, "range:11:30:in_bounds_ratio")
    half = next(r for r in ctx.runs(ewma.cfg("decay 0.5, reset")) if r["seed"] == 0)["resets"]["versions"]
    reset_md = (
        f"Measured (`docs/results.md` section 2, mask `[0.99, 1.01]`, W = 3, lr 1e-4): the paper's rule sets theta_prox "
        "to the weights the batch met on arrival, so for the next versions the in-bounds ratio is that of "
        f"`correction.reference: current` ({early:.4f} in versions 2–10, {late:.4f} in 11–30 there, the mean over "
        "5 seeds), not the precision floor (0.94–0.97 with exact old logits). With `keepRatioBelow` near that level a "
        f"second reset follows `consecutiveSteps` versions later (decay 0.5, seed 0: resets at versions "
        f"{', '.join(map(str, half))}).")
    rates = [("1e-4", "decay auto, reset", cur), ("3e-4", "lr 0.0003: decay auto, reset", ewma.cfg("lr 0.0003: current")),
             ("1e-3", "lr 0.001: decay auto, reset", ewma.cfg("lr 0.001: current"))]
    rows = [f"{lr}: {_mean(ctx, ewma.cfg(name), 'resets'):.1f} resets per 60 versions, `current` in-bounds "
            f"{_mean(ctx, c, 'mean:in_bounds_ratio'):.2f}" for lr, name, c in rates]
    storm_md = ("Measured (`docs/results.md` section 2: tiny model, W = 3, mask [0.99, 1.01], 8 updates per version, "
                "5 seeds), the paper's rule with the staleness-aware decay, and the mean in-bounds ratio of the current "
                "weights (what that rule resets to): " + "; ".join(rows) + ".")
    table = cr.reset_table(data) if (data / "reset_rules").exists() else "No reset-rule records yet.\n"
    outcomes_md = ("The reset rules compared on `spell_backward` (`docs/results.md`, the confirmatory section; EWMA decay "
                   "auto, W = 3, k = 3): resets per run, the share that recovered within W versions, and resets followed by "
                   "another within W:\n\n" + table)
    return {"AsyncRLEwmaReset.md": {"measured": reset_md},
            "AsyncRLEwmaResetStorm.md": {"measured": storm_md, "rules": outcomes_md}}


def fill(text: str, name: str, content: str) -> str:
    return page_blocks.fill_block(text, BEGIN.format(name), END.format(name), content)


def render(data: Path, folder: Path = RUNBOOKS) -> dict[Path, str]:
    """Every runbook with its generated blocks filled from the records (not written)."""
    out: dict[Path, str] = {}
    for name, parts in blocks(data).items():
        path = folder / name
        text = path.read_text()
        for block, content in parts.items():
            text = fill(text, block, content)
        out[path] = text
    return out


def stale(data: Path, folder: Path = RUNBOOKS) -> list[str]:
    return [p.name for p, text in render(data, folder).items() if p.read_text() != text]


def write(data: Path, folder: Path = RUNBOOKS) -> Mapping[Path, str]:
    done = render(data, folder)
    for p, text in done.items():
        p.write_text(text)
    return done
