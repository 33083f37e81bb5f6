"""The MoE routing-replay section of docs/results.md, from ``docs/results/data/moe_replay/*.json`` alone.

The records are written by ``bench/moe_discrepancy.py --json`` (issue 37): one run, replay off / R2 / R3 under
exact and current old logits side by side, plus the cost of capture and replay.
"""

import json
from pathlib import Path
from typing import Any

TITLE = "## MoE routing replay: the routing part of the train–inference gap"


def _row(r: dict[str, Any]) -> list[str]:
    return [r["replay"], r["reference"], f"{r['positions_routed_differently']:.3f}", f"{r['tokens_reached']:.3f}",
            f"{r['abs_log_rd_mean']:.2e}", f"{r['abs_log_rd_p50']:.2e}", f"{r['abs_log_rd_p99']:.2e}",
            f"{r['keep_ratio']:.3f}", f"{r['kl_k3']:.2e}"]


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def section(data_dir: Path) -> str:
    """The markdown section (one table per record under ``data_dir/moe_replay``)."""
    lines = [TITLE, ""]
    records = sorted((data_dir / "moe_replay").glob("*.json"))
    if not records:
        return "\n".join(lines + ["No records under `docs/results/data/moe_replay/` yet.", ""])
    for path in records:
        rec = json.loads(path.read_text())
        m, s, c = rec["model"], rec["setup"], rec["cost"]
        lines += [
            f"`bench/moe_discrepancy.py` (`{path.name}`): a tiny random Qwen3-MoE ({m['layers']} MoE layers, "
            f"{m['experts']} experts, top-{m['top_k']}, hidden {m['hidden']}), **bf16** transformers rollout against "
            f"the **fp32** megatron actor, {s['sampled_tokens']} sampled tokens of {s['episodes']} episodes. Three "
            "versions: v0 is the folder, v1 and v2 each add a random step of relative size "
            f"{s['weight_step']} to every weight (a stand-in for optimizer steps); rollout starts under v0 and "
            "receives v1 in the middle of every trajectory (the engine re-prefills the prefix under v1), the "
            "actor is at v2 (`current`). *positions differ*: share of the fed positions (prompt included) whose "
            "reference forward routes to another expert set than the rollout did, in at least one layer; *tokens "
            "reached*: share of sampled tokens with such a position in their context. R2 leaves `r_d` as it is "
            "(its reference forward routes by itself; training replays those routes); R2 with exact is not built "
            "(refused at validation). Keep ratio at `[0.99, 1.01]`; k3 KL is `E_mu[r - 1 - log r]`, `r = r_d`.",
            "",
            _table(["replay", "reference", "positions differ", "tokens reached", "\\|log r_d\\| mean", "p50", "p99",
                    "keep [0.99, 1.01]", "k3 KL"], [_row(r) for r in rec["rows"]]),
            "",
            f"Cost: routes take {c['route_bytes_per_token_all_versions']:.1f} bytes per token in the trajectories "
            f"(uint8, every version's block; a trajectory spanning two versions stores its prefix twice) and "
            f"{c['route_bytes_per_token_newest']:.0f} bytes per token in the training batch (layers x k). Rollout "
            f"with capture took {c['rollout_capture_over_plain']:.2f}x the time without, and a training forward + "
            f"backward with replay {c['train_fwd_bwd_replay_over_plain']:.2f}x the one without (best of "
            f"{len(c['rollout_seconds']['capture'])} alternated runs each, on 2 cores shared with other work: the "
            "per-run times spread by several times, so both ratios say only that the overhead is below this "
            "machine's noise at this model size).",
            "",
        ]
    return "\n".join(lines)
