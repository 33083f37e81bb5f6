"""``asyncrl export``: the trained policy as a Hugging Face model folder.

Read top to bottom (the first step, resolving a run directory to its checkpoint, is the driver's:
:mod:`asyncrl.trainer.driver.run.export`, which calls the rest):

    load      the actor's weights of that checkpoint (``actor.pt``, megatron names) -> HF names through
              the family's converter (:func:`~asyncrl.trainer.megatron.convert.megatron_to_hf`), the
              architecture the actor itself resolves from the job (checked against the checkpoint's)
    write     into a temporary sibling of ``--out``, then one ``rename`` (a reader sees no folder or a
              complete one): ``config.json``, ``generation_config.json``, ``model-0000k-of-0000n
              .safetensors`` shards of at most ``max_shard_bytes`` + ``model.safetensors.index.json``,
              the tokenizer files, and ``asyncrl-export.json`` (version, job, source checkpoint); which
              ``--out`` it may write or ``--force`` replace: :mod:`asyncrl.trainer.export_target`

``config.json`` is the source folder's own when the job's model came from a folder (``spec.model.weights``
with a ``config.json``), else the architecture's transformers config. The tokenizer files are copied from
that folder; the character tokenizer of the tiny presets is written as an equivalent transformers fast
tokenizer (:mod:`asyncrl.trainer.export_tokenizer`), and a task's own transformers tokenizer used without a
model folder (the customer-service BPE) is saved with ``save_pretrained``, chat template included
(:func:`save_task_tokenizer`).

The driver exports during training (``spec.checkpoint.exportEverySteps``) from the weights it already
holds for the weight sync (HF names, fp32): :func:`export_weights`, into ``<checkpoint dir>/exports``,
keeping the newest ``exportKeep`` (:func:`prune_exports`).
"""

import json
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.model_arch import ModelArch
from asyncrl.trainer.export_target import MARKER_FILE, ExportTargetError, check_target, sweep_leftovers

ExportDtype = Literal["float32", "bfloat16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
INDEX_FILE = "model.safetensors.index.json"
EXPORTS_DIR = "exports"  # under the checkpoint folder
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default ("5GB")
_EXPORT_NAME = re.compile(r"^step-(\d{6,})$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


class ExportError(ValueError):
    """An export that cannot be made: the message names the path and the fix."""


@dataclass(frozen=True)
class ExportResult:
    """What one export wrote."""

    path: Path
    version: int
    shards: int
    weight_bytes: int
    seconds: float
    tokenizer: str  # where the tokenizer came from: "copied from <folder>", "the built-in character ...", ...
    config_source: str  # "source folder" or "architecture"
    files: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # newer checkpoints that do not verify, with the reason

    def record(self) -> dict[str, Any]:
        """The JSON form (summary.json, the CLI's last line)."""
        return {"path": str(self.path), "version": self.version, "shards": self.shards,
                "weight_bytes": self.weight_bytes, "seconds": round(self.seconds, 3),
                "tokenizer": self.tokenizer, "config": self.config_source, "skipped": self.skipped}


def parse_size(text: str | int) -> int:
    """``"5GB"``, ``"500MB"``, ``"2GiB"`` or a number of bytes -> bytes (decimal units as transformers')."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if m is None:
            raise ExportError(f"--max-shard-size {text!r}: not a size; write e.g. 5GB, 500MB, 2GiB or a byte count")
        unit = (m.group(2) or "").upper().removesuffix("B")  # "GB" -> "G", "GiB" -> "GI", "B" -> ""
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise ExportError(f"--max-shard-size must be at least 1 byte, got {text!r}")
    return value


# ----------------------------------------------------------------------------------------- load
@dataclass(frozen=True)
class ModelFiles:
    """What the job's model is, for the export: its architecture, tokenizer, and source folder (if any)."""

    arch: ModelArch  # the actor's architecture
    tokenizer: Any  # asyncrl.rollout.tokenizer.Tokenizer
    source: Path | None  # spec.model.weights when it names a folder
    temperature: float  # spec.task.temperature: the policy was trained at it


def model_files(spec: AsyncRLJobSpec) -> ModelFiles:
    """Resolve the job's model as the actor does (the same arch, vocabulary and context length)."""
    from asyncrl.rollout.envs.binding import context_length, task_tokenizer
    from asyncrl.rollout.tokenizer import weights_folder
    from asyncrl.trainer.actor.megatron_actor import ActorSettings

    tokenizer = task_tokenizer(spec.model, spec.task)  # what the actor host resolves (trainer/driver/hosts/fleet.py)
    context = context_length(spec.task, tokenizer)
    arch = ActorSettings.from_spec(spec, tokenizer.vocab_size, max_sequence_length=context).arch
    source = weights_folder(spec.model.weights) if spec.model.weights is not None else None
    return ModelFiles(arch, tokenizer, source, spec.task.temperature)


def checkpoint_weights(checkpoint: Path, files: ModelFiles) -> tuple[dict[str, torch.Tensor], int]:
    """HF-named tensors and the policy version of an actor checkpoint (architecture checked)."""
    import dataclasses

    from asyncrl.trainer.actor.checkpoint_io import model_state
    from asyncrl.trainer.checkpoint.folder import CheckpointError
    from asyncrl.trainer.megatron.convert import megatron_to_hf

    try:
        model, meta = model_state(str(checkpoint), files.arch)
    except CheckpointError as exc:
        raise ExportError(f"{exc}; export another checkpoint folder (asyncrl export RUN_DIR takes the newest "
                          "that verifies)") from exc
    want = dataclasses.asdict(files.arch)  # what the actor writes into meta.json (and compares on resume)
    if meta.get("arch") != want:
        raise ExportError(
            f"{checkpoint}: the checkpoint's architecture {meta.get('arch')} is not the job's {want}; pass the "
            "job it was trained with (--job)"
        )
    return megatron_to_hf(model, files.arch), int(meta["version"])


# ----------------------------------------------------------------------------------------- write
def hf_config(files: ModelFiles, dtype: ExportDtype) -> tuple[dict[str, Any], str]:
    """``(config.json, where it came from)``: the source folder's, else the architecture's."""
    tok = files.tokenizer
    source_config = _source_file(files, "config.json")
    if source_config is not None:
        config = json.loads(source_config.read_text())
        origin = "source folder"
    else:
        config = files.arch.to_hf_config(dtype)  # the family table's (asyncrl.api.model_arch)
        for key, value in (("eos_token_id", tok.eos_id), ("pad_token_id", tok.pad_id),
                           ("bos_token_id", getattr(tok, "bos_id", None))):
            if config.get(key) is None:
                config[key] = value
        origin = "architecture"
    config.pop("torch_dtype", None)
    config["dtype"] = dtype
    return config, origin


def generation_config(files: ModelFiles) -> dict[str, Any]:
    """The source folder's ``generation_config.json``, else sampling at the training temperature."""
    source_generation = _source_file(files, "generation_config.json")
    if source_generation is not None:
        return dict(json.loads(source_generation.read_text()))
    tok = files.tokenizer
    return {"bos_token_id": getattr(tok, "bos_id", None), "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id,
            "do_sample": True, "temperature": files.temperature, "top_p": 1.0, "top_k": 0}


def _source_file(files: ModelFiles, name: str) -> Path | None:
    """The source folder's ``name`` when it has one inside the folder (links resolved and confined)."""
    from asyncrl.trainer.export_tokenizer import UnconfinedFileError, confined_file

    if files.source is None:
        return None
    try:
        return confined_file(files.source, name)
    except UnconfinedFileError as exc:
        raise ExportError(f"{exc}; nothing was written to --out") from exc


def write_tokenizer(files: ModelFiles, dest: Path) -> str:
    """Write the tokenizer files into ``dest``; returns what was written (for the log and summary)."""
    from asyncrl.rollout.tokenizer import ToolTokenizer
    from asyncrl.trainer.export_tokenizer import UnconfinedFileError, char_tokenizer_hf, copy_tokenizer_files

    if isinstance(files.tokenizer, ToolTokenizer):  # a preset (a bare safetensors folder too): no files
        char_tokenizer_hf(files.tokenizer).save_pretrained(str(dest))
        return ("the built-in character tokenizer as a transformers fast tokenizer (same ids: tags and "
                "specials are added tokens, characters a WordLevel vocabulary)")
    if files.source is None:
        return save_task_tokenizer(files.tokenizer, dest)
    try:
        copied = copy_tokenizer_files(files.source, dest)
    except UnconfinedFileError as exc:
        raise ExportError(f"{exc}; nothing was written to --out") from exc
    if not copied:
        raise ExportError(f"{files.source}: no tokenizer files to copy (tokenizer.json, tokenizer_config.json, ...)")
    return f"copied from {files.source} ({', '.join(copied)})"


def save_task_tokenizer(tokenizer: Any, dest: Path) -> str:
    """Save a tokenizer that has no folder of its own (a task's built-in one, e.g. the customer-service
    BPE of ``rollout/envs/cs_tokenizer.py``) with transformers' ``save_pretrained``: its vocabulary, specials
    and chat template, so ``AutoTokenizer.from_pretrained(dest)`` renders the same prompt ids."""
    hf = getattr(tokenizer, "hf", None)
    name = getattr(tokenizer, "name", type(tokenizer).__name__)
    if hf is None or not callable(getattr(hf, "save_pretrained", None)):
        raise ExportError(
            f"the job's tokenizer {name!r} has no files to copy (spec.model.weights names no model folder) and is "
            "not a transformers tokenizer that could be saved; set spec.model.weights to a model folder with its "
            "tokenizer files (tokenizer.json, tokenizer_config.json, ...)"
        )
    hf.save_pretrained(str(dest))
    template = " and its chat template" if getattr(hf, "chat_template", None) else ""
    return (f"the task's tokenizer {name} (no model folder), saved with transformers' save_pretrained: its "
            f"vocabulary, special tokens{template}")


def shard_plan(hf: Mapping[str, torch.Tensor], max_shard_bytes: int, itemsize: int) -> list[list[str]]:
    """Tensor names per shard, in order; a shard closes before it would exceed ``max_shard_bytes``
    (a tensor larger than the limit gets a shard of its own, as in transformers)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, t in hf.items():
        n = t.numel() * itemsize
        if shards[-1] and size + n > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_hf_folder(hf: Mapping[str, torch.Tensor], files: ModelFiles, out: Path, *, version: int,
                    provenance: Mapping[str, Any] | None = None, dtype: ExportDtype = "float32",
                    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, overwrite: bool = False,
                    progress: bool = False) -> ExportResult:
    """Write the HF folder ``out`` atomically from HF-named tensors ``hf`` (any float dtype, CPU or not).

    Tied embeddings leave ``lm_head.weight`` out (as ``save_pretrained`` does). ``out`` must not exist
    unless ``overwrite`` (the old folder is then replaced in one rename and deleted afterwards).
    """
    from safetensors.torch import save_file

    from asyncrl.trainer.checkpoint.folder import replace_folder

    t0 = time.monotonic()
    out = out.expanduser()
    try:
        check_target(out, overwrite)
    except ExportTargetError as exc:
        raise ExportError(str(exc)) from None
    if dtype not in DTYPES:
        raise ExportError(f"export dtype {dtype!r} is not supported; valid: {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    tied = files.arch.tie_embeddings
    tensors = {k: v for k, v in hf.items() if not (tied and k == "lm_head.weight")}
    _check_names(tensors, files.arch)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        plan = shard_plan(tensors, max_shard_bytes, torch.empty((), dtype=torch_dtype).element_size())
        n = len(plan)
        weight_map: dict[str, str] = {}
        total = 0
        bar = _progress(_total_bytes(tensors, torch_dtype), out, progress)
        for k, names in enumerate(plan, start=1):
            shard = f"model-{k:05d}-of-{n:05d}.safetensors"
            chunk = {name: tensors[name].detach().to("cpu", torch_dtype).contiguous() for name in names}
            try:
                save_file(chunk, str(tmp / shard), metadata={"format": "pt"})
            except Exception as exc:  # safetensors reports I/O errors (a full disk) as its own error type
                free = shutil.disk_usage(out.parent).free
                raise ExportError(f"{out}: writing {shard} failed ({exc}); the export needs about "
                                  f"{_total_bytes(tensors, torch_dtype)} bytes, {free} are free on that file "
                                  "system; nothing was written to --out") from exc
            size = sum(t.numel() * t.element_size() for t in chunk.values())
            total += size
            weight_map |= dict.fromkeys(names, shard)
            del chunk
            if bar is not None:
                bar.update(size)
        if bar is not None:
            bar.close()
        _write_json(tmp / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
        config, config_source = hf_config(files, dtype)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", generation_config(files))
        tokenizer_note = write_tokenizer(files, tmp)
        _write_json(tmp / MARKER_FILE, {"version": version, "dtype": dtype, "shards": n, "weight_bytes": total,
                                        "tokenizer": tokenizer_note, "config": config_source, **(provenance or {})})
        for f in tmp.iterdir():
            _fsync(f)
        replace_folder(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out, version, n, total, time.monotonic() - t0, tokenizer_note, config_source,
                        sorted(p.name for p in out.iterdir()))


# ----------------------------------------------------------------------------------------- during training
def exports_root(checkpoint_root: Path) -> Path:
    return checkpoint_root / EXPORTS_DIR


def export_path(checkpoint_root: Path, version: int) -> Path:
    """Folder of the export taken at ``version``."""
    return exports_root(checkpoint_root) / f"step-{version:06d}"


def due(version: int, last_version: int, every: int) -> bool:
    """An export is due at ``version``: every ``every`` versions (``checkpoint.exportEverySteps``; 0 = never)
    and at the run's last version."""
    return every > 0 and (version % every == 0 or version == last_version)


def export_weights(weights: Mapping[str, Any], files: ModelFiles, checkpoint_root: Path, version: int, *,
                   job_name: str, keep: int) -> ExportResult:
    """Export the driver's HF-named weights (numpy arrays or tensors) of ``version`` into
    ``<checkpoint dir>/exports/step-NNNNNN`` and keep the newest ``keep`` exports."""
    import warnings

    with warnings.catch_warnings():  # object-store arrays are read-only; the export only reads them
        warnings.simplefilter("ignore", UserWarning)
        hf = {k: torch.as_tensor(v) for k, v in weights.items()}
    result = write_hf_folder(hf, files, export_path(checkpoint_root, version), version=version, overwrite=True,
                             provenance={"job": job_name})
    prune_exports(checkpoint_root, keep)
    return result


def complete_exports(checkpoint_root: Path) -> list[tuple[int, Path]]:
    """``(version, folder)`` of every complete export, oldest first (temporary folders start with ``.``)."""
    root = exports_root(checkpoint_root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _EXPORT_NAME.match(p.name)) and (p / MARKER_FILE).is_file()]
    return sorted(found)


def prune_exports(checkpoint_root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete exports; returns what was removed."""
    found = complete_exports(checkpoint_root)
    removed = [p for _, p in found[: max(0, len(found) - keep)]]
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


# ----------------------------------------------------------------------------------------- helpers
def _total_bytes(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype) -> int:
    return sum(t.numel() for t in tensors.values()) * dtype.itemsize


def _check_names(tensors: Mapping[str, torch.Tensor], arch: ModelArch) -> None:
    """Every tensor the architecture's HF checkpoint has, with its shape, and nothing else (one error)."""
    from asyncrl.api.model_arch import hf_param_shapes

    want = hf_param_shapes(arch, with_tied_head=False)
    problems = [f"missing {k} {list(v)}" for k, v in want.items() if k not in tensors]
    problems += [f"unexpected {k}" for k in tensors if k not in want]
    problems += [f"{k}: {list(tensors[k].shape)}, expected {list(v)}" for k, v in want.items()
                 if k in tensors and tuple(tensors[k].shape) != tuple(v)]
    if problems:
        raise ExportError(f"the weights do not fit {arch.architecture} ({len(problems)} problems): "
                          + "; ".join(problems[:8]) + ("; ..." if len(problems) > 8 else ""))


def _progress(total_bytes: int, out: Path, enabled: bool) -> Any:
    if not enabled:
        return None
    import sys

    from tqdm import tqdm

    return tqdm(total=total_bytes, unit="B", unit_scale=True, desc=f"export {out.name}", file=sys.stderr,
                dynamic_ncols=True)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, default=str)
        f.write("\n")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def iter_shards(folder: Path) -> Iterator[Path]:
    """The safetensors shards an export's index names, in order (tests, tools)."""
    index = json.loads((folder / INDEX_FILE).read_text())
    yield from (folder / name for name in sorted(set(index["weight_map"].values())))
