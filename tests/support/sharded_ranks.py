"""Save and resume the real actor's sharded checkpoints across layouts (spawned gloo ranks).

Used by ``tests/trainer/test_sharded_*.py``: every rank builds :class:`MegatronActor` at its place in the
layout (the same initial weights at every layout: megatron's CPU init is TP-invariant), makes the fixed
global batch of :mod:`tests.support.parallel_ranks` from them, then optionally resumes a checkpoint, trains,
optionally saves one, trains on, and writes what it saw to ``out/rank<r>.pt``.
"""

import os
from dataclasses import replace
from typing import Any

import torch

from tests.support.parallel_ranks import VOCAB, _batch, spawn_ranks


def _rank_main(rank: int, world: int, tp: int, init_method: str | None, out: str, cfg: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.checkpoint_io import load_rank, save_rank
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.megatron.parallel import Layout

    spec = AsyncRLJobSpec.model_validate(cfg["job"])
    settings = replace(ActorSettings.from_spec(spec, VOCAB), device="cpu",
                       layout=Layout(tp=tp, rank=rank, world=world, init_method=init_method))
    actor = MegatronActor(settings)
    batch = _batch(actor)  # from the initial weights: the same batch at every layout and after a resume
    result: dict[str, Any] = {"rank": rank, "dp": (actor.dp_rank, actor.dp_size)}
    if cfg.get("load"):
        result["loaded_version"] = load_rank(actor, cfg["load"], rank=rank)
    steps = []

    def train(n: int) -> None:
        for _ in range(n):
            m = actor.train_step(batch)
            steps.append({"loss": m.loss, "grad_norm": m.grad_norm, "version": m.version,
                          "ewma_resets": m.ewma_resets_total, "logp": actor.logprobs(batch.tokens)})

    train(cfg.get("before", 0))
    if cfg.get("save"):
        save_rank(actor, cfg["save"], rank=rank)
    if cfg.get("save_single_file"):  # one process: the former actor.pt format, as it was written
        single_file(actor, cfg["save_single_file"])
    train(cfg.get("after", 0))
    result["steps"] = steps
    result["weights"] = actor.hf_state_dict()  # gathered whole (a collective under TP)
    result["mask"] = batch.loss_mask
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def single_file(actor: Any, directory: str) -> None:
    """A checkpoint as the actor wrote it before sharded folders (one ``actor.pt``, index-keyed optimizer)."""
    import dataclasses

    from asyncrl.trainer.actor.checkpoint_io import COUNTERS
    from asyncrl.trainer.oldlogits import provider_key
    from tests.support.megatron_parts import write_checkpoint

    state = {
        "model": {k: v for k, v in actor._gpt.state_dict().items() if not k.endswith("_extra_state")},
        "optimizer": actor._optimizer.state_dict(),
        "old_logits": {"provider": provider_key(actor.reference, actor.settings.old_logits),
                       "state": actor.old_logits.state_dict(),
                       "audit": actor.auditor.state_dict() if actor.auditor is not None else None},
        "version": actor.version,
        "counters": {name: getattr(actor, name) for name in COUNTERS},
    }
    meta = {"version": actor.version, "reference": actor.reference.value,
            "arch": dataclasses.asdict(actor.settings.arch)}
    write_checkpoint(directory, state, meta)


def run_layout(world: int, tp: int, out: str, cfg: dict[str, Any], timeout: float = 600.0) -> list[dict[str, Any]]:
    """Spawn ``world`` ranks (tensor parallel ``tp``, DP = the rest) running ``cfg``; their results.

    ``cfg``: ``job`` (the spec), ``load`` (a checkpoint folder to resume first), ``before`` (steps),
    ``save`` (a checkpoint folder to write), ``after`` (steps)."""
    os.makedirs(out, exist_ok=True)
    return spawn_ranks(_rank_main, (cfg,), world, tp, out, timeout)


def step_diffs(ref: dict[str, Any], got: dict[str, Any], ref_steps: slice = slice(None)) -> dict[str, float]:
    """Max |diff| of the steps ``got`` ran against ``ref``'s steps ``ref_steps`` (log-probs over the mask,
    loss, grad norm) and of the final weights."""
    mask = ref["mask"]
    pairs = list(zip(ref["steps"][ref_steps], got["steps"], strict=True))
    return {
        "logp": max(float((a["logp"] - b["logp"])[mask].abs().max()) for a, b in pairs),
        "loss": max(abs(a["loss"] - b["loss"]) for a, b in pairs),
        "grad_norm": max(abs(a["grad_norm"] - b["grad_norm"]) for a, b in pairs),
        "weights": max(float((ref["weights"][k] - got["weights"][k]).abs().max()) for k in ref["weights"]),
    }
