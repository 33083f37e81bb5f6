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
(the token-weighted sum of the same fp32 weights). Run: ``.venv/bin/python bench/ewma_history_memory.py``.
"""

import argparse

import torch

from asyncrl.api.model_arch import PRESETS, ModelArch, parameter_count
from asyncrl.trainer.correction import EwmaController
from asyncrl.trainer.correction.ewma_history import RESIDUAL_UNIT_ROUNDOFF
from asyncrl.trainer.correction.ewma_reset import next_batch_versions

MIB = 2**20


def tiny_arch() -> ModelArch:
    """tiny-llama with the vocabulary of the confirmatory task's tokenizer (bench/paper/external.py)."""
    import dataclasses
    import sys
    from pathlib import Path

    from asyncrl.api.validation import validate_job
    from asyncrl.rollout.envs.binding import task_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent / "paper"))
    import external

    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "m"},
           "spec": {"task": external.task_section(external.FULL)}}
    spec = validate_job(doc).spec
    return dataclasses.replace(PRESETS["tiny-llama"], vocab_size=task_tokenizer(spec.model, spec.task).vocab_size)


def memory_rows(name: str, params: int, windows: list[int]) -> list[str]:
    rows = []
    for w in windows:
        prox = 4 * params
        before, after = (w + 2) * 4 * params, w * 2 * params
        bf16_copies = (w + 1) * 2 * params
        rows.append(f"| {name} | {params:,} | {w} | {before / MIB:.2f} ({(w + 2):.1f}) | "
                    f"{bf16_copies / MIB:.2f} ({(w + 1) / 2:.1f}) | **{after / MIB:.2f} ({w / 2:.1f})** | "
                    f"{(prox + before) / MIB:.2f} | **{(prox + after) / MIB:.2f}** | {prox / MIB:.2f} |")
    return rows


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="1,2,3,4,8")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    tiny, smol = tiny_arch(), PRESETS["smollm2-135m"]
    print("## Bytes (MiB; in parentheses: fp32 copies of the weights)\n")
    print("| model | parameters | W | history before: W + 2 fp32 | option: W + 1 bf16 copies | after: W bf16 residuals "
          "| EWMA state before (memory = checkpoint) | after | option: no history in checkpoints |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, arch in (("tiny (spell_backward)", tiny), ("SmolLM2-135M", smol)):
        print("\n".join(memory_rows(name, parameter_count(arch), windows)))
    from asyncrl.api.model_arch import hf_param_shapes

    shapes = hf_param_shapes(tiny, with_tied_head=False)
    print(f"\n## The recentre target's max abs difference from a float64 reference (tiny shapes, {args.seeds} seeds, "
          "max over them)\n")
    print("| W | lr | one version's max movement | fp32 copies (before) | bf16 weight copies | bf16 residuals (after) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for w in (2, 3):
        for lr in (1e-4, 3e-4, 1e-3):
            runs = [errors(shapes, w, lr, s) for s in range(args.seeds)]
            m = {k: max(r[k] for r in runs) for k in runs[0]}
            print(f"| {w} | {lr:g} | {m['movement']:.2e} | {m['copies_fp32']:.2e} | {m['copies_bf16']:.2e} | "
                  f"{m['residuals_bf16']:.2e} |")
    print(f"\nbf16 unit roundoff {RESIDUAL_UNIT_ROUNDOFF:g}; the stated bound: 2^-8 x the sum of the W residuals' "
          "magnitudes, plus fp32 rounding (tests/trainer/test_ewma_history.py).")


if __name__ == "__main__":
    main()
