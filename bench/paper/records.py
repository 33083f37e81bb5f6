"""One JSON record per (configuration, seed) run of the paper experiments: what ``docs/results.md`` is made of.

A record is small (a few kilobytes: curves at every policy version, rounded to 4 significant digits) and
holds everything a table or a figure of ``bench/paper/report.py`` reads, so the document regenerates from
the committed records alone (``docs/results/data/cells/``)::

    schema        RECORD_SCHEMA
    key, seed     the configuration's digest (harness.Config.key) and the RL seed; tag: "" or "rerun-1", ...
    config        correction, old_logits, max_staleness (what ran)
    scale         harness.Scale without the seeds (task, steps, batch, learning rate, evaluation)
    eval          prompts per evaluation; version, success and training-loop seconds of every evaluation
    curves        per applied policy version: keep_ratio, in_bounds_ratio, clip fractions, staleness_mean, ...
    resets        count and versions of the EWMA reference's resets
    low_streak    tau and k of the reset rule, versions with in_bounds_ratio < tau, the longest run of them
    log_rd        |log r_d| of the start-up probe (bf16 rollout vs the fp32 actor at version 0): mean, p50, p99
    wall_s, loop_s, bench_s, load_avg (1-minute load average at start and end), cpus
    warm_start    seed, steps and sha256 of the warm start the run started from (harness.warm_fingerprint);
                  absent from records made before the fingerprint was kept
"""

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RECORD_SCHEMA = 1
CURVE_KEYS = ("keep_ratio", "in_bounds_ratio", "clip_or_reject_frac", "clip_low_frac", "clip_high_frac",
              "staleness_mean", "staleness_max", "rd_min", "rd_max", "success_rate")
DEFAULT_TAU, DEFAULT_K = 0.8, 3  # the spec's reset defaults (api/correction.py EwmaResetSpec)


def sig(x: Any, digits: int = 4) -> Any:
    """``x`` rounded to ``digits`` significant digits (None and NaN as None, ints unchanged)."""
    if x is None or isinstance(x, bool | int | str):
        return x
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return None
    return float(f"{x:.{digits}g}")


def reset_rule(correction: Mapping[str, Any]) -> tuple[float, int, bool]:
    """``(tau, k, enabled)`` of a configuration's EWMA reset (the spec's defaults where omitted)."""
    reset = dict(correction.get("ewma", {}).get("reset", {}))
    return (float(reset.get("keepRatioBelow", DEFAULT_TAU)), int(reset.get("consecutiveSteps", DEFAULT_K)),
            bool(reset.get("enabled", True)))


def low_streaks(in_bounds: Sequence[float | None], tau: float) -> dict[str, Any]:
    """Versions whose in-bounds ratio is below ``tau``, the number of runs of them and the longest run."""
    longest = run = runs = below = 0
    for x in in_bounds:
        if x is not None and x < tau:
            below += 1
            run += 1
            runs += run == 1
            longest = max(longest, run)
        else:
            run = 0
    return {"tau": tau, "versions_below": below, "streaks": runs, "longest": longest}


def probe_quantiles(summary: Mapping[str, Any]) -> dict[str, Any] | None:
    """|log r_d| of the start-up probe's first engine (summary.json ``startup_check``), or None."""
    engines = (summary.get("startup_check") or {}).get("engines") or []
    if not engines:
        return None
    e = engines[0]
    return {"source": f"start-up probe, {e.get('engine')}, version {e.get('version')}", "tokens": e.get("tokens"),
            "mean": sig(e.get("mean_abs_log_ratio")), "p50": sig(e.get("p50_abs_log_ratio")),
            "p99": sig(e.get("p99_abs_log_ratio")), "max": sig(e.get("max_abs_log_ratio"))}


def build(*, key: str, seed: int, tag: str, config: Mapping[str, Any], scale: Mapping[str, Any],
          summary: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], bench_s: float,
          load_avg: tuple[float, float], warm_start: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record of one finished run from the driver's summary and its per-version step lines."""
    applied = [s for s in steps if "version" in s]
    curve = summary.get("eval_curve", [])
    tau, k, _ = reset_rule(config["correction"])
    curves: dict[str, list[Any]] = {"version": [int(s["version"]) for s in applied]}
    for name in CURVE_KEYS:
        curves[name] = [sig(s.get(name)) for s in applied]
    loop = summary.get("loop", {})
    resets = [int(s["version"]) for s in applied if s.get("ewma_reset")]
    # The learning rate the optimizer actually used (ActorOptimizer.learning_rate() in every step line): one
    # number, or the list when it changed; absent in records of runs before the step lines carried it.
    lrs = sorted({float(s["learning_rate"]) for s in applied if s.get("learning_rate") is not None})
    outcomes = [str(s["ewma_reset_outcome"]) for s in applied if s.get("ewma_reset_outcome")]
    return {
        "schema": RECORD_SCHEMA, "key": key, "seed": seed, "tag": tag,
        "config": dict(config), "scale": dict(scale),
        "eval": {"prompts": int(scale["eval_prompts"]), "version": [int(c["version"]) for c in curve],
                 "success": [sig(c["success"]) for c in curve], "loop_s": [sig(c.get("loop_s"), 3) for c in curve]},
        "curves": curves,
        "resets": {"count": len(resets), "versions": resets},
        **({"reset_outcomes": {"recovered": outcomes.count("recovered"), "unrecovered": outcomes.count("unrecovered")}}
           if outcomes else {}),
        **({"actor_learning_rate": lrs[0] if len(lrs) == 1 else lrs} if lrs else {}),
        "low_streak": {**low_streaks(curves["in_bounds_ratio"], tau), "k": k},
        "log_rd": probe_quantiles(summary),
        "wall_s": sig(summary.get("wall_s"), 3),
        "loop_s": sig(float(loop.get("wall_s", summary.get("wall_s", 0.0))) - float(summary.get("eval_s", 0.0)), 3),
        "bench_s": sig(bench_s, 3),
        "load_avg": [sig(load_avg[0], 3), sig(load_avg[1], 3)],
        "cpus": os.cpu_count(),
        **({} if warm_start is None else {"warm_start": dict(warm_start)}),
    }


def name_of(key: str, seed: int, tag: str = "") -> str:
    return f"{key}-s{seed}{'-' + tag if tag else ''}.json"


def write(folder: Path, record: Mapping[str, Any]) -> Path:
    """``folder/<key>-s<seed>[-tag].json``, one line per top-level field (diffs stay readable)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name_of(record["key"], record["seed"], record.get("tag", ""))
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in record.items())
    path.write_text("{\n" + body + "\n}\n")
    return path


def read(path: Path) -> dict[str, Any]:
    """One record; a file of another schema is refused with its path and the fix."""
    rec = json.loads(path.read_text())
    if rec.get("schema") != RECORD_SCHEMA:
        raise ValueError(f"{path}: record schema {rec.get('schema')!r}, this code reads {RECORD_SCHEMA}; "
                         "rerun the cell (bench/paper/cell.py) to rewrite it")
    return rec


class Store:
    """The records of one folder, by (key, seed, tag)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._cache: dict[str, dict[str, Any] | None] = {}

    def get(self, key: str, seed: int, tag: str = "") -> dict[str, Any] | None:
        name = name_of(key, seed, tag)
        if name not in self._cache:
            path = self.folder / name
            self._cache[name] = read(path) if path.exists() else None
        return self._cache[name]

    def runs(self, key: str, seeds: Sequence[int], tag: str = "") -> list[dict[str, Any]]:
        """The records of ``seeds`` that exist, in seed order."""
        return [r for s in seeds if (r := self.get(key, s, tag)) is not None]

    def seeds_of(self, key: str, tag: str = "") -> list[int]:
        prefix, suffix = f"{key}-s", f"-{tag}.json" if tag else ".json"
        out = []
        for p in self.folder.glob(f"{key}-s*.json"):
            mid = p.name[len(prefix):-len(suffix)] if p.name.endswith(suffix) else ""
            if mid.isdigit():
                out.append(int(mid))
        return sorted(out)
