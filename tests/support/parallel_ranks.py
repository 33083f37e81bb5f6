"""Run the real actor as a group of gloo ranks (spawned processes) and collect what each rank saw.

Used by ``tests/trainer/test_parallel_*.py``: every rank builds :class:`MegatronActor` at its place in the
layout, trains the same global batch for a few steps and writes its figures to ``out/rank<r>.pt``.
"""

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from tests.support.rank_processes import rank_context

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


def _applied(m: Any) -> bool:
    """Whether the step's updates applied (``TrainStepMetrics.applied``; ``stepped`` before the step report
    was restructured)."""
    return bool(m.applied if hasattr(m, "applied") else m.stepped)


def _record(part: Any) -> dict[str, float]:
    """A step report's typed part (correction counts, audit) as its flat record; ``{}`` when absent."""
    if part is None:
        return {}
    return dict(part.record() if hasattr(part, "record") else part)


def _batch(actor: Any) -> Any:
    """One fixed global batch: right-padded rows of different lengths, mixed-sign advantages."""
    from asyncrl.trainer.actor.batch import TrainBatch

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
    from asyncrl.trainer.megatron import compat
    from asyncrl.trainer.megatron.parallel import Layout

    spec = AsyncRLJobSpec.model_validate(cfg["job"])
    settings = ActorSettings.from_spec(spec, VOCAB)
    settings = replace(settings, device="cpu",
                       layout=Layout(tp=tp, rank=rank, world=world, init_method=init_method))
    actor = MegatronActor(settings)
    batch = _batch(actor)
    result: dict[str, Any] = {"rank": rank, "dp": (actor.dp_rank, actor.dp_size),
                              "optimizer": compat.optimizer_kind(actor._optimizer)}
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
        steps.append({"loss": m.loss, "grad_norm": m.grad_norm, "stepped": _applied(m), "version": m.version,
                      "applied": m.updates_applied, "skipped": m.updates_skipped,
                      "valid_tokens": _record(m.correction).get("valid_tokens"), "logp": actor.logprobs(batch.tokens)})
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


def spawn_ranks(target: Callable[..., None], extra: tuple[Any, ...], world: int, tp: int, out: str,
                timeout: float, what: str = "") -> list[dict[str, Any]]:
    """Spawn ``world`` processes ``target(rank, world, tp, init_method, out, *extra)`` (one TCP rendezvous),
    wait up to ``timeout`` s, kill stragglers, and return each rank's ``rank<r>.pt`` in ``out``."""
    from asyncrl.trainer.megatron.parallel import rendezvous

    init_method = rendezvous("127.0.0.1") if world > 1 else None
    ctx = rank_context()
    procs = [ctx.Process(target=target, args=(r, world, tp, init_method, out, *extra)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    if any(c != 0 for c in codes):
        raise RuntimeError(f"ranks exited with {codes} (world {world}, tp {tp}{what})")
    return [torch.load(os.path.join(out, f"rank{r}.pt"), weights_only=False) for r in range(world)]


def run_ranks(world: int, tp: int, out: str, cfg: dict[str, Any], timeout: float = 600.0) -> list[dict[str, Any]]:
    """Spawn ``world`` ranks (tensor parallel ``tp``, DP = the rest), wait, and return their results."""
    return spawn_ranks(_rank_main, (cfg,), world, tp, out, timeout)


# ---------------------------------------------------------------- every correction route (test_parallel_routes.py)
EXACT = {"reference": "exact"}
# Route name -> the job's correction / oldLogits sections. The exact strategies that run inside the actor
# process: snapshot (host memory and disk) and the actor's half of dedicated / interruptSync (tokens of older
# versions arrive pre-scored in batch.logp_old, its own version's come from its forward).
ROUTES: dict[str, dict[str, Any]] = {
    "behavior": {"correction": {"reference": "behavior"}},
    "current": {"correction": {"reference": "current"}},
    "linear": {"correction": {"reference": "linear"}},
    "loglinear": {"correction": {"reference": "loglinear"}},
    # a reset threshold between the batches' in-bounds ratios, so some versions reset and others do not
    "ewma": {"correction": {"reference": "ewma", "ewma": {"reset": {"rule": "paper", "keepRatioBelow": 0.8, "consecutiveSteps": 1}}}},
    "snapshot": {"correction": EXACT, "oldLogits": {"strategy": "snapshot"}},
    "snapshot-disk": {"correction": EXACT, "oldLogits": {"strategy": "snapshot", "snapshot": {"device": "disk"}}},
    "dedicated": {"correction": EXACT, "oldLogits": {"strategy": "dedicated"}},
    "interruptSync": {"correction": EXACT, "oldLogits": {"strategy": "interruptSync"}},
    "audit": {"correction": {"reference": "behavior", "audit": {"everyNSteps": 1, "fraction": 0.75}}},
}


def route_job(route: str) -> dict[str, Any]:
    """The job of ``route`` (a key of :data:`ROUTES`); ``<route>+bf16``: the same with a bf16 actor
    (``actor.megatron.precision``)."""
    name, _, precision = route.partition("+")
    out = job()
    for section, values in ROUTES[name].items():
        out[section] = {**out.get(section, {}), **values}
    if precision:
        out["actor"] = {"megatron": {"precision": precision}}
    return out


def _route_batch(batch: Any, step: int) -> Any:
    """The batch of ``step`` (the actor at version ``step``): tokens of versions ``step - 2 .. step`` mixed
    within rows (partial trajectories), and for the pre-scored strategies ``logp_old`` of every older token."""
    B_, T_ = batch.shape
    pos = torch.arange(T_)[None, :].expand(B_, T_)
    back = (torch.arange(B_)[:, None] + pos // 6) % 3
    versions = torch.where(batch.loss_mask, (step - back).clamp(min=0), torch.full((B_, T_), -1))
    g = torch.Generator().manual_seed(100 + step)
    old = batch.logp_mu + 0.1 * torch.randn(B_, T_, generator=g)
    logp_old = torch.where(batch.loss_mask & (versions < step), old, torch.full((B_, T_), float("nan")))
    return replace(batch, versions=versions, logp_old=logp_old)


def _smaps_pss(folder: str) -> int:
    """Bytes of this process's mappings of files under ``folder`` (proportional set size: a page mapped by
    n processes counts 1/n in each, so the sum over processes is what the node holds)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
                inside = len(parts) >= 6 and parts[5].startswith(folder)
            elif inside and parts[0] == "Pss:":
                total += int(parts[1]) * 1024
    return total


def _run_route(route: str, rank: int, world: int, tp: int, init_method: str | None, work_dir: str) -> dict[str, Any]:
    import torch.distributed as dist

    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.megatron.parallel import Layout

    spec = AsyncRLJobSpec.model_validate(route_job(route))
    folder = os.path.join(work_dir, route)  # one folder for every rank: the node-shared one
    settings = replace(ActorSettings.from_spec(spec, VOCAB, work_dir=folder), device="cpu",
                       layout=Layout(tp=tp, rank=rank, world=world, init_method=init_method))
    actor = MegatronActor(settings)
    base = _batch(actor)
    g = torch.Generator().manual_seed(12)  # behaviour noise: some tokens leave mask.bounds [0.5, 2]
    base = replace(base, logp_mu=(base.logp_mu + 0.4 * torch.randn(B, T, generator=g)) * base.loss_mask)
    import asyncrl.trainer.actor.megatron_actor as actor_module

    held: list[Any] = []  # each step's HeldReference: what the loss saw (seen, [B, T]) and which rows this rank scored
    real_hold = actor_module.hold_reference

    def holding(*args: Any, **kwargs: Any) -> Any:
        held.append(real_hold(*args, **kwargs))
        return held[-1]

    forwarded: list[tuple[int, int]] = []  # (rows, trained tokens) of every provider forward call this step
    provider_score = actor.old_logits.score

    def counted(batch: Any, scorer: Any) -> Any:
        forwarded.append((int(batch.tokens.shape[0]), int(batch.loss_mask.sum())))
        return provider_score(batch, scorer)

    actor.old_logits.score = counted  # type: ignore[method-assign]  # instrumentation: the rows a rank forwards
    actor_module.hold_reference = holding  # type: ignore[assignment]  # instrumentation: what the loss saw
    steps = []
    for step in range(3):
        batch = _route_batch(base, step)
        forwarded.clear()
        m = actor.train_step(batch)
        store = getattr(actor.old_logits, "store", None) or getattr(actor.auditor, "store", None)
        resident = store.resident() if store is not None else None
        steps.append({
            "loss": m.loss, "grad_norm": m.grad_norm, "stepped": _applied(m), "version": m.version,
            "ewma_reset": m.ewma_reset, "ewma_resets_total": m.ewma_resets_total,
            "in_bounds_ratio": m.in_bounds_ratio, "correction": _record(m.correction), "audit": _record(m.audit),
            "resident": None if resident is None else vars(resident).copy(),
            "pss": _smaps_pss(str(where)) if (where := getattr(store, "folder", None)) is not None else 0,
            "files": {} if where is None else {p.name: p.stat().st_size for p in sorted(where.glob("*.safetensors"))},
            "sharers": getattr(store, "sharers", 1),
            "logp": actor.logprobs(batch.tokens), "logp_ref": held[-1].seen.clone(), "mask": batch.loss_mask,
            "reference_rows": held[-1].rows.tolist(), "forwarded": list(forwarded),
        })
        if dist.is_initialized():
            dist.barrier()  # every rank measured the step before any moves on (and the writer closes the store)
    actor_module.hold_reference = real_hold  # type: ignore[assignment]  # the next route wraps it afresh
    weights = actor.hf_state_dict()
    store = getattr(actor.old_logits, "store", None) or getattr(actor.auditor, "store", None)
    where = getattr(store, "folder", None)
    actor.close()
    if dist.is_initialized():
        dist.barrier()  # every rank closed its store
    left = None if where is None or not where.exists() else sorted(os.listdir(where))
    return {"steps": steps, "weights": weights, "folder": None if where is None else str(where), "left": left}


def _routes_main(rank: int, world: int, tp: int, init_method: str | None, out: str, routes: list[str],
                 work_dir: str) -> None:
    torch.set_num_threads(1)
    from asyncrl.trainer.megatron import parallel

    result: dict[str, Any] = {"rank": rank, "routes": {}}
    for route in routes:  # one process group, one actor after the other (init_megatron re-seeds: same init)
        result["routes"][route] = _run_route(route, rank, world, tp, init_method, work_dir)
    result["dp"] = parallel.dp_rank_size()
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_routes(world: int, tp: int, out: str, routes: list[str], work_dir: str,
               timeout: float = 900.0) -> list[dict[str, Any]]:
    """Spawn ``world`` ranks that train every one of ``routes`` for three steps in turn; their results."""
    return spawn_ranks(_routes_main, (routes, work_dir), world, tp, out, timeout, f", routes {routes}")
