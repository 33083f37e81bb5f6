"""The actor's checkpoint: what :class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor` writes and
reads back (model, optimizer, version, the old-logit provider's and the audit's state, the counters).

One format for every layout, one process included: a sharded folder written by all ranks and sealed by
rank 0 (:mod:`asyncrl.trainer.checkpoint.sharded`), so a checkpoint resumes at another TP/DP
layout. Tensors that belong to a parameter (Adam's moments, the EWMA ``theta_prox``, every resident
snapshot version, the audit's snapshots) are sharded like it; the rest is saved once. Resident snapshot
versions are kept (resharded on load), so a resumed run scores every token under its own version as
before. megatron's own optimizer (the GPU default: bf16 + ``DistributedOptimizer``) saves its
``sharded_state_dict`` beside the model (``fully_reshardable``: it too resumes at another TP/DP layout); a
folder of one optimizer kind does not load into the other (the error names both). Folders of the former
single-file format (``actor.pt``) still load, at any layout: their full
tensors are cut to this rank's shards.

What a checkpoint reads and restores of the actor is :class:`CheckpointedActor` (the
:class:`~asyncrl.trainer.actor.megatron_actor.MegatronActor` is one): the actor imports this module, never the
other way round.
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.actor.settings import ActorSettings
from asyncrl.trainer.checkpoint import sharded as sharded_checkpoint
from asyncrl.trainer.checkpoint.folder import read_checkpoint
from asyncrl.trainer.megatron.compat import ActorOptimizer, MegatronRuntime, init_megatron
from asyncrl.trainer.megatron.lora import LoraLayers
from asyncrl.trainer.megatron.lora_checkpoint import AdapterCheckpointView, base_fingerprint, check_same_base
from asyncrl.trainer.oldlogits import provider_key
from asyncrl.trainer.oldlogits.audit import Auditor
from asyncrl.trainer.oldlogits.protocol import OldLogitProvider

if TYPE_CHECKING:
    from asyncrl.trainer.megatron.optimizers import MegatronAdam

COUNTERS = ("nonfinite_loss_total", "nonfinite_grad_total", "ewma_resets_total")


class CheckpointedActor(Protocol):
    """What a checkpoint holds of the actor and restores into it: the model and optimizer, the version,
    the old-logit provider's and the audit's state, and the counters of :data:`COUNTERS`."""

    version: int
    nonfinite_loss_total: int
    nonfinite_grad_total: int
    ewma_resets_total: int

    @property
    def settings(self) -> ActorSettings: ...

    @property
    def runtime(self) -> MegatronRuntime: ...

    @property
    def reference(self) -> ReferencePolicy: ...

    @property
    def old_logits(self) -> OldLogitProvider: ...

    @property
    def auditor(self) -> Auditor | None: ...

    @property
    def gpt(self) -> Any:
        """megatron-core's ``GPTModel`` (untyped), not its DDP wrapper: its state dicts are saved."""
        ...

    @property
    def optimizer(self) -> ActorOptimizer: ...

    @property
    def lora(self) -> LoraLayers | None:
        """The adapters (``spec.model.lora``): then a checkpoint holds them, not the frozen base."""
        ...

    def named_weights(self) -> Mapping[str, torch.Tensor]: ...

    def renew_old_logits(self) -> None:
        """A fresh old-logit provider and audit (a resume then loads their state); the old ones' weight
        versions are released."""
        ...


def save_rank(actor: CheckpointedActor, directory: str, *, rank: int, spread: bool = True) -> None:
    """One rank's share of a group checkpoint (every rank calls this, SPMD): its shards; rank 0 seals
    the folder once every rank has written (``rank`` is the caller's, checked against the group's).
    ``spread``: the DP replicas share the writing of replicated tensors (False: DP rank 0 writes them)."""
    if rank != sharded_checkpoint.group_rank():
        raise RuntimeError(f"save_rank(rank={rank}) on process-group rank {sharded_checkpoint.group_rank()}")
    lay = actor.settings.layout
    meta = {
        "version": actor.version,
        "reference": actor.reference.value,
        "arch": dataclasses.asdict(actor.settings.arch),
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.data_parallel, "world": lay.world},
    }
    if actor.lora is not None:  # the adapters only, and which base they belong to
        meta["lora_base"] = _base_fingerprint(actor)
    model_sd = _model(actor).sharded_state_dict(prefix="")
    megatron = _megatron_optimizer(actor)
    optimizer = megatron.sharded_state_dict(model_sd) if megatron is not None else None
    sharded_checkpoint.save(directory, model_sd, _extra(actor), actor.named_weights(), meta, optimizer=optimizer,
                            spread=spread)


def load_rank(actor: CheckpointedActor, directory: str, *, rank: int, old_logits: bool = True) -> int:
    """One rank's share of a group resume (every rank calls this); returns the restored version.

    ``old_logits=False`` (a warm start) leaves the old-logit provider fresh: it starts from the weights RL
    starts with, whatever reference wrote the checkpoint."""
    meta = sharded_checkpoint.verified(directory)  # every rank agrees, or every rank raises
    arch = dataclasses.asdict(actor.settings.arch)
    if meta.get("arch") != arch:
        raise ValueError(f"checkpoint {directory} has architecture {meta.get('arch')}, this actor has {arch}")
    if actor.lora is not None:
        check_same_base(directory, meta.get("lora_base"), _base_fingerprint(actor))
    elif meta.get("lora_base") is not None:
        raise ValueError(f"checkpoint {directory} holds LoRA adapters, not full weights; set the spec.model.lora "
                         "it was trained with to resume it (or export it --merged and start from that folder)")
    if sharded_checkpoint.is_sharded(meta):
        megatron = _megatron_optimizer(actor)
        template = (lambda model_sd: megatron.sharded_state_dict(model_sd, is_loading=True)) if megatron else None
        extra, megatron_state = sharded_checkpoint.load(directory, _model(actor), actor.named_weights(),
                                                        optimizer=template)
        if megatron is not None and megatron_state is not None:
            megatron.load_sharded(megatron_state)
    else:
        extra = _single_file(actor, directory)
    _restore(actor, directory, extra, old_logits=old_logits)
    # The optimizer's state carries the rate it was saved with (a warm start's: the job that made the cache);
    # RL's rate is constant, so the job's own train.learningRate holds after any load.
    actor.optimizer.set_learning_rate(actor.settings.optimizer.lr)
    return int(actor.version)


def save_actor(actor: CheckpointedActor, directory: str) -> None:
    """:func:`save_rank` of a one-process actor (the same format)."""
    save_rank(actor, directory, rank=0)


def load_actor(actor: CheckpointedActor, directory: str, *, old_logits: bool = True) -> None:
    """:func:`load_rank` of a one-process actor."""
    load_rank(actor, directory, rank=0, old_logits=old_logits)


# ---------------------------------------------------------------- what goes in
def _model(actor: CheckpointedActor) -> Any:
    """What is saved of the model: the ``GPTModel``, or under LoRA its adapters alone."""
    return AdapterCheckpointView(actor.gpt, actor.lora) if actor.lora is not None else actor.gpt


def _base_fingerprint(actor: CheckpointedActor) -> str:
    s = actor.settings
    return base_fingerprint(s.init_weights, s.arch, s.seed)


def _extra(actor: CheckpointedActor) -> dict[str, Any]:
    return {
        "optimizer": _optimizer_state(actor),
        "old_logits": {
            "provider": provider_key(actor.reference, actor.settings.old_logits),
            "state": actor.old_logits.state_dict(),
            "audit": actor.auditor.state_dict() if actor.auditor is not None else None,
        },
        "version": actor.version,
        "counters": {name: getattr(actor, name) for name in COUNTERS},
    }


def _megatron_optimizer(actor: CheckpointedActor) -> "MegatronAdam | None":
    """megatron's own optimizer (the GPU default; on the CPU when the job asks), else None (the torch AdamW)."""
    from asyncrl.trainer.megatron.optimizers import MegatronAdam

    return actor.optimizer if isinstance(actor.optimizer, MegatronAdam) else None


def _torch_optimizer(actor: CheckpointedActor) -> torch.optim.Optimizer | None:
    inner = getattr(actor.optimizer, "_opt", None)  # optimizers.MainGradAdamW: a torch AdamW (the CPU shim)
    return inner if isinstance(inner, torch.optim.Optimizer) else None


def _param_names(opt: torch.optim.Optimizer, actor: CheckpointedActor) -> list[str]:
    """The parameter name of every optimizer index (torch numbers parameters in group order)."""
    name_of = {id(p): n for n, p in actor.named_weights().items()}
    return [name_of[id(p)] for g in opt.param_groups for p in g["params"]]


def _optimizer_state(actor: CheckpointedActor) -> dict[str, Any]:
    """The optimizer's state keyed by parameter *name* (torch keys it by index), so its moments are owned
    by their parameters (sharded like them) and the folder does not depend on the layout."""
    opt = _torch_optimizer(actor)
    if opt is None:  # megatron's own optimizer: its sharded_state_dict is saved beside (save_rank)
        return {"megatron_sharded": True}
    names = _param_names(opt, actor)
    osd = opt.state_dict()
    return {
        "state": {names[i]: state for i, state in osd["state"].items()},
        "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]],
    }


def _load_optimizer(actor: CheckpointedActor, saved: dict[str, Any]) -> None:
    if "megatron_sharded" in saved:  # loaded with the model (load_rank)
        return
    if "megatron" in saved:  # a single-file folder of one process
        actor.optimizer.load_state_dict(saved["megatron"])
        return
    opt = _torch_optimizer(actor)
    if opt is None:
        raise ValueError("the checkpoint holds a torch optimizer's state; this actor runs megatron's optimizer")
    index = {n: i for i, n in enumerate(_param_names(opt, actor))}
    opt.load_state_dict({
        "state": {index[n]: state for n, state in saved["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in saved["param_groups"]],
    })


# ---------------------------------------------------------------- what comes out
def _restore(actor: CheckpointedActor, directory: str, extra: dict[str, Any], *, old_logits: bool) -> None:
    _load_optimizer(actor, extra["optimizer"])
    actor.version = int(extra["version"])
    actor.renew_old_logits()  # the old stores' versions (and files) are replaced
    if old_logits:
        _load_provider_state(actor, directory, extra)
    for name, value in extra["counters"].items():
        setattr(actor, name, int(value))


def _load_provider_state(actor: CheckpointedActor, directory: str, state: dict[str, Any]) -> None:
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


# ---------------------------------------------------------------- the single-file format (actor.pt)
def _single_file(actor: CheckpointedActor, directory: str) -> dict[str, Any]:
    """Load a former ``actor.pt`` folder: the model now, the rest as :func:`_restore` reads it. Its tensors
    are whole (written by one process): at TP > 1 each is cut to this rank's shard (``parallel.shard_of``)."""
    from asyncrl.trainer.megatron.parallel import shard_of

    state, _ = read_checkpoint(directory)
    params = actor.named_weights()

    def shard(name: str, full: torch.Tensor) -> torch.Tensor:
        return shard_of(params[name], full)

    device = actor.runtime.device
    model = {k: (shard(k, v) if k in params else v).to(device) for k, v in state["model"].items()}
    actor.gpt.load_state_dict(model, strict=True)
    opt = _torch_optimizer(actor)
    if opt is not None:  # index-keyed (torch's own state_dict): name it, then cut the moments
        names = _param_names(opt, actor)
        osd = state["optimizer"]
        optimizer: dict[str, Any] = {
            "state": {names[int(i)]: s for i, s in osd["state"].items()},
            "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in osd["param_groups"]],
        }
    else:
        optimizer = {"megatron": state["optimizer"]}
    rest = {k: v for k, v in state.items() if k not in ("model", "optimizer")}
    return _map_owned({"optimizer": optimizer, **rest}, params, shard)


def _map_owned(tree: Any, params: Mapping[str, torch.Tensor], fn: Callable[[str, torch.Tensor], torch.Tensor],
               owner: str | None = None) -> Any:
    """``tree`` with ``fn(parameter, tensor)`` applied to each tensor owned by a parameter (a key on its
    path names the parameter, and the tensor has its full shape), the rule of
    :func:`asyncrl.trainer.checkpoint.sharded.shard_tree`."""
    if isinstance(tree, dict):
        return {k: _map_owned(v, params, fn, k if isinstance(k, str) and k in params else owner)
                for k, v in tree.items()}
    if isinstance(tree, torch.Tensor) and owner is not None and tree.dim() == params[owner].dim() and tree.dim() > 0:
        return fn(owner, tree)
    return tree


def model_state(directory: str, arch: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The whole megatron-named model tensors (CPU, no ``_extra_state``) and the marker of a checkpoint
    folder of either format, read in this one process (``asyncrl export``): a sharded folder is resharded
    to one rank (megatron is set up here at world 1 if it is not yet)."""
    from asyncrl.trainer.checkpoint.folder import CheckpointError
    from asyncrl.trainer.megatron.model import build_gpt_model

    meta = sharded_checkpoint.verified(directory)
    want = dataclasses.asdict(arch)
    if meta.get("arch") != want:  # before building a model the folder's tensors cannot fit
        raise CheckpointError(directory, f"its architecture {meta.get('arch')} is not the job's {want}; pass "
                                         "the job it was trained with")
    if not sharded_checkpoint.is_sharded(meta):
        state, meta = read_checkpoint(directory)
        return {k: v for k, v in state["model"].items() if not k.endswith("_extra_state")}, meta
    runtime = init_megatron(0, device="cpu")
    gpt = build_gpt_model(arch, use_cpu_initialization=runtime.use_cpu_initialization, random_init=False)
    sharded_checkpoint.load_model(directory, gpt)
    return {k: v.detach().cpu() for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}, meta
