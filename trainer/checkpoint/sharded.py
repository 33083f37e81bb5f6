"""Sharded, layout-independent checkpoint folders with megatron-core's ``dist_checkpointing``.

Every rank of the actor group writes its own shards into one temporary folder (``torch_dist``: a
``__<rank>_<n>.distcp`` per writer, ``common.pt`` and ``metadata.json`` from rank 0); after a barrier
on the actor's process group rank 0 seals it (:func:`asyncrl.trainer.checkpoint.folder.seal_folder`:
checksums of every file, ``meta.json`` last, atomic rename). A folder is complete only when it verifies;
the driver's fallback and ``.corrupt`` logic (:mod:`asyncrl.trainer.driver.run.checkpoints`) is unchanged.

**Why it reshards.** Every tensor is saved as a ``ShardedTensor``: the local shard *and* its place in the
global tensor (megatron's ``GPTModel.sharded_state_dict()``). Loading asks for the shards of the
*current* layout and ``dist_checkpointing`` reads the pieces that cover them, so a folder written at
TP=2 loads at TP=1, at DP=2 or at TP=2 again, exactly (``tests/trainer/test_sharded_resume.py``).

**Beyond the model** (the ``extra`` tree: optimizer state, the old-logit provider's and the audit's
state, counters): a tensor is *owned* by a parameter when a key on its path names a trainable parameter
and it has that parameter's local shape (Adam's ``exp_avg``/``exp_avg_sq``, the EWMA ``theta_prox``,
each resident snapshot version). An owned tensor is saved with its parameter's sharding under the key
``<path without the parameter>.<the parameter's checkpoint key>``; everything else (numbers, strings,
Adam's scalar ``step``) goes into rank 0's ``common.pt`` and must be the same on every rank (it is:
SPMD, reduced statistics). The owned tensors' places are recorded (the *manifest*, in ``common.pt``),
so a loader can ask for them before it knows what the folder holds; each keeps its own dtype (an fp32
``theta_prox`` of a bf16 parameter stays fp32).

**megatron's optimizer** (:class:`~asyncrl.trainer.megatron.optimizers.MegatronAdam`, the GPU default): its own
``sharded_state_dict`` goes in under ``optimizer`` (the ``DistributedOptimizer`` in megatron's
``fully_reshardable`` format: it resumes at another TP and DP size); ``common.pt`` says so (:data:`OPTIMIZER_KEY`).

**The writes are spread** over the data-parallel ranks (megatron's ``FullyParallelSaveStrategyWrapper`` over
the DP group): a tensor replicated across DP (every model shard, Adam's moments of a torch optimizer) is
written once, by one of its replicas, chosen to balance the bytes per rank, instead of always by DP rank 0.
Loading is spread the same way (``FullyParallelLoadStrategyWrapper``: each replica reads a share and they
exchange). ``spread=False`` is the former rank-0 writer (``bench/scale.py`` measures both).

Two shims make ``dist_checkpointing`` run here (:func:`checkpoint_shims`, beside the actor's others in
:mod:`asyncrl.trainer.megatron.compat`), and a third makes it read a folder as data, never as code
(:mod:`asyncrl.trainer.checkpoint.safe_load`: DCP's ``.metadata`` through an unpickler that admits only its own
classes, byte items and ``common.pt`` weights-only); :func:`verified` checks every such file of a folder with
the same unpicklers before megatron opens it, on every rank.
"""

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asyncrl.trainer.checkpoint import safe_load
from asyncrl.trainer.checkpoint.folder import (
    CheckpointError,
    disk_error,
    seal_folder,
    temporary_folder,
    verify_checkpoint,
)
from asyncrl.trainer.megatron import compat

log = logging.getLogger(__name__)

FORMAT = "sharded"  # meta.json "format" of a folder written here (the single-file one has none)
MANIFEST_KEY = "manifest"  # in common.pt: [[path..., parameter name, dtype], ...] of every owned tensor of ``extra``
OPTIMIZER_KEY = "megatron_optimizer"  # in common.pt: True when the folder holds megatron's optimizer state
Path_ = tuple[Any, ...]  # keys from the root of ``extra`` to a leaf (str or int)


def checkpoint_shims() -> None:
    """What megatron's ``dist_checkpointing`` needs here.

    - Without CUDA: its writer calls ``torch.cuda.synchronize()`` unconditionally
      (``filesystem_async.py:230``, "Found no NVIDIA driver"); with no CUDA stream there is nothing to wait for.
    - Everywhere: the writer's results queue is a ``spawn``-context ``Manager().Queue()`` made for its
      *asynchronous* mode (a writer process outliving the call). The actor saves synchronously: the forked
      writers report to the calling process, which puts the result on the queue and reads it back within
      the same call, so a plain ``queue.Queue`` carries it. The manager costs a fresh interpreter per
      process (5-8 s on the first save, measured) and crashes under a main module without a main guard.
    - Everywhere: DCP's readers unpickle only data (:func:`asyncrl.trainer.checkpoint.safe_load.install`).
    """
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not torch.cuda.is_available():
        torch.cuda.synchronize = _no_cuda_sync  # type: ignore[assignment]
    if getattr(filesystem_async, "_results_queue", None) is None:
        filesystem_async._results_queue = queue.Queue()  # type: ignore[attr-defined]
    safe_load.install()


def _no_cuda_sync(*_: Any, **__: Any) -> None:
    return None


def group_rank() -> int:
    """This process's rank in the actor group (0 without a process group)."""
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _owner(path: Path_, params: Mapping[str, torch.Tensor]) -> str | None:
    """The parameter a leaf at ``path`` belongs to: the nearest key on the path that names one."""
    for key in reversed(path):
        if isinstance(key, str) and key in params:
            return key
    return None


def _shard_key(path: Path_, owner: str, base: Any) -> str:
    return ".".join([str(k) for k in path if k != owner] + [base.key])


def shard_tree(tree: Any, params: Mapping[str, torch.Tensor], model_sd: Mapping[str, Any],
               path: Path_ = ()) -> tuple[Any, list[list[Any]]]:
    """``tree`` with every owned tensor replaced by a ``ShardedTensor`` (or factory) of its parameter's
    sharding, and the manifest ``[[*path, parameter], ...]`` of those leaves."""
    if isinstance(tree, dict):
        out, manifest = {}, []
        for k, v in tree.items():
            out[k], sub = shard_tree(v, params, model_sd, (*path, k))
            manifest += sub
        return out, manifest
    owner = _owner(path, params)
    if isinstance(tree, torch.Tensor) and owner is not None and tree.shape == params[owner].shape:
        base = model_sd[owner]
        # its own dtype: an fp32 EWMA theta_prox or snapshot of a bf16 parameter stays fp32
        return _with_data(base, _shard_key(path, owner, base), tree.detach()), [[*path, owner, _dtype_name(tree.dtype)]]
    return tree, []


def _with_data(base: Any, key: str, data: torch.Tensor) -> Any:
    """``base`` (a parameter's ``ShardedTensor`` or ``ShardedTensorFactory``) under ``key`` holding ``data``; a
    ShardedTensor records its dtype (a factory's pieces take theirs from ``data``)."""
    if hasattr(base, "dtype"):
        return dataclasses.replace(base, key=key, data=data, dtype=data.dtype)
    return dataclasses.replace(base, key=key, data=data)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def template(manifest: list[list[Any]], params: Mapping[str, torch.Tensor], model_sd: Mapping[str, Any],
             folder: str = "(sharded state)") -> dict:
    """The sharded state dict that loads the owned tensors of ``manifest`` at this rank's layout (fresh
    buffers shaped like this rank's parameter shards, in the dtype each was saved in).

    An entry is ``[*path, parameter, dtype]`` (``[*path, parameter]`` in folders written before the dtype was
    recorded: the parameter's dtype, which was then always the saved one, fp32)."""
    out: dict[Any, Any] = {}
    for entry in manifest:
        dtype: torch.dtype | None = None
        if len(entry) >= 3 and isinstance(entry[-1], str) and entry[-2] in params and entry[-1] not in params:
            *path, owner, name = entry
            dtype = getattr(torch, name)
        else:
            *path, owner = entry
        if owner not in params:
            raise CheckpointError(folder, f"it holds state of parameter {owner!r}, which this model lacks")
        base = model_sd[owner]
        node = out
        for k in path[:-1]:
            node = node.setdefault(k, {})
        data = torch.empty_like(params[owner], dtype=dtype)
        node[path[-1]] = _with_data(base, _shard_key(tuple(path), owner, base), data)
    return out


def _dp_group() -> Any:
    """The data-parallel group the writes are spread over (None in one process: nothing to spread)."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return None
    from megatron.core import parallel_state

    group = parallel_state.get_data_parallel_group()
    return group if dist.get_world_size(group) > 1 else None


def _save_strategy(spread: bool) -> Any:
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistSaveShardedStrategy

    # One writer thread per rank (a forked process each in megatron's writer): the ranks share the cores.
    base = TorchDistSaveShardedStrategy("torch_dist", 1, thread_count=1)
    group = _dp_group() if spread else None
    return base if group is None else FullyParallelSaveStrategyWrapper(base, group)


def _load_strategy(spread: bool) -> Any:
    """Always named (megatron otherwise picks the loader that the folder's ``metadata.json`` asks for)."""
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper
    from megatron.core.dist_checkpointing.strategies.torch import TorchDistLoadShardedStrategy

    group = _dp_group() if spread else None
    base = TorchDistLoadShardedStrategy()
    return base if group is None else FullyParallelLoadStrategyWrapper(base, group)


def save(directory: str | os.PathLike[str], model_sd: Mapping[str, Any], extra: dict[str, Any],
         params: Mapping[str, torch.Tensor], meta: dict[str, Any], *,
         optimizer: Mapping[str, Any] | None = None, spread: bool = True) -> Path:
    """Every rank calls this (SPMD): write ``model_sd`` (``GPTModel.sharded_state_dict()``), ``extra`` and
    ``optimizer`` (megatron's optimizer ``sharded_state_dict`` over the same ``model_sd``, or None) into one
    temporary folder, then rank 0 seals it as ``directory`` once every rank has finished.

    ``spread``: the DP ranks share the writing of replicated tensors (False: DP rank 0 writes them all).
    Returns the final folder (on every rank: it exists once this returns). ``meta`` is the marker's content
    (``files`` and ``format`` are added)."""
    from megatron.core import dist_checkpointing

    checkpoint_shims()
    final = Path(directory)
    pid = [os.getpid()]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(pid, src=0)  # one temporary folder for the group: rank 0's name
    tmp = temporary_folder(final, pid[0])
    rank = group_rank()
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    _barrier()  # the folder exists before any rank writes into it
    sharded_extra, manifest = shard_tree(extra, params, model_sd)
    state = {"model": dict(model_sd), "extra": sharded_extra, MANIFEST_KEY: manifest,
             OPTIMIZER_KEY: optimizer is not None}
    if optimizer is not None:
        state["optimizer"] = dict(optimizer)
    strategy = _save_strategy(spread)
    seal_error: BaseException | None = None
    try:
        dist_checkpointing.save(state, str(tmp), sharded_strategy=strategy)
        _barrier()  # every rank's shards are on disk before rank 0 seals the folder
        if rank == 0:
            try:
                seal_folder(tmp, final, {**meta, "format": FORMAT})
            except BaseException as exc:
                seal_error = exc
    except BaseException as exc:
        full = full_disk_error(exc, tmp, final)  # before the partial shards are removed: they hold the space
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if full is not None:
            raise full from exc
        raise
    if seal_error is not None:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves nothing half-written behind
    flag = [seal_error is None]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(flag, src=0)  # the other ranks return only once the folder is sealed
    if seal_error is not None:
        raise seal_error
    if not flag[0]:
        raise CheckpointError(final, "rank 0 could not seal the folder (its error is in rank 0's log)")
    return final


def full_disk_error(exc: BaseException, folder: Path, name: Path) -> OSError | None:
    """The ``OSError`` a failed shard write into ``folder`` hides, naming ``name`` (the checkpoint being
    written); None when the failure was not the disk.

    megatron writes shards in a forked process and reports only its text ("Worker failure: [enforce fail at
    inline_container.cc] unexpected pos ..."): the ENOSPC is gone from the chain. An errno still in the chain
    wins; otherwise a 1 MiB probe write into ``folder`` says whether the file system is full (or over quota)."""
    err = disk_error(exc, name)
    if isinstance(err, OSError) and err is not exc:
        return err
    probe = folder / ".space-probe"
    try:
        with open(probe, "wb") as f:
            f.write(bytes(1 << 20))
            f.flush()
            os.fsync(f.fileno())
    except OSError as got:
        if got.errno in (errno.ENOSPC, errno.EDQUOT):
            return OSError(got.errno, got.strerror, str(name))
    finally:
        probe.unlink(missing_ok=True)
    return None


def is_sharded(meta: Mapping[str, Any]) -> bool:
    """Whether a verified folder's marker says it was written here (else: the single ``actor.pt``)."""
    return meta.get("format") == FORMAT


def verified(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The marker of ``directory`` once every rank agrees it verifies (rank 0 checks the checksums, every
    rank the files and sizes it sees, and every file megatron would unpickle is data:
    :func:`~asyncrl.trainer.checkpoint.safe_load.check_folder`); a :class:`CheckpointError` on every rank
    otherwise (none waits in a collective another skipped)."""
    rank = group_rank()
    meta: dict[str, Any] | None = None
    reason: str | None = None
    try:
        meta = verify_checkpoint(directory, checksums=rank == 0)
        if is_sharded(meta):
            safe_load.check_folder(directory, meta["files"])
    except CheckpointError as exc:
        reason = f"rank {rank}: {exc.reason}"
    reasons = [reason]
    if dist.is_initialized() and dist.get_world_size() > 1:
        reasons = [None] * dist.get_world_size()
        dist.all_gather_object(reasons, reason)
    bad = [r for r in reasons if r is not None]
    if bad or meta is None:
        raise CheckpointError(directory, "; ".join(r for r in bad if r is not None) or "does not verify")
    return meta


def load(directory: str | os.PathLike[str], gpt: torch.nn.Module, params: Mapping[str, torch.Tensor], *,
         optimizer: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None,
         spread: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Every rank calls this (SPMD) on a folder that :func:`verified`: load the model's shards of this
    rank's layout into ``gpt``; return the ``extra`` tree as saved, its owned tensors resharded to this
    layout, and megatron's optimizer state (None when the folder holds none).

    ``optimizer``: megatron's optimizer template for a model sharded state dict (``MegatronAdam``'s
    ``sharded_state_dict(model_sd, is_loading=True)``); None = this actor runs a torch optimizer, whose state
    is in ``extra``. A folder of the other kind raises a :class:`CheckpointError` saying which is which."""
    from megatron.core import dist_checkpointing

    checkpoint_shims()
    safe_load.take_refusals()  # what an earlier load refused is not this one's
    folder = str(directory)
    try:
        common = safe_load.load_common(folder)
        has_megatron = bool(common.get(OPTIMIZER_KEY, False))
        if has_megatron != (optimizer is not None):
            raise CheckpointError(folder, _OPTIMIZER_MISMATCH[has_megatron])
        model_sd = gpt.sharded_state_dict(prefix="")  # type: ignore[operator]
        want = {"model": model_sd, "extra": template(common[MANIFEST_KEY], params, model_sd, folder)}
        if optimizer is not None:
            want["optimizer"] = dict(optimizer(model_sd))
        strategy = _load_strategy(spread)
        # The spread load's exchange moves each tensor .cuda() before its broadcast: on the CPU shim that is the
        # tensor itself (compat.CudaOnCpu, active only around megatron's code).
        with compat.megatron_code() if spread and _dp_group() is not None else contextlib.nullcontext():
            loaded = dist_checkpointing.load(want, folder, sharded_strategy=strategy,
                                             common_strategy=safe_load.common_loader())
    except CheckpointError:
        raise
    except (Exception, _dcp_error()) as exc:  # noqa: BLE001 -- verified files megatron cannot read: say which folder
        raise _load_error(folder, exc) from exc
    _into(gpt, loaded["model"], folder)
    return dict(loaded.get("extra", {})), (dict(loaded["optimizer"]) if optimizer is not None else None)


_OPTIMIZER_MISMATCH = {
    True: "it holds megatron's optimizer state (bf16 or the distributed optimizer) and this actor runs the "
          "torch AdamW: resume with the spec.actor.megatron precision and distributedOptimizer it was written with",
    False: "it holds a torch AdamW's state and this actor runs megatron's optimizer (bf16 or the distributed "
           "optimizer): resume with the spec.actor.megatron precision and distributedOptimizer it was written with",
}


def load_model(directory: str | os.PathLike[str], gpt: torch.nn.Module) -> None:
    """Only the model's tensors of a (verified) sharded folder, at this process's layout (an export)."""
    from megatron.core import dist_checkpointing

    checkpoint_shims()
    safe_load.take_refusals()  # what an earlier load refused is not this one's
    folder = str(directory)
    try:
        loaded = dist_checkpointing.load({"model": gpt.sharded_state_dict(prefix="")}, folder,  # type: ignore[operator]
                                         sharded_strategy=_load_strategy(False),
                                         common_strategy=safe_load.common_loader())
    except CheckpointError:
        raise
    except (Exception, _dcp_error()) as exc:  # noqa: BLE001 -- verified files megatron cannot read: say which folder
        raise _load_error(folder, exc) from exc
    _into(gpt, loaded["model"], folder)


def _dcp_error() -> type[BaseException]:
    """DCP's ``CheckpointException`` (each rank's error of a load): a ``BaseException``, not an ``Exception``."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _load_error(folder: str, exc: BaseException) -> CheckpointError:
    """What to raise for ``exc`` from megatron's load: what :mod:`.safe_load`'s shims refused during it (DCP
    keeps only the text of a reader's error, inside its own), named for ``folder``; else the error as text."""
    refused = safe_load.take_refusals()
    if refused:
        return safe_load.UnsafeCheckpointError(folder, refused[0].reason)
    return CheckpointError(folder, f"dist_checkpointing cannot load it ({type(exc).__name__}: {exc})")


def _into(gpt: torch.nn.Module, model: Mapping[str, Any], folder: str) -> None:
    missing, unexpected = gpt.load_state_dict(dict(model), strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise CheckpointError(folder, f"the model's tensors do not match: missing {missing[:5]}, unexpected "
                                      f"{list(unexpected)[:5]}")
