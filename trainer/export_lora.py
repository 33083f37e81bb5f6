"""``asyncrl export`` of a LoRA run (``spec.model.lora``): a peft adapter folder, or ``--merged`` a full HF folder.

The checkpoint holds the adapters alone and the base's fingerprint (:mod:`asyncrl.trainer.megatron.lora_checkpoint`);
the export rebuilds the actor's model from the job's base folder (``spec.model.weights``: a preset's random base
cannot be rebuilt outside its run, so it is refused), checks the fingerprint, loads the adapters and writes:

- by default a peft adapter folder: ``adapter_config.json`` (``peft_type: LORA``, ``r``, ``lora_alpha``, the
  target modules, ``base_model_name_or_path``: the base folder) and ``adapter_model.safetensors`` with one
  ``lora_A``/``lora_B`` per projection (a fused q/k/v or gate/up adapter is exactly one adapter per projection
  sharing ``A``: :func:`~asyncrl.trainer.megatron.lora.hf_adapter_tensors`). ``PeftModel.from_pretrained(base,
  folder)`` then gives the actor's logits (``tests/trainer/test_lora_export.py``);
- ``--merged``: the base with ``W + (alpha / r) B A`` in place of every adapted weight, as
  :func:`~asyncrl.trainer.export.write_hf_folder` writes any actor.
"""

import dataclasses
import json
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.lora import LoraSpec
from asyncrl.trainer.export import ExportError, ExportResult, ModelFiles, write_hf_folder
from asyncrl.trainer.export_target import MARKER_FILE, ExportTargetError, check_target, sweep_leftovers

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # peft's key prefix of a causal LM's adapter tensors




def lora_model(checkpoint: Path, spec: AsyncRLJobSpec, files: ModelFiles) -> tuple[Any, Any, int]:
    """The actor's model of a LoRA checkpoint: the base folder loaded, the adapters added and loaded from
    ``checkpoint``; returns ``(gpt, LoraLayers, version)``. Refuses a preset base and another base."""
    from asyncrl.trainer.checkpoint import sharded as sharded_checkpoint
    from asyncrl.trainer.checkpoint.folder import CheckpointError
    from asyncrl.trainer.megatron.compat import init_megatron
    from asyncrl.trainer.megatron.convert import load_folder
    from asyncrl.trainer.megatron.lora import apply_lora
    from asyncrl.trainer.megatron.lora_checkpoint import (
        AdapterCheckpointView,
        base_fingerprint,
        check_same_base,
    )
    from asyncrl.trainer.megatron.model import build_gpt_model

    lora, weights = spec.model.lora, spec.model.weights
    if lora is None:
        raise ExportError("export_lora: the job sets no spec.model.lora")
    if weights is None:
        raise ExportError(
            "a LoRA run on a preset trains adapters on a random base that only its run can rebuild; export needs "
            "spec.model.weights (a base folder): train the adapters on a folder to export them"
        )
    try:
        meta = sharded_checkpoint.verified(str(checkpoint))
    except CheckpointError as exc:
        raise ExportError(f"{exc}; export another checkpoint folder") from exc
    if meta.get("arch") != dataclasses.asdict(files.arch):
        raise ExportError(f"{checkpoint}: the checkpoint's architecture is not the job's; pass the job it was "
                          "trained with (--job)")
    try:
        check_same_base(checkpoint, meta.get("lora_base"), base_fingerprint(weights, files.arch, spec.train.seed))
    except ValueError as exc:
        raise ExportError(str(exc)) from None
    runtime = init_megatron(0, device="cpu")
    gpt = build_gpt_model(files.arch, use_cpu_initialization=runtime.use_cpu_initialization, random_init=False)
    load_folder(gpt, files.arch, weights)
    layers = apply_lora(gpt, files.arch, lora, seed=spec.train.seed)
    sharded_checkpoint.load_model(str(checkpoint), AdapterCheckpointView(gpt, layers))
    return gpt, layers, int(meta["version"])


def adapter_tensors(gpt: Any, layers: Any, files: ModelFiles) -> dict[str, torch.Tensor]:
    """The trained adapters in peft's per-projection names (``B`` unscaled: the config carries alpha)."""
    from asyncrl.trainer.megatron.lora import hf_adapter_tensors

    own = {n: p.detach().cpu() for n, p in gpt.named_parameters() if p.requires_grad}
    return dict(hf_adapter_tensors(own, files.arch, scale=1.0))


def merged_tensors(gpt: Any, layers: Any, files: ModelFiles) -> dict[str, torch.Tensor]:
    """The base with every adapted weight replaced by ``W + s B A`` (fp32), HF-named."""
    from asyncrl.trainer.megatron.convert import megatron_to_hf
    from asyncrl.trainer.megatron.lora import is_adapter_name, merged

    state = {k: v.detach().cpu() for k, v in gpt.state_dict().items() if not k.endswith("_extra_state")}
    for name in layers.names:
        state[name + ".weight"] = merged(state[name + ".weight"], state[name + ".lora_A"], state[name + ".lora_B"],
                                         layers.spec.scale)
    return megatron_to_hf({k: v for k, v in state.items() if not is_adapter_name(k)}, files.arch)


def peft_config(lora: LoraSpec, base: str) -> dict[str, Any]:
    """peft's ``adapter_config.json`` of ``lora`` on the base folder ``base``."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base,
        "r": lora.rank, "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
        "target_modules": sorted(lora.target_modules), "bias": "none", "fan_in_fan_out": False,
        "inference_mode": True, "use_rslora": False, "use_dora": False, "init_lora_weights": True,
    }


def write_peft_folder(adapters: Mapping[str, torch.Tensor], lora: LoraSpec, base: str, out: Path, *, version: int,
                      provenance: Mapping[str, Any] | None = None, overwrite: bool = False) -> ExportResult:
    """Write the peft adapter folder ``out`` atomically (fp32 adapters; ``out`` as ``write_hf_folder`` treats it)."""
    from safetensors.torch import save_file

    from asyncrl.trainer.checkpoint.folder import replace_folder

    t0 = time.monotonic()
    out = out.expanduser()
    try:
        check_target(out, overwrite)
    except ExportTargetError as exc:
        raise ExportError(str(exc)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        # copies: q/k/v (and gate/up) share one A, and safetensors refuses tensors that share memory
        tensors = {PEFT_PREFIX + k: v.detach().to("cpu", torch.float32, copy=True).contiguous() for k, v in adapters.items()}
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        total = sum(t.numel() * 4 for t in tensors.values())
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(peft_config(lora, base), indent=2) + "\n")
        (tmp / MARKER_FILE).write_text(json.dumps({"version": version, "dtype": "float32", "kind": "peft-lora",
                                                   "weight_bytes": total, **(provenance or {})}, indent=2) + "\n")
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out, version, 1, total, time.monotonic() - t0, "not written (the base folder's)",
                        "peft adapter_config", sorted(p.name for p in out.iterdir()))


def export_lora_checkpoint(checkpoint: Path, spec: AsyncRLJobSpec, files: ModelFiles, out: Path, *, merged: bool,
                           provenance: Mapping[str, Any] | None = None, overwrite: bool = False,
                           **hf_options: Any) -> ExportResult:
    """``asyncrl export`` of a LoRA checkpoint: the peft folder, or with ``merged`` the full HF folder."""
    gpt, layers, version = lora_model(checkpoint, spec, files)  # refuses a job without lora or a base folder
    if merged:
        return write_hf_folder(merged_tensors(gpt, layers, files), files, out, version=version,
                               provenance=provenance, overwrite=overwrite, **hf_options)
    return write_peft_folder(adapter_tensors(gpt, layers, files), layers.spec, str(spec.model.weights), out,
                             version=version, provenance=provenance, overwrite=overwrite)
