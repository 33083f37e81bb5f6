"""Writers and probes of megatron parts that only tests and benches call (production never writes these).

- :func:`write_checkpoint`: the single-file checkpoint folder (``actor.pt`` + ``meta.json``) that production still
  reads (:func:`asyncrl.trainer.checkpoint.folder.read_checkpoint`, a resume from an older run);
- :func:`save_hf`: a bare HF folder (``model.safetensors`` + ``config.json``) from HF-named tensors, for the
  converter's round trips (the export a user runs is ``asyncrl.trainer.export.write_hf_folder``);
- :func:`full_logits`: every logit ``[B, T, V]`` of a megatron model, for parity tests against transformers
  (training reads per-token log-probs, ``asyncrl.trainer.megatron.logprobs.token_logprobs``).
"""

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model_arch import ModelArch
from asyncrl.trainer.checkpoint.folder import (
    META_FILE,
    STATE_FILE,
    disk_error,
    seal_folder,
    temporary_folder,
)
from asyncrl.trainer.megatron.convert import CONFIG_FILE, WEIGHTS_FILE
from asyncrl.trainer.megatron.logprobs import attention_mask, position_ids


def write_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` (torch-serialisable: tensors, numbers, dicts, lists) as one file ``actor.pt`` and
    ``meta`` (JSON): the single-file format (the actor writes sharded folders,
    :mod:`asyncrl.trainer.checkpoint.sharded`; production still reads this format,
    :func:`~asyncrl.trainer.checkpoint.folder.read_checkpoint`, and tests and ``bench/scale_checkpoint.py`` write it).

    Returns the final folder. ``meta`` gains ``files`` (size and SHA-256 of ``actor.pt``).
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_folder(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    writing = final / STATE_FILE
    try:
        tmp.mkdir()
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        writing = final / META_FILE
        return seal_folder(tmp, final, meta)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk leaves nothing half-written behind
        err = disk_error(exc, writing)
        if err is exc:
            raise
        raise err from exc



def save_hf(hf: dict[str, torch.Tensor], arch: ModelArch, directory: str) -> None:
    """Write ``model.safetensors`` (fp32, contiguous, tied head left out) and ``config.json``.

    The folder loads with ``AutoModelForCausalLM.from_pretrained(directory)``.
    """
    from safetensors.torch import save_file

    os.makedirs(directory, exist_ok=True)
    tensors = {
        k: v.detach().to("cpu", torch.float32).contiguous()
        for k, v in hf.items()
        if not (arch.tie_embeddings and k == "lm_head.weight")
    }
    save_file(tensors, os.path.join(directory, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(directory, CONFIG_FILE), "w") as f:
        json.dump(arch.to_hf_config(), f, indent=2, sort_keys=True)



def full_logits(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """All logits ``[B, T, V]`` (for parity tests and debugging; training uses :func:`token_logprobs`)."""
    B, T = tokens.shape
    return model(tokens, position_ids(B, T, tokens.device), attention_mask(model, T, tokens.device))


