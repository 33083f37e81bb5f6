"""What a LoRA actor's checkpoint holds of the model: the adapters alone, sharded, and the base's fingerprint.

The base is frozen and comes from ``spec.model.weights`` (or from the seed, for a preset), so a checkpoint
keeps only the adapters (and, beside them, their optimizer state: the moments are owned by the adapters, see
:mod:`asyncrl.trainer.checkpoint.sharded`) in the one sharded format. :class:`AdapterCheckpointView` is what
the checkpoint code saves and loads in place of the ``GPTModel``: its ``sharded_state_dict`` marks each
adapter's TP split as the base layer's (column-parallel ``B`` by rows, fc1's ``B`` through megatron's SwiGLU
factory so that [gate; up] reshards; row-parallel ``A`` by columns), so a folder resumes at another TP size.

A resume onto another base would pair the adapters with weights they were not trained on, silently: the
folder's marker carries :func:`base_fingerprint` and a resume compares it (:func:`check_same_base`).
"""

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model_arch import ModelArch
from asyncrl.trainer.megatron.lora import A_SUFFIX, B_SUFFIX, LoraLayers

SAMPLES = 16  # blocks read from each weights file besides its header (the fingerprint's cost is bounded)
SAMPLE_BYTES = 64 * 1024


class AdapterCheckpointView(torch.nn.Module):
    """The adapters of ``gpt`` seen as the model a checkpoint saves (``sharded_state_dict``) and loads
    (``load_state_dict``); the base is left out (it is the folder named by the fingerprint)."""

    def __init__(self, gpt: torch.nn.Module, layers: LoraLayers) -> None:
        super().__init__()
        modules = dict(gpt.named_modules())
        self._layers = {name: modules[name] for name in layers.names}  # not submodules: a plain dict

    def params(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, layer in self._layers.items():
            out[name + A_SUFFIX], out[name + B_SUFFIX] = layer.lora_A, layer.lora_B
        return out

    def sharded_state_dict(self, prefix: str = "", *_: Any, **__: Any) -> dict[str, Any]:
        from megatron.core.transformer.mlp import apply_swiglu_sharded_factory
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        out: dict[str, Any] = {}
        for name, layer in self._layers.items():
            state = {name + A_SUFFIX: layer.lora_A, name + B_SUFFIX: layer.lora_B}
            axis = {k: (1 if k.endswith(A_SUFFIX) else 0) for k, p in state.items()
                    if getattr(p, "tensor_model_parallel", False)}
            sharded = make_sharded_tensors_for_checkpoint(state, prefix, axis)
            fc1_b = prefix + name + B_SUFFIX
            if name.endswith("linear_fc1") and (name + B_SUFFIX) in axis:
                sharded[fc1_b] = apply_swiglu_sharded_factory(sharded[fc1_b], ())
            out.update(sharded)
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        own = self.params()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        with torch.no_grad():
            for k, p in own.items():
                if k in state_dict:
                    p.copy_(state_dict[k])
        if strict and (missing or unexpected):
            raise RuntimeError(f"adapters: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return missing, unexpected


def base_fingerprint(weights: str | None, arch: ModelArch, seed: int) -> str:
    """``sha256:<hex>`` of the frozen base: of a folder, its ``config.json`` and, per ``*.safetensors`` file,
    its name, size, header (every tensor's name, dtype, shape and offsets) and :data:`SAMPLES` blocks spread
    over its data; of a preset (``weights`` None), its architecture and the seed that drew it.

    Reading samples rather than every byte keeps the cost to a few MiB whatever the model's size: a different
    checkpoint of the same architecture differs in every sampled block; an edit of a few values between
    samples is not caught."""
    h = hashlib.sha256()
    if weights is None:
        h.update(json.dumps({"arch": dataclasses.asdict(arch), "seed": seed}, sort_keys=True).encode())
        return "sha256:" + h.hexdigest()
    folder = Path(weights)
    h.update((folder / "config.json").read_bytes())
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            h.update(f.read(min(n, size - 8)))
            start = 8 + n
            span = max(size - start - SAMPLE_BYTES, 0)
            for i in range(SAMPLES):
                f.seek(start + span * i // max(SAMPLES - 1, 1))
                h.update(f.read(SAMPLE_BYTES))
    return "sha256:" + h.hexdigest()


def check_same_base(directory: str | os.PathLike[str], saved: str | None, current: str) -> None:
    """Refuse a resume whose checkpoint's adapters were trained on another base (or that holds no adapters)."""
    if saved is None:
        raise ValueError(
            f"checkpoint {directory} holds no LoRA adapters (a full fine-tuning checkpoint); this job sets "
            "spec.model.lora: resume it without model.lora, or start from the base folder"
        )
    if saved != current:
        raise ValueError(
            f"checkpoint {directory} holds LoRA adapters trained on base {saved}; this job's base "
            f"(spec.model.weights) is {current}: resume with the base folder the adapters were trained on"
        )
