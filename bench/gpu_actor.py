"""``bench/gpu_check.py``'s ``actor-<model>`` stage: the real :class:`MegatronActor` end to end on the device.

The actor as a job builds it (``spec.model.weights`` = the SmolLM2 folder; ``--tiny``: the tiny random Llama),
with megatron's ``DistributedOptimizer`` (``spec.actor.megatron.distributedOptimizer: true``) and, on CUDA,
bf16 params with fp32 main params (``precision: bf16``; on the CPU fp32 under the shim): ``opts.steps``
``train_step`` calls on one fixed batch (``behavior`` reference, two minibatches), then a checkpoint round trip
(``save_actor`` -> a fresh actor -> ``load_actor``) and one more step on both. Reported: trained tokens/s
(steps after the first), peak CUDA memory, save/load seconds, max |log-prob diff| of the reloaded actor on the
batch (must be 0: the weights are restored bit-exactly) and the next step's |loss| and weight diffs (the
optimizer state restored: the reloaded actor steps like the original).
"""

import gc
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any


def _actor(opts: Any, folder: Path, bf16: bool) -> Any:
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.api.model_arch import folder_config
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor

    spec = AsyncRLJobSpec.model_validate({
        "model": {"weights": str(folder)},
        "correction": {"reference": "behavior"},
        "train": {"learningRate": 1e-5, "minibatches": 2, "maxGradNorm": 1.0},
        "actor": {"megatron": {"distributedOptimizer": True, "precision": "bf16" if bf16 else "fp32"}},
    })
    vocab = int((folder_config(str(folder)) or {})["vocab_size"])
    settings = ActorSettings.from_spec(spec, vocab, max_sequence_length=1024)
    return MegatronActor(replace(settings, device=opts.device))


def _batch(actor: Any, rows: int, length: int) -> Any:
    import torch

    from asyncrl.trainer.actor.batch import TrainBatch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, actor.settings.arch.vocab_size, (rows, length), generator=g)
    mask = torch.zeros(rows, length, dtype=torch.bool)
    mask[:, length // 4:] = True
    logp_mu = actor.logprobs(tokens).float().cpu() * mask
    adv = torch.linspace(-1, 1, rows)[:, None].expand(rows, length).contiguous()
    return TrainBatch(tokens, mask, logp_mu, torch.where(mask, 0, -1), adv, torch.where(mask, 0, -1))


def actor_roundtrip(opts: Any, folder: Path, sync: Any, peak_gib: Any) -> tuple[str, dict[str, Any]]:
    """The stage: see the module docstring. ``sync``/``peak_gib``: gpu_check's device helpers."""

    from asyncrl.trainer.actor.checkpoint_io import load_actor, save_actor
    from asyncrl.trainer.megatron import compat

    rows, length = (4, 16) if opts.tiny else (8, 512)
    actor = _actor(opts, folder, bf16=opts.cuda)
    kind = compat.optimizer_kind(actor._optimizer)
    if "DistributedOptimizer" not in kind:
        raise RuntimeError(f"asked for megatron's distributed optimizer, the actor runs {kind}")
    batch = _batch(actor, rows, length)
    times, losses, norms = [], [], []
    for _ in range(max(opts.steps, 2)):
        sync(opts)
        t0 = time.perf_counter()
        m = actor.train_step(batch)
        sync(opts)
        times.append(time.perf_counter() - t0)
        losses.append(m.loss)
        norms.append(m.grad_norm)
        if not m.applied:
            raise RuntimeError(f"train_step {len(times)} applied no update (grad norm {m.grad_norm})")
    tokens = int(batch.loss_mask.sum())
    tok_s = tokens * (len(times) - 1) / sum(times[1:])
    peak = peak_gib(opts)
    ckpt = opts.work / "actor-ckpt"
    t0 = time.perf_counter()
    save_actor(actor, str(ckpt))
    save_s = time.perf_counter() - t0
    fresh = _actor(opts, folder, bf16=opts.cuda)
    t0 = time.perf_counter()
    load_actor(fresh, str(ckpt))
    load_s = time.perf_counter() - t0
    reloaded_version = fresh.version
    mask = batch.loss_mask.to(actor.runtime.device)
    before, after = actor.logprobs(batch.tokens), fresh.logprobs(batch.tokens)
    logp_diff = float((before.float() - after.float())[mask].abs().max())
    a, b = actor.train_step(batch), fresh.train_step(batch)
    weight_diff = max(float((p.float() - q.float()).abs().max())
                      for p, q in zip(actor._params, fresh._params, strict=True))
    values = {"params": sum(p.numel() for p in actor._params), "batch": f"{rows}x{length}", "steps": len(times),
              "optimizer": kind, "precision": "bf16 params + fp32 main" if opts.cuda else "fp32",
              "losses": losses, "grad_norms": norms, "step_seconds": times, "tokens_per_s": tok_s,
              "peak_mem_gib": peak, "save_s": save_s, "load_s": load_s, "reload_logp_max_abs_diff": logp_diff,
              "next_step_loss_diff": abs(a.loss - b.loss), "next_step_weight_max_abs_diff": weight_diff,
              "version_after_reload": reloaded_version}
    del actor, fresh
    gc.collect()
    mem = f"{peak:.2f} GiB" if peak is not None else "n/a (CPU)"
    summary = (f"{values['params'] / 1e6:.1f}M params, {values['precision']}, {kind}, {len(times)} train_steps of "
               f"{rows}x{length}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, {tok_s:,.0f} trained tokens/s, peak mem "
               f"{mem}; checkpoint save {save_s:.1f} s, load {load_s:.1f} s, reload max|dlogp| {logp_diff:.1e}, next "
               f"step |dloss| {values['next_step_loss_diff']:.1e} max|dw| {weight_diff:.1e}")
    if not (logp_diff == 0.0 and math.isfinite(losses[-1]) and values["version_after_reload"] == len(times)):
        raise RuntimeError(summary)
    return summary, values
