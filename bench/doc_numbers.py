"""The numbers ``docs/tasks.md`` and ``docs/agents.md`` quote from experiment records, generated from the records.

Records (committed, ``docs/results/data/``): ``customer_service/baselines.json``
(``bench/customer_service_baselines.py``), ``customer_service/warmstart/`` (``bench/cs_warmstart_pilots.py``),
``customer_service/v1-superseded/`` (``bench/customer_service.py``, the
superseded v1 run) and ``agent_endpoint.json`` (``bench/agent_endpoint.py``). Two forms, as
``bench/paper/runbook_numbers.py`` does for the runbooks:

- **tables**, between ``<!-- BEGIN GENERATED doc_numbers:<name> -->`` and ``<!-- END GENERATED doc_numbers:<name> -->``,
  rewritten whole;
- **quotes in the prose**: a template whose ``{fields}`` come from the records. The renderer finds the one place in
  the doc where the template's words stand (whitespace may wrap) with any numbers in its fields, and writes the
  records' numbers there; a template found nowhere, or twice, is an error naming it.

Usage::

    .venv/bin/python bench/doc_numbers.py           # rewrite both docs
    .venv/bin/python bench/doc_numbers.py --check   # exit 1, naming each difference (tests/trainer/test_bench_doc_numbers.py)

Figures the docs quote that no committed record holds are listed in :data:`NOT_FROM_RECORDS` (the test holds that
list true: each is still in its doc, in words a reader can find).
"""

import argparse
import difflib
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "paper"))
import page_blocks  # noqa: E402  (bench/paper/page_blocks.py: generated blocks in a page)
import stats  # noqa: E402  (bench/paper/stats.py: the paired t test)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "results" / "data"
DOCS = ROOT / "docs"
BEGIN, END = "<!-- BEGIN GENERATED doc_numbers:{} -->", "<!-- END GENERATED doc_numbers:{} -->"
NUMBER = r"([-+]?[0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?)"

# The baselines table: the doc's wording and order of the record's policies, and the flags it shows.
BASELINE_ROWS: tuple[tuple[str, str], ...] = (
    ("skill", "the skill: look the user up, act on the order of the named product"),
    ("first_fit", "look the user up, act on the first order whose status fits (the status shortcut)"),
    ("random_fit", "... on a random fitting order"),
    ("last_fit", "... on the last fitting order"),
    ("first_listed", "... on the first order listed, whatever its status"),
    ("both_tools", "the first fitting order with a random tool; after the wrong one, the other"),
    ("imitate_warm_start", "a perfect imitator of the warm start's demonstration mix"),
    ("random_user", "a random user id, then the first fitting order (a guess when the lookup fails)"),
    ("schema_example", "look the user up, act on the example id in the tool's schema (`o318`/`o702`)"),
    ("guess_once", "guess an order id blindly, one call with the intent's tool"),
    ("guess_four", "guess 4 distinct ids (the first wrong one ends the episode)"),
    ("lookup_only", "look the user up and stop"),
)
BASELINE_FLAGS = ("looked_up", "copied_user", "right_tool", "right_order", "first_fit", "guessed")
GUESSES = ("guess_once", "guess_four", "random_user", "schema_example")
MODELS = ("h64", "h256", "smollm2")
ENV, ENDPOINT, IN_PROCESS = "env", "endpoint", "endpoint-in-process"

# Quoted in the docs, measured, but in no committed record (so not generated): doc -> the words that carry them.
NOT_FROM_RECORDS: dict[str, tuple[str, ...]] = {
    "tasks.md": (
        "264 s on a loaded core",  # the baselines' run time (the record keeps no time)
        "it was 0.459 before, and guessing 4 ids 0.246",  # the v1 rules' baselines (no v1 baselines record)
        "the status shortcut scored 0.459, a blind id guess 0.111",
        "the shortcut was cut from 0.773 to 0.46",
        "loss 0.377 / 0.369 /",  # the warm-start pilot (a transformers stand-in; no record)
        "1,079 s at a",  # the smoke run's time
        "measured 0.94 of 64 sampled",  # the warm-start test's own runs (it writes no record)
        "0.97 of its 64 sampled",
        "at 150, 0.67, too few",
        "382 s (202 s of CPU), after 297 s",  # the test's cost before and after, side by side (pytest's times)
        "6.36 s before, 2.40 s after",  # bench/cs_warmstart_test_cost.py (prints, writes no record)
        "its first 20 steps took 277 s",  # the small-llama pilot, stopped at step 20 (before its first probe: no record)
        "tiny-llama took 1.1-2.7 s at 2 layers, 2.0 s at 4",  # the pilots' logged step-20 times (not in the records)
        "has a binomial chance of 0.018",  # computed from two records' counts (1 and 4 of 64)
        "(about 0.1 at the start)",  # the drills' argmax share at their first steps (a smoke run; chance is 0.1)
    ),
    "agents.md": (
        "under cProfile 3.08 -> 1.10 ms",  # one round each against the first HTTP stack (not in the record)
        "6 to 7 µs a token",  # bench/detokenize.py (no record)
    ),
}


@dataclass(frozen=True)
class Quote:
    """``template`` with ``{name:format}`` fields, filled from ``values``."""

    doc: str
    template: str


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


# --- docs/tasks.md ------------------------------------------------------------------------------
def baselines_table(record: Mapping[str, Any]) -> str:
    by = {r["policy"]: r for r in record["rows"]}
    missing = sorted(set(by) ^ {p for p, _ in BASELINE_ROWS})
    if missing:
        raise ValueError(f"baselines record and BASELINE_ROWS differ in {missing}: name each policy once in both")
    head = "| policy | success (95 % CI) | " + " | ".join(f.replace("_", " ") for f in BASELINE_FLAGS) + " |"
    lines = [head, "|---|---|" + "---|" * len(BASELINE_FLAGS)]
    for policy, label in BASELINE_ROWS:
        r = by[policy]
        lo, hi = r["ci95"]
        flags = " | ".join(f"{r['behaviour'][f]:.2f}" for f in BASELINE_FLAGS)
        lines.append(f"| {label} | {r['success']:.4f} [{lo:.4f}, {hi:.4f}] | {flags} |")
    return "\n".join(lines)


def tasks_values(data: Path) -> dict[str, Any]:
    b = _load(data / "customer_service" / "baselines.json")
    by = {r["policy"]: r for r in b["rows"]}
    v1 = _v1_runs(data / "customer_service" / "v1-superseded")
    rl, sft = v1["rl"], v1["sft"]
    end = stats.paired([r["points"][-1]["pass_k"]["1"] for r in rl], [r["points"][-1]["pass_k"]["1"] for r in sft])
    sft_gain = stats.paired([r["points"][-1]["pass_k"]["1"] for r in sft], [r["points"][0]["pass_k"]["1"] for r in sft])
    return {
        "scenarios": b["scenarios"], "seed": b["seed"],
        "first_fit": by["first_fit"]["success"],
        "skill_first_fit": by["skill"]["behaviour"]["first_fit"],
        "shortcut_right_order": by["first_fit"]["behaviour"]["right_order"],
        "best_trivial": max(r["success"] for p, r in by.items() if p != "skill"),
        "guess_below": math.ceil(1000 * max(by[p]["success"] for p in GUESSES)) / 1000,
        "imitate": by["imitate_warm_start"]["success"],
        "baselines_table": baselines_table(b),
        "warmstart_table": warmstart_table(data / "customer_service" / "warmstart"),
        **warmstart_values(data / "customer_service" / "warmstart"),
        "v1_v0": statistics.fmean(r["points"][0]["pass_k"]["1"] for r in rl),
        "v1_rl": statistics.fmean(r["points"][-1]["pass_k"]["1"] for r in rl),
        "v1_sft": statistics.fmean(r["points"][-1]["pass_k"]["1"] for r in sft),
        "v1_seeds": end.n, "v1_p": end.p,
        "v1_sft_gain": sft_gain.diff, "v1_sft_gain_p": sft_gain.p,
    }


def warmstart_table(folder: Path) -> str:
    """The warm-start pilots (``bench/cs_warmstart_pilots.py``, one record each), in the order they started; a pilot
    stopped early (``stopped``) shows its last probe and no sampled evaluation. The order id's digit-by-digit probe
    (teacher-forced) and the first digit's own weight are shown from the pilots that have them on."""
    records = sorted((_load(p) for p in folder.glob("*.json")), key=lambda r: (r["started"], r["name"]))
    lines = ["| pilot | model | peak lr | copy demos | action demos | curriculum | digit weight (user / order "
             "(first digit); the action's tool) | steps x batch | copy (teacher-forced) at step 50 / 100 / last | order id listed (greedy) "
             "at 100 / last | order digit 1 / 2 / 3 (teacher-forced) at last | loss (last 50 steps) "
             "| sampled: looked up | copied user | guessed | success | train s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        a = r["args"]
        if not r["curve"]:  # stopped in its drill phase: no probe of the task yet
            d = r["drill_phase"][-1]
            lines.append(f"| `{r['name']}` | {a['preset']} | {a['lr']:g} | - | - | {a['drill_phase']} drill steps first "
                         f"(copied {d['copied']:.2f} at step {d['step']}) | - | 0 of {a['steps']} x {a['batch']} "
                         "(stopped in the drills) |" + " - |" * 9)
            continue
        by, last = {c["step"]: c for c in r["curve"]}, r["curve"][-1]
        tf = " / ".join(f"{by[k]['copy_tf']:.2f}" if k in by else "-" for k in (50, 100)) + f" / {last['copy_tf']:.2f}"
        order = ((f"{by[100]['order_listed']:.2f}" if 100 in by else "-") + f" / {last['order_listed']:.2f}"
                 if "order_listed" in last else "- / -")  # probed from the order-weight pilots on
        digits = (" / ".join(f"{last[f'digit{k}_tf']:.2f}" for k in (1, 2, 3)) if "digit1_tf" in last
                  else "- / - / -")  # probed from the first-digit-weight pilots on
        steps = (f"{a['steps']} x {a['batch']}" if "stopped" not in r
                 else f"{last['step']} of {a['steps']} x {a['batch']} (stopped)")
        b = r["behaviour"]
        sampled = (f"{b['looked_up']:.2f} | **{b['copied_user']:.2f}** | {b['guessed']:.2f} | {r['success']:.3f} | "
                   f"{r['train_seconds']:.0f}") if b else "- | - | - | - | -"
        dw = a["digit_weight"]
        ow = a.get("order_weight") or dw
        fw = f" ({a['first_digit_weight']:g})" if a.get("first_digit_weight") is not None else ""
        fw += f"; tool {a['tool_weight']:g}" if a.get("tool_weight") is not None else ""
        model = (a["preset"] + (f", {a['layers']} layers" if a.get("layers") else "")
                 + (f", {a['kv_heads']} kv heads" if a.get("kv_heads") else ""))
        acts = f"{a.get('action_frac', 0.0):.1f}" + (f" (drills of {a['drill']})" if a.get("drill") else "")
        drills = (r.get("drill_phase") or [None])[-1]  # the drill phase's last probe (none without a phase)
        drill_at = f" at a {a['drill_lr']:g} peak" if a.get("drill_lr") else ""
        curriculum = f"{a['curriculum']:.2f}" + (f"; {a['drill_phase']} drill steps{drill_at} first (copied "
                                                  f"{drills['copied']:.2f} at their end)" if drills else "")
        lines.append(f"| `{r['name']}` | {model} | {a['lr']:g} | {a['copy_frac']:.1f} | {acts} "
                     f"| {curriculum} | {dw:g} / {ow:g}{fw} | {steps} | {tf} | {order} | {digits} "
                     f"| {last['loss']:.3f} | {sampled} |")
    return "\n".join(lines)


WARMSTART_RECIPE, WARMSTART_COPY_ONLY = "copy30-dw5", "copy30"  # the pilot of the task's recipe; copy demos alone


def warmstart_values(folder: Path) -> dict[str, Any]:
    r, c = _load(folder / f"{WARMSTART_RECIPE}.json"), _load(folder / f"{WARMSTART_COPY_ONLY}.json")
    rc, cc = {p["step"]: p for p in r["curve"]}, {p["step"]: p for p in c["curve"]}
    return {
        "ws_copied": r["behaviour"]["copied_user"], "ws_guessed": r["behaviour"]["guessed"], "ws_success": r["success"],
        "ws_wins": round(r["success"] * r["eval_episodes"]), "ws_episodes": r["eval_episodes"],
        "ws_minutes": r["train_seconds"] / 60, "ws_tf50": rc[50]["copy_tf"], "ws_tf100": rc[100]["copy_tf"],
        "co_tf100": cc[100]["copy_tf"], "co_tf150": cc[150]["copy_tf"], "co_loss150": cc[150]["loss"],
        **order_pilot_values(folder),
        **later_pilot_values(folder),
    }


ORDER_PILOT, ORDER_PILOT_LONG = "copy30-dw5-ow15-act30", "copy30-dw5-ow15-act30-700"  # the order id's levers


def order_pilot_values(folder: Path) -> dict[str, Any]:
    """The order-id pilots' figures the prose quotes: the greedy order copy's curve, the sampled episodes."""
    r, long = _load(folder / f"{ORDER_PILOT}.json"), _load(folder / f"{ORDER_PILOT_LONG}.json")
    rc, peak = {p["step"]: p for p in r["curve"]}, max(long["curve"], key=lambda p: p["order_listed"])
    return {
        "op_l100": rc[100]["order_listed"], "op_llast": r["curve"][-1]["order_listed"],
        "op_last_step": r["curve"][-1]["step"], "op_guessed": r["behaviour"]["guessed"], "op_success": r["success"],
        "op7_peak": peak["order_listed"], "op7_peak_step": peak["step"], "op7_llast": long["curve"][-1]["order_listed"],
        "op7_steps": long["curve"][-1]["step"], "op7_guessed": long["behaviour"]["guessed"],
        "op7_success": long["success"], "op7_wins": round(long["success"] * long["eval_episodes"]),
        "op7_episodes": long["eval_episodes"],
    }


DEEP_PILOT, FIRST_PILOT, LR_PILOT, KV_PILOT, FIRST_LONG, DRILL_PILOT = (  # the order id's later levers
    "tiny4l-copy30-dw5-ow15-act30", "copy30-dw5-ow15-fw1-act30", "copy30-dw5-ow15-fw1-act30-lr6e-3",
    "copy30-dw5-ow15-fw1-act30-kv4", "copy30-dw5-ow15-fw1-act30-800", "copy30-dw5-ow15-fw1-drill8")
DRILL_PHASE_PILOT, LONG_DRILLS = "drills400-copy30-dw5-ow15-fw1-act30", "drills1500-copy30-dw5-ow15-fw1-act30"


def later_pilot_values(folder: Path) -> dict[str, Any]:
    """The later order-id pilots' figures the prose quotes: depth, the first digit weighted apart, the rate, the
    key-value heads, the long schedule (its last probe if it was stopped)."""
    deep, first, lr, kv, long = (_load(folder / f"{n}.json") for n in (DEEP_PILOT, FIRST_PILOT, LR_PILOT, KV_PILOT,
                                                                       FIRST_LONG))
    dc, fl, lc, kl, ll = ({p["step"]: p for p in deep["curve"]}, first["curve"][-1], lr["curve"][-1], kv["curve"][-1],
                          long["curve"][-1])
    drill, d4 = _load(folder / f"{DRILL_PILOT}.json"), _load(folder / f"{DRILL_PHASE_PILOT}.json")
    d4c, d4l = {p["step"]: p for p in d4["curve"]}, d4["curve"][-1]
    dd, dl = {p["step"]: p for p in drill["curve"]}, drill["curve"][-1]
    return {
        "dr_l250": dd[250]["order_listed"], "dr_llast": dl["order_listed"], "dr_d1": dl["digit1_tf"],
        "dr_d2": dl["digit2_tf"], "dr_d3": dl["digit3_tf"], "dr_guessed": drill["behaviour"]["guessed"],
        "dr_success": drill["success"],
        "d4_copied": d4["drill_phase"][-1]["copied"], "d4_drill_s": d4["drill_phase"][-1]["seconds"],
        "d4_s": d4["train_seconds"], "d4_tf50": d4c[50]["copy_tf"], "d4_d2": d4l["digit2_tf"],
        "d4_d3": d4l["digit3_tf"], "d4_llast": d4l["order_listed"], "d4_guessed": d4["behaviour"]["guessed"],
        "d4_success": d4["success"],
        **low_rate_values(folder),
        **long_drill_values(_load(folder / f"{LONG_DRILLS}.json"), {p["step"]: p for p in d4["drill_phase"]}),
        "dp_l100": dc[100]["order_listed"], "dp_llast": deep["curve"][-1]["order_listed"],
        "dp_guessed": deep["behaviour"]["guessed"], "dp_success": deep["success"],
        "dp_minutes": deep["train_seconds"] / 60,
        "fp_d1": fl["digit1_tf"], "fp_d2": fl["digit2_tf"], "fp_d3": fl["digit3_tf"], "fp_llast": fl["order_listed"],
        "fp_guessed": first["behaviour"]["guessed"], "fp_success": first["success"],
        "lr_step": lc["step"], "lr_copy": lc["copy_tf"], "lr_loss": lc["loss"],
        "kv_llast": kl["order_listed"], "kv_d1": kl["digit1_tf"], "kv_d2": kl["digit2_tf"], "kv_d3": kl["digit3_tf"],
        "kv_guessed": kv["behaviour"]["guessed"], "kv_success": kv["success"],
        "kv_wins": round(kv["success"] * kv["eval_episodes"]), "kv_episodes": kv["eval_episodes"],
        "fl_step": ll["step"], "fl_l": ll["order_listed"],
    }


LOW_RATE_DRILLS = "drills300lr1e-3-copy30-dw5-ow15-act30"  # the pilot that copies the order's id


def low_rate_values(folder: Path) -> dict[str, Any]:
    """The low-rate drill pilots' figures (seeds 0 and 1, without and with the tool weighted)."""
    r = _load(folder / f"{LOW_RATE_DRILLS}.json")
    c, last = {p["step"]: p for p in r["curve"]}, r["curve"][-1]
    return {
        "lw_llast": last["order_listed"], "lw_l100": c[100]["order_listed"], "lw_d1": last["digit1_tf"],
        "lw_d2": last["digit2_tf"], "lw_d3": last["digit3_tf"], "lw_guessed": r["behaviour"]["guessed"],
        "lw_order": r["behaviour"]["right_order"], "lw_tool": r["behaviour"]["right_tool"], "lw_success": r["success"],
        "lw_wins": round(r["success"] * r["eval_episodes"]), "lw_episodes": r["eval_episodes"],
        "lw_s": r["train_seconds"], "lw_drill_s": r["drill_phase"][-1]["seconds"],
        **{f"s1_{k[3:]}": v for k, v in _low_rate_seed(folder / f"{LOW_RATE_DRILLS}-s1.json").items()},
        **_tool_weighted(_load(folder / "drills300lr1e-3-copy30-dw5-ow15-tw15-act30.json")),
        **{f"tw1_{k[3:]}": v for k, v in _tool_weighted(
            _load(folder / "drills300lr1e-3-copy30-dw5-ow15-tw15-act30-s1.json")).items()},
    }


def _tool_weighted(r: Mapping[str, Any]) -> dict[str, Any]:
    b = r["behaviour"]
    return {"tw_success": r["success"], "tw_wins": round(r["success"] * r["eval_episodes"]),
            "tw_episodes": r["eval_episodes"], "tw_tool": b["right_tool"], "tw_order": b["right_order"],
            "tw_guessed": b["guessed"], "tw_llast": r["curve"][-1]["order_listed"], "tw_s": r["train_seconds"]}


def _low_rate_seed(path: Path) -> dict[str, Any]:
    r = _load(path)
    c, last = {p["step"]: p for p in r["curve"]}, r["curve"][-1]
    return {"lw_llast": last["order_listed"], "lw_l100": c[100]["order_listed"], "lw_guessed": r["behaviour"]["guessed"],
            "lw_tool": r["behaviour"]["right_tool"], "lw_success": r["success"],
            "lw_wins": round(r["success"] * r["eval_episodes"]), "lw_episodes": r["eval_episodes"]}


def long_drill_values(r: Mapping[str, Any], short: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
    """The long drill phase's pilot: its drills' probes (and the short phase's at step 100), the task's at the end."""
    drills, last = {p["step"]: p for p in r["drill_phase"]}, r["curve"][-1]
    return {
        "d15_c150": drills[150]["copied"], "d4_c100": short[100]["copied"], "d15_drill_s": r["drill_phase"][-1]["seconds"],
        "d15_lo": min(p["copied"] for p in r["drill_phase"] if p["step"] >= 150),
        "d15_hi": max(p["copied"] for p in r["drill_phase"] if p["step"] >= 150),
        "d15_d1": last["digit1_tf"], "d15_d2": last["digit2_tf"], "d15_d3": last["digit3_tf"],
        "d15_llast": last["order_listed"], "d15_guessed": r["behaviour"]["guessed"], "d15_success": r["success"],
        "d15_wins": round(r["success"] * r["eval_episodes"]), "d15_episodes": r["eval_episodes"],
    }


def _v1_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for p in sorted(folder.glob("*-s*.json")):
        r = _load(p)
        out.setdefault(r["kind"], []).append(r)
    for rs in out.values():
        rs.sort(key=lambda r: r["seed"])
    if [r["seed"] for r in out["rl"]] != [r["seed"] for r in out["sft"]]:
        raise ValueError(f"{folder}: the RL and SFT seeds differ")
    return out


TASKS_QUOTES = (
    "played through the environment itself on the same {scenarios:,} scenarios, seed {seed}",
    "The best shortcut is the status one, {first_fit:.3f}",
    "every guess is below {guess_below:.3f}",
    "above the trivial policies only at a pass^1 above **{best_trivial:.2f}**",
    "A policy that learned the shortcut shows `first_fit` ~1 and `right_order` ~{shortcut_right_order:.2f}",
    "`right_order` ~1 and `first_fit` ~{skill_first_fit:.2f}",
    "A perfect imitator succeeds {imitate:.3f}, below the status shortcut",
    "it has to beat {first_fit:.2f} (the status shortcut) and {imitate:.2f} (the warm start's imitation ceiling)",
    "### Superseded: the v1 result (pass^1 {v1_v0:.3f} -> {v1_rl:.3f})",
    "raised the v1 task's pass^1 from {v1_v0:.3f} to {v1_rl:.3f} against {v1_sft:.3f} for a same-wall-time supervised "
    "control ({v1_seeds} seeds, p = {v1_p:.3f}",
    "RL's {v1_rl:.3f} was below every one of them but the last",
    "(teacher-forced copy {co_tf100:.2f} at step 100, {co_tf150:.2f} at 150, loss {co_loss150:.3f}:",
    "the copy is learned by step 100 ({ws_tf50:.2f} at 50, {ws_tf100:.2f} at 100)",
    "copies the request's user id in {ws_copied:.2f} of sampled held-out episodes",
    "{ws_guessed:.2f} of the episodes act on an id no lookup had shown (`guessed`), so success is {ws_success:.3f} "
    "({ws_wins} of {ws_episodes})",
    "for the user's id ({ws_copied:.2f}) and not for the order's",
    "(each pilot took {ws_minutes:.0f} min on the loaded cores)",
    "listed {op_l100:.2f} at step 100 and {op_llast:.2f} at {op_last_step}; sampled, `guessed` {op_guessed:.2f} and "
    "success {op_success:.3f}",
    "it rose to {op7_peak:.2f} (step {op7_peak_step}) and ended at {op7_llast:.2f} (step {op7_steps}); sampled, "
    "`guessed` {op7_guessed:.2f} and success {op7_success:.3f} ({op7_wins} of {op7_episodes})",
    "(its change from version 0: {v1_sft_gain:+.3f}, p = {v1_sft_gain_p:.2f})",
    "the order id listed (greedy) in {dp_l100:.2f} at step 100 and {dp_llast:.2f} at the end of 400",
    "sampled, `guessed` {dp_guessed:.2f} and success {dp_success:.3f} ({dp_minutes:.0f} min of training)",
    "the first digit is a fitting id's in {fp_d1:.2f}; the second follows the chosen id in {fp_d2:.2f}, the third in "
    "{fp_d3:.2f}",
    "the order id listed in {fp_llast:.2f} at the end ({op_llast:.2f} with the first digit at 15); sampled unchanged, "
    "`guessed` {fp_guessed:.2f} and success {fp_success:.3f}",
    "user copy {lr_copy:.2f} teacher-forced at step {lr_step}, loss {lr_loss:.3f}",
    "at step {fl_step} it listed {fl_l:.2f}, as the 400-step pilot did at step 100",
    "listed {dr_l250:.2f} at step 250 and {dr_llast:.2f} at 400, digits {dr_d1:.2f} / {dr_d2:.2f} / {dr_d3:.2f}; sampled "
    "`guessed` {dr_guessed:.2f} and success {dr_success:.3f}. Eight times",
    "the drills reached {d4_copied:.2f} of their trained digits by their end",
    "(teacher-forced {d4_tf50:.2f} at step 50; 0.00-0.08 in the pilots with neither a copy curriculum nor drills) and the third digit followed the first two in "
    "{d4_d3:.2f} ({fp_d3:.2f} without), but the second still followed the first in only {d4_d2:.2f}; listed "
    "{d4_llast:.2f} at the end, sampled `guessed` {d4_guessed:.2f} and success {d4_success:.3f}",
    "the drills cost {d4_drill_s:.0f} s of the pilot's {d4_s:.0f}",
    "learned by step 150 ({d15_c150:.2f} of their trained digits; the 400-step phase had {d4_c100:.2f} at step 100)",
    "; {d15_drill_s:.0f} s of drills)",
    "and stayed at {d15_lo:.2f}-{d15_hi:.2f} to the end",
    "success {tw_success:.3f} ({tw_wins} of {tw_episodes}), against the imitation ceiling's {imitate:.3f}**: `right_tool` "
    "{tw_tool:.2f}, `right_order` {tw_order:.2f}, `guessed` {tw_guessed:.2f}, greedy listed {tw_llast:.2f}; "
    "{tw_s:.0f} s of training",
    "With another seed (`-s1`): success {tw1_success:.3f} ({tw1_wins} of {tw1_episodes}), `right_tool` {tw1_tool:.2f}, "
    "`guessed` {tw1_guessed:.2f}, greedy listed {tw1_llast:.2f}",
    "the same recipe listed {s1_llast:.2f} at the end ({s1_l100:.2f} at step 100), `guessed` {s1_guessed:.2f}, "
    "`right_tool` {s1_tool:.2f}, success {s1_success:.3f} ({s1_wins} of {s1_episodes})",
    "Greedy, an id the listing showed in {lw_llast:.2f} at the end ({lw_l100:.2f} at step 100; {op_llast:.2f} without "
    "drills), teacher-forced digits {lw_d1:.2f} / {lw_d2:.2f} / {lw_d3:.2f}; sampled, `guessed` fell to {lw_guessed:.2f} "
    "(0.72-0.89 in every earlier pilot) and `right_order` rose to {lw_order:.2f}, but `right_tool` is {lw_tool:.2f}, a "
    "coin",
    "success is {lw_success:.3f} ({lw_wins} of {lw_episodes}), still below the imitation ceiling's {imitate:.3f}; "
    "{lw_s:.0f} s of training on the loaded cores, {lw_drill_s:.0f} s of it drills",
    "the second digit follows the first in {d15_d2:.2f} at the end, the third the first two in {d15_d3:.2f} "
    "({fp_d2:.2f} / {fp_d3:.2f} without drills)",
    "it is a fitting id's in only {d15_d1:.2f} ({fp_d1:.2f} without drills; its weight was 1 here), so the greedy id is "
    "listed in {d15_llast:.2f} and sampled `guessed` is {d15_guessed:.2f}, success {d15_success:.3f} ({d15_wins} of "
    "{d15_episodes})",
    "`--kv-heads 4`): listed {kv_llast:.2f}, digits {kv_d1:.2f} / {kv_d2:.2f} / {kv_d3:.2f}; sampled `guessed` "
    "{kv_guessed:.2f} and success {kv_success:.3f} ({kv_wins} of {kv_episodes})",
)


# --- docs/agents.md -----------------------------------------------------------------------------
def _rows(record: Mapping[str, Any], model: str) -> dict[tuple[int, str], Mapping[str, Any]]:
    return {(r["sessions"], r["path"]): r for r in record["models"][model]["rows"]}


def _ms(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def throughput_table(record: Mapping[str, Any]) -> str:
    target = record["target"]
    lines = ["| model | sessions | env tok/s | endpoint tok/s | endpoint / env (95% CI) | in-process / env | "
             "request p50 / p99 | worker + runner CPU per turn (env) |", "|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        rows = _rows(record, model)
        for sessions in sorted({s for s, _ in rows}):
            env, ep, ip = rows[(sessions, ENV)], rows[(sessions, ENDPOINT)], rows[(sessions, IN_PROCESS)]
            ratio = f"{ep['ratio']:.2f} ± {ep['ratio_ci95']:.2f}"
            if sessions == target["sessions"] and target["holds"][f"{model}/{ENDPOINT}"]["holds"]:
                ratio = f"**{ratio}**"
            lat = (f"{ep['p50_ms'] / 1e3:.2f} / {ep['p99_ms'] / 1e3:.2f} s" if ep["p99_ms"] >= 1000
                   else f"{ep['p50_ms']:.0f} / {ep['p99_ms']:.0f} ms")
            cpu = (f"{_ms(ep['worker_cpu_ms_per_turn'])} + {ep['runner_cpu_ms_per_turn']:.1f} ms "
                   f"({_ms(env['worker_cpu_ms_per_turn'])})")
            lines.append(f"| {model} | {sessions} | {env['tok_s']:,.0f} | {ep['tok_s']:,.0f} | {ratio} | "
                         f"{ip['ratio']:.2f} ± {ip['ratio_ci95']:.2f} | {lat} | {cpu} |")
    return "\n".join(lines)


def agents_values(data: Path) -> dict[str, Any]:
    r = _load(data / "agent_endpoint.json")
    s = r["target"]["sessions"]
    at = {m: _rows(r, m) for m in MODELS}
    null = {row["sessions"]: row for row in r["models"]["h64"]["null_engine"] if row["path"] == ENDPOINT}
    runner = [at[m][(s, ENDPOINT)]["runner_cpu_ms_per_turn"] for m in MODELS]
    gains = [at[m][(s, ENDPOINT)]["ratio"] - at[m][(s, IN_PROCESS)]["ratio"] for m in MODELS]
    out: dict[str, Any] = {
        "rounds": r["rounds"], "cpus": r["machine"]["cpus"], "threads": r["machine"]["torch_threads"],
        "minutes": r["wall_s"] / 60, "target": r["target"]["min_ratio"], "sessions": s,
        "runner_lo": min(runner), "runner_hi": max(runner), "gain_lo": min(gains), "gain_hi": max(gains),
        "null_1": null[1]["requests_s"], "null_32": null[32]["requests_s"],
        "null_1_p50": null[1]["p50_ms"], "null_32_p50": null[32]["p50_ms"],
        "h64_worker": at["h64"][(s, ENDPOINT)]["worker_cpu_ms_per_turn"],
        "h64_env_worker": at["h64"][(s, ENV)]["worker_cpu_ms_per_turn"],
        "throughput_table": throughput_table(r),
    }
    for m in MODELS:
        out[f"{m}_ratio"] = at[m][(s, ENDPOINT)]["ratio"]
        out[f"{m}_added"] = at[m][(s, ENDPOINT)]["added_ms"]
        out[f"{m}_turn_ms"] = at[m][(s, ENV)]["turn_gap_p50_ms"]
    out["smollm2_turn_s"] = out["smollm2_turn_ms"] / 1e3
    return out


AGENTS_QUOTES = (
    "is {rounds} rounds on {cpus} cores with nothing else running, {threads} torch thread, {minutes:.0f} minutes",
    "**The {target:.1f}x target at {sessions} sessions holds for a real model's forward** (`smollm2`: {smollm2_ratio:.2f}x, "
    "the endpoint's added latency per request {smollm2_added:.0f} ms against a {smollm2_turn_s:.1f} s turn)",
    "({h64_ratio:.2f}x at `h64`, {h256_ratio:.2f}x at `h256`)",
    "({runner_lo:.1f}-{runner_hi:.1f} ms per request at {sessions} sessions)",
    "(the worker's {h64_worker:.1f} ms per turn against the environment class's {h64_env_worker:.1f} at `h64`)",
    "is {h64_added:.0f} ms at `h64`, {h256_added:.0f} ms at `h256` and {smollm2_added:.0f} ms at `smollm2`, against "
    "turns of {h64_turn_ms:.0f} ms, {h256_turn_ms:.0f} ms and {smollm2_turn_s:.1f} s",
    "gains {gain_lo:.2f}-{gain_hi:.2f}x over the in-process design at {sessions} sessions",
    "the endpoint answers {null_1:.0f} requests/s for one session and {null_32:.0f} for {sessions} (p50 {null_1_p50:.0f} "
    "and {null_32_p50:.0f} ms: the null engine of the record)",
)


# --- rendering ----------------------------------------------------------------------------------
FIELD = re.compile(r"\{(\w+)(?::([^}]*))?\}")


def _pattern(template: str) -> re.Pattern[str]:
    """The template's words literally (any run of whitespace where it has a space: the doc may wrap), a number
    in each field."""
    parts, last = [], 0
    for m in FIELD.finditer(template):
        parts += [re.escape(template[last:m.start()]), NUMBER]
        last = m.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(re.sub(r"(?:\\ | )+", r"\\s+", p) if p != NUMBER else p for p in parts))


def fill_quote(text: str, template: str, values: Mapping[str, Any]) -> str:
    """``text`` with the one occurrence of ``template`` carrying the records' numbers."""
    hits = list(_pattern(template).finditer(text))
    if len(hits) != 1:
        raise ValueError(f"quote {template!r} found {len(hits)} times (needs exactly 1): reword the doc or the template")
    hit = hits[0]
    numbers = [format(values[name], spec or "") for name, spec in FIELD.findall(template)]
    out, last = [], hit.start()
    for i, number in enumerate(numbers, start=1):
        out += [text[last:hit.start(i)], number]
        last = hit.end(i)
    out.append(text[last:hit.end()])
    return text[:hit.start()] + "".join(out) + text[hit.end():]


def fill_block(text: str, name: str, content: str) -> str:
    return page_blocks.fill_block(text, BEGIN.format(name), END.format(name), content)


DOCS_SPEC: dict[str, tuple[Callable[[Path], dict[str, Any]], Sequence[str], dict[str, str]]] = {
    "tasks.md": (tasks_values, TASKS_QUOTES, {"baselines": "baselines_table", "warmstart": "warmstart_table"}),
    "agents.md": (agents_values, AGENTS_QUOTES, {"throughput": "throughput_table"}),
}


def render(data: Path = DATA, folder: Path = DOCS) -> dict[Path, str]:
    """Each doc with its blocks and quotes filled from the records (not written)."""
    out: dict[Path, str] = {}
    for name, (values_of, quotes, blocks) in DOCS_SPEC.items():
        values = values_of(data)
        path = folder / name
        text = path.read_text()
        for block, key in blocks.items():
            text = fill_block(text, block, values[key])
        for template in quotes:
            text = fill_quote(text, template, values)
        out[path] = text
    return out


def stale(data: Path = DATA, folder: Path = DOCS) -> list[str]:
    """A unified diff per doc that differs from its records (empty: all current)."""
    return ["".join(difflib.unified_diff(p.read_text().splitlines(True), text.splitlines(True), str(p), "records"))
            for p, text in render(data, folder).items() if p.read_text() != text]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a doc differs from its records")
    args = parser.parse_args()
    if args.check:
        diffs = stale()
        print("".join(diffs) or "docs/tasks.md and docs/agents.md match their records")
        raise SystemExit(1 if diffs else 0)
    for path, text in render().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
