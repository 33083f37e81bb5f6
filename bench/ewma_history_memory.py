"""What the ``recentre`` reset's history costs, and how far its target moves, before and after the bf16 residuals.

Bytes come from the model shapes alone (``asyncrl.api.model_arch.parameter_count``; nothing is loaded): the
tiny model as the confirmatory experiment's ``spell_backward`` task sizes it (tiny-llama, the task tokenizer's
vocabulary) and SmolLM2-135M's shape. Before (the first implementation): ``theta_prox`` fp32 + the last
``W + 2`` versions as fp32 copies, in memory and in every checkpoint. After
(``trainer/correction/ewma_history.py``): ``theta_prox`` fp32 + ``W`` bf16 residuals; the bench also prints
the options not taken (bf16 weight copies of the ``W + 1`` needed versions; no history in checkpoints).

The target's error is measured on the tiny model's shapes: weights drawn like an init (std 0.02) that move
like Adam's (about ``lr`` per element per version), the EWMA at ``decay: auto`` (``W / (W + 2)``), a reset
at version 12 with tokens spread over the staleness window; each rule's target against a float64 reference
(the token-weighted sum of the same fp32 weights). Run: ``.venv/bin/python bench/ewma_history_memory.py`` (writes
``docs/results/data/ewma_history_memory.json``, which ``docs/results.md``'s default-rule note quotes; nothing here is
timed, so a rerun gives the same record).
"""

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model_arch import PRESETS, ModelArch, parameter_count
from asyncrl.trainer.correction import EwmaController
from asyncrl.trainer.correction.ewma_history import RESIDUAL_UNIT_ROUNDOFF
from asyncrl.trainer.correction.ewma_reset import next_batch_versions

MIB = 2**20
RECORD = Path(__file__).resolve().parents[1] / "docs" / "results" / "data" / "ewma_history_memory.json"


def tiny_arch() -> ModelArch:
    """tiny-llama with the vocabulary of the confirmatory task's tokenizer (bench/paper/external.py)."""
    import dataclasses
    import sys

    from asyncrl.api.validation import validate_job
    from asyncrl.rollout.envs.binding import task_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent / "paper"))
    import external

    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "m"},
           "spec": {"task": external.task_section(external.FULL)}}
    spec = validate_job(doc).spec
    return dataclasses.replace(PRESETS["tiny-llama"], vocab_size=task_tokenizer(spec.model, spec.task).vocab_size)


def memory(params: int, window: int) -> dict[str, int]:
    """Bytes of the EWMA state for ``params`` parameters at ``W = window`` (fp32 = 4 bytes, bf16 = 2)."""
    prox = 4 * params
    return {"W": window, "theta_prox": prox, "history_before": (window + 2) * 4 * params,
            "history_bf16_copies": (window + 1) * 2 * params, "history_after": window * 2 * params,
            "state_before": prox + (window + 2) * 4 * params, "state_after": prox + window * 2 * params}


def memory_rows(name: str, params: int, rows: list[dict[str, int]]) -> list[str]:
    out = []
    for m in rows:
        w = m["W"]
        out.append(f"| {name} | {params:,} | {w} | {m['history_before'] / MIB:.2f} ({w + 2:.1f}) | "
                   f"{m['history_bf16_copies'] / MIB:.2f} ({(w + 1) / 2:.1f}) | "
                   f"**{m['history_after'] / MIB:.2f} ({w / 2:.1f})** | {m['state_before'] / MIB:.2f} | "
                   f"**{m['state_after'] / MIB:.2f}** | {m['theta_prox'] / MIB:.2f} |")
    return out


def walk(shapes: dict[str, tuple[int, ...]], n: int, lr: float, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    w = {k: 0.02 * torch.randn(*s, generator=g) for k, s in shapes.items()}
    out = []
    for _ in range(n):
        out.append({k: t.clone() for k, t in w.items()})
        w = {k: t + lr * torch.sign(torch.randn(t.shape, generator=g)) * torch.rand(t.shape, generator=g)
             for k, t in w.items()}
    return out


def errors(shapes: dict[str, tuple[int, ...]], window: int, lr: float, seed: int) -> dict[str, float]:
    t = 12
    ws = walk(shapes, t + 1, lr, seed)
    ctl = EwmaController(decay="auto", max_staleness=window, rule="recentre", consecutive_steps=1, margin=0.1)
    ctl.init(ws[0], version=0)
    for v in range(1, t):
        ctl.update(ws[v], 0.9, version=v, token_versions={v - 1: 1})
    tokens = {t - 1 - i: 10 + 7 * i for i in range(window + 1)}  # older versions carry more tokens (Adam-like)
    counts = next_batch_versions(tokens, t)
    total = sum(counts.values())
    assert ctl.update(ws[t], 0.1, version=t, token_versions=tokens).reset
    out = {"residuals_bf16": 0.0, "copies_fp32": 0.0, "copies_bf16": 0.0, "movement": 0.0, "bound": 0.0}
    for k in shapes:
        exact = sum(c * ws[v][k].double() for v, c in counts.items()) / total
        fp32 = torch.zeros_like(ws[t][k])
        bf16 = torch.zeros_like(ws[t][k])
        for v, c in counts.items():
            fp32.add_(ws[v][k], alpha=c / total)
            bf16.add_(ws[v][k].to(torch.bfloat16).float(), alpha=c / total)
        out["residuals_bf16"] = max(out["residuals_bf16"], float((ctl.params[k].double() - exact).abs().max()))
        out["copies_fp32"] = max(out["copies_fp32"], float((fp32.double() - exact).abs().max()))
        out["copies_bf16"] = max(out["copies_bf16"], float((bf16.double() - exact).abs().max()))
        out["movement"] = max(out["movement"], float((ws[t][k] - ws[t - 1][k]).abs().max()))
    return out


def saved_bytes(shapes: dict[str, tuple[int, ...]], window: int) -> int:
    """Bytes of the recentre controller's checkpointed state after a few versions (torch.save)."""
    import io

    ws = walk(shapes, 8, 1e-4, 0)
    ctl = EwmaController(decay="auto", max_staleness=window, rule="recentre")
    ctl.init(ws[0], version=0)
    for v in range(1, 8):
        ctl.update(ws[v], 0.9, version=v)
    buf = io.BytesIO()
    torch.save(ctl.state_dict(), buf)
    return buf.tell()


def measure(windows: list[int], seeds: int) -> dict[str, Any]:
    """The record: bytes from the shapes, the measured checkpoint state, the target's errors."""
    from asyncrl.api.model_arch import hf_param_shapes

    tiny, smol = tiny_arch(), PRESETS["smollm2-135m"]
    models = [{"name": name, "parameters": parameter_count(arch),
               "bytes": [memory(parameter_count(arch), w) for w in windows]}
              for name, arch in (("tiny (spell_backward)", tiny), ("SmolLM2-135M", smol))]
    shapes = hf_param_shapes(tiny, with_tied_head=False)
    rows = []
    for w in (2, 3):
        for lr in (1e-4, 3e-4, 1e-3):
            runs = [errors(shapes, w, lr, s) for s in range(seeds)]
            rows.append({"W": w, "lr": lr, "seeds": seeds, **{k: max(r[k] for r in runs) for k in runs[0]}})
    return {"bench": "bench/ewma_history_memory.py", "models": models,
            "saved_state_tiny_w3_bytes": saved_bytes(shapes, 3), "errors": rows,
            "unit_roundoff": RESIDUAL_UNIT_ROUNDOFF}


def report(record: Mapping[str, Any]) -> str:
    lines = ["## Bytes (MiB; in parentheses: fp32 copies of the weights)", "",
             "| model | parameters | W | history before: W + 2 fp32 | option: W + 1 bf16 copies | after: W bf16 residuals "
             "| EWMA state before (memory = checkpoint) | after | option: no history in checkpoints |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in record["models"]:
        lines += memory_rows(m["name"], m["parameters"], m["bytes"])
    lines += ["", "Per version: before 4 bytes a parameter (fp32 copy), after 2 (bf16 residual). Measured, the "
              "controller's state_dict through torch.save (tiny shapes, W = 3, after 8 versions): "
              f"{record['saved_state_tiny_w3_bytes'] / MIB:.2f} MiB (theta_prox + 3 residuals + scalars).", "",
              "## The recentre target's max abs difference from a float64 reference (tiny shapes, max over seeds)", "",
              "| W | lr | seeds | one version's max movement | fp32 copies (before) | bf16 weight copies | "
              "bf16 residuals (after) |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in record["errors"]:
        lines.append(f"| {r['W']} | {r['lr']:g} | {r['seeds']} | {r['movement']:.2e} | {r['copies_fp32']:.2e} | "
                     f"{r['copies_bf16']:.2e} | {r['residuals_bf16']:.2e} |")
    lines += ["", f"bf16 unit roundoff {record['unit_roundoff']:g}; the stated bound: 2^-8 x the sum of the W residuals' "
              "magnitudes, plus fp32 rounding (tests/trainer/test_ewma_history.py)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="1,2,3,4,8")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--record", default=str(RECORD), help="where the JSON record goes ('-': nowhere)")
    args = parser.parse_args()
    record = measure([int(w) for w in args.windows.split(",")], args.seeds)
    print(report(record))
    if args.record != "-":
        Path(args.record).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record}")


if __name__ == "__main__":
    main()
