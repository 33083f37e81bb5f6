"""The actor's checkpoint: what :class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor` writes and
reads back (model, optimizer, version, the old-logit provider's state and the counters).

The folder format (atomic rename, ``meta.json`` with every file's checksum, written last) is
:mod:`asyncrl.trainer.megatron.checkpoint`; this module decides what goes into it.
"""

import dataclasses
from typing import TYPE_CHECKING, Any

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.megatron.checkpoint import read_checkpoint, write_checkpoint
from asyncrl.trainer.oldlogits import provider_key

if TYPE_CHECKING:
    from asyncrl.trainer.actor.megatron_actor import MegatronActor

COUNTERS = ("nonfinite_loss_total", "nonfinite_grad_total", "ewma_resets_total")


def save_rank(actor: "MegatronActor", directory: str, *, rank: int) -> None:
    """One rank's share of a group checkpoint (every rank calls this): rank 0 writes the whole state;
    under data parallelism alone every rank holds the same one."""
    tp = actor.settings.layout.tp
    if tp > 1:
        raise NotImplementedError(
            f"checkpoints of a tensor-parallel actor (tensorParallel {tp}) need sharded checkpoints, not in "
            "this build: run with tensorParallel 1 or checkpoint.everyNSteps 0"
        )
    if rank == 0:
        save_actor(actor, directory)


def load_rank(actor: "MegatronActor", directory: str, *, rank: int) -> int:
    """One rank's share of a group resume (every rank calls this); returns the restored version."""
    load_actor(actor, directory)
    return int(actor.version)


def save_actor(actor: "MegatronActor", directory: str) -> None:
    """Model, optimizer, version, old-logit provider state (EWMA weights, snapshots) and counters;
    atomic (temporary folder, then rename)."""
    state = {
        "model": {k: v for k, v in actor._gpt.state_dict().items() if not k.endswith("_extra_state")},
        "optimizer": actor._optimizer.state_dict(),
        "old_logits": {
            "provider": provider_key(actor.reference, actor.settings.old_logits),
            "state": actor.old_logits.state_dict(),
            "audit": actor.auditor.state_dict() if actor.auditor is not None else None,
        },
        "version": actor.version,
        "counters": {name: getattr(actor, name) for name in COUNTERS},
    }
    meta = {
        "version": actor.version,
        "reference": actor.reference.value,
        "arch": dataclasses.asdict(actor.settings.arch),
    }
    write_checkpoint(directory, state, meta)


def load_actor(actor: "MegatronActor", directory: str, *, old_logits: bool = True) -> None:
    """Restore everything :func:`save_actor` wrote (the architecture must match).

    ``old_logits=False`` (a warm start) leaves the old-logit provider fresh: it starts from the
    weights RL starts with, whatever reference wrote the checkpoint.
    """
    state, meta = read_checkpoint(directory)
    arch = dataclasses.asdict(actor.settings.arch)
    if meta["arch"] != arch:
        raise ValueError(f"checkpoint {directory} has architecture {meta['arch']}, this actor has {arch}")
    device = actor.runtime.device
    actor._gpt.load_state_dict({k: v.to(device) for k, v in state["model"].items()}, strict=True)
    actor._optimizer.load_state_dict(state["optimizer"])
    actor.version = int(state["version"])
    actor.close()  # the old stores' versions (and files) are replaced
    actor.old_logits = actor._new_provider()
    actor.auditor = actor._new_auditor()
    if old_logits:
        _load_provider_state(actor, directory, state)
    for name, value in state["counters"].items():
        setattr(actor, name, int(value))


def _load_provider_state(actor: "MegatronActor", directory: str, state: dict[str, Any]) -> None:
    key = provider_key(actor.reference, actor.settings.old_logits)
    saved = state.get("old_logits")
    if saved is None:  # written before the old-logit providers: only an EWMA state was kept
        if state.get("ewma") is not None and actor.reference is ReferencePolicy.EWMA:
            actor.old_logits.load_state_dict({"ewma": state["ewma"]})
        return
    if saved["provider"] != key:
        raise ValueError(
            f"checkpoint {directory} holds the state of old-logit provider {saved['provider']!r}, this "
            f"actor runs {key!r}; resume with the job's own correction.reference and oldLogits.strategy"
        )
    actor.old_logits.load_state_dict(saved["state"])
    if actor.auditor is not None and saved.get("audit") is not None:
        actor.auditor.load_state_dict(saved["audit"])
