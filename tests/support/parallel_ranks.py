"""Run the real actor as a group of gloo ranks (spawned processes) and collect what each rank saw.

Used by ``tests/trainer/test_parallel_*.py``: every rank builds :class:`MegatronActor` at its place in the
layout, trains the same global batch for a few steps and writes its figures to ``out/rank<r>.pt``.
"""

import os
from dataclasses import replace
from typing import Any

import torch
import torch.multiprocessing as mp

VOCAB = 64
B, T = 8, 16


def job(reference: str = "behavior", max_grad_norm: float = 0.1, minibatches: int = 2,
        micro_batch_tokens: int = 32) -> dict[str, Any]:
    return {
        "correction": {"reference": reference},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64},
        "task": {"temperature": 1.0, "groupSize": 2},
        "train": {"learningRate": 1e-2, "seed": 3, "promptsPerStep": 4, "maxGradNorm": max_grad_norm,
                  "minibatches": minibatches, "microBatchTokens": micro_batch_tokens},
    }


def _batch(actor: Any) -> Any:
    """One fixed global batch: right-padded rows of different lengths, mixed-sign advantages."""
    from asyncrl.trainer.megatron.batch import TrainBatch

    g = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    for i, end in enumerate([16, 9, 14, 7, 16, 12, 10, 15]):
        loss_mask[i, 4:end] = True
    logp_mu = (actor.logprobs(tokens) + 0.05 * torch.randn(B, T, generator=g)) * loss_mask
    versions = torch.where(loss_mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -1))
    advantages = torch.tensor([1.0, -0.5, -1.0, 0.7, 0.3, -0.2, 1.2, -0.9])[:, None].expand(B, T).contiguous()
    turn_ids = torch.where(loss_mask, torch.zeros(B, T, dtype=torch.long), torch.full((B, T), -1))
    return TrainBatch(tokens, loss_mask, logp_mu, versions, advantages, turn_ids)


def _rank_main(rank: int, world: int, tp: int, init_method: str | None, out: str, cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.megatron.parallel import Layout

    spec = AsyncRLJobSpec.model_validate(cfg["job"])
    settings = ActorSettings.from_spec(spec, VOCAB)
    settings = replace(settings, device="cpu",
                       layout=Layout(tp=tp, rank=rank, world=world, init_method=init_method))
    actor = MegatronActor(settings)
    batch = _batch(actor)
    result: dict[str, Any] = {"rank": rank, "dp": (actor.dp_rank, actor.dp_size)}
    if cfg.get("norm_probe"):
        result["norms"] = _norm_probe(actor, batch)
    if cfg.get("nan_on_rank") == rank:
        import asyncrl.trainer.correction as correction

        real = correction.correction_loss
        calls = {"n": 0}

        def poisoned(*args: Any, **kwargs: Any) -> Any:
            res = real(*args, **kwargs)
            calls["n"] += 1
            return replace(res, loss=res.loss * float("nan")) if calls["n"] == 1 else res

        correction.correction_loss = poisoned  # this rank's first micro-batch only
    steps = []
    for _ in range(cfg.get("steps", 3)):
        m = actor.train_step(batch)
        steps.append({"loss": m.loss, "grad_norm": m.grad_norm, "stepped": m.stepped, "version": m.version,
                      "applied": m.updates_applied, "skipped": m.updates_skipped,
                      "valid_tokens": m.correction.get("valid_tokens"), "logp": actor.logprobs(batch.tokens)})
    result["steps"] = steps
    result["weights"] = actor.hf_state_dict()
    result["mask"] = batch.loss_mask
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _norm_probe(actor: Any, batch: Any) -> dict[str, float]:
    """One backward of a plain loss: the stock (per-shard) norm beside the model-parallel-aware one."""
    import math

    from asyncrl.trainer.megatron.parallel import grad_norm_squared

    actor._optimizer.zero_grad()
    logp = actor._logprobs(batch.tokens, 1.0)
    (-(logp * batch.loss_mask).sum() / batch.loss_mask.sum()).backward()
    actor._ddp.finish_grad_sync()
    params = actor._params
    for p in params:
        p.grad = p.main_grad
    stock = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
    aware = math.sqrt(float(grad_norm_squared(params)))
    actor._optimizer.zero_grad()
    return {"stock": stock, "aware": aware}


def run_ranks(world: int, tp: int, out: str, cfg: dict[str, Any], timeout: float = 600.0) -> list[dict[str, Any]]:
    """Spawn ``world`` ranks (tensor parallel ``tp``, DP = the rest), wait, and return their results."""
    from asyncrl.trainer.megatron.parallel import rendezvous

    init_method = rendezvous("127.0.0.1") if world > 1 else None
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, world, tp, init_method, out, cfg)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    if any(c != 0 for c in codes):
        raise RuntimeError(f"ranks exited with {codes} (world {world}, tp {tp})")
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(world)]
