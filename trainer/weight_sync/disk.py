"""The ``disk`` transport: HF safetensors per version on shared storage (AReaL, slime ``disk`` mode).

Layout under ``root``: ``v00000012/model.safetensors`` (the wire dtype; the tied head left out as
``save_pretrained`` does, so the folder loads with transformers too, given a ``config.json``). A version
is written into a hidden temporary folder, fsynced, then renamed: a reader never sees half a file.
The newest ``keep`` versions stay; older ones are removed after each write.
"""

import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from asyncrl.trainer.weight_sync.buckets import Bucket, unpack_bucket

WEIGHTS_FILE = "model.safetensors"
_VERSION_DIR = re.compile(r"^v(\d{8})$")


@dataclass(frozen=True)
class DiskVersion:
    """The handle of one version on disk (what the driver passes to receivers)."""

    version: int
    path: str  # the version's folder

    @property
    def file(self) -> Path:
        return Path(self.path) / WEIGHTS_FILE


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root) / f"v{version:08d}"


def write_version(buckets: Iterable[Bucket], root: str | Path, version: int, *, keep: int,
                  drop: frozenset[str] = frozenset()) -> DiskVersion:
    """Write one version's buckets as ``<root>/v<version>/model.safetensors`` atomically; prune to ``keep``.

    ``drop``: names left out of the file (``lm_head.weight`` of a tied architecture).
    """
    from safetensors.torch import save_file

    if keep < 1:
        raise ValueError(f"weight sync (disk): keep must be >= 1, got {keep}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for b in buckets:
        if b.manifest.version != version:
            raise ValueError(f"weight sync (disk): a bucket of version {b.manifest.version} in version {version}")
        tensors |= {k: v for k, v in unpack_bucket(b.manifest, b.data.cpu()).items() if k not in drop}
    final = version_dir(root, version)
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
    tmp.mkdir()
    try:
        path = tmp / WEIGHTS_FILE
        save_file(tensors, str(path), metadata={"format": "pt", "asyncrl_version": str(version)})
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        if final.exists():  # a rerun of the same version (resume): the new file wins
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, keep)
    return DiskVersion(version, str(final))


def versions(root: str | Path) -> list[int]:
    """Complete versions under ``root``, oldest first (temporary folders are not versions)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(m.group(1)) for p in root.iterdir() if (m := _VERSION_DIR.match(p.name)) and p.is_dir())


def latest(root: str | Path) -> DiskVersion | None:
    """The newest complete version (a late joiner's starting point), or None."""
    found = versions(root)
    return DiskVersion(found[-1], str(version_dir(root, found[-1]))) if found else None


def prune(root: str | Path, keep: int) -> list[int]:
    """Remove all but the newest ``keep`` versions; returns the removed ones."""
    old = versions(root)[:-keep]
    for v in old:
        shutil.rmtree(version_dir(root, v), ignore_errors=True)
    return old


def read_version(handle: DiskVersion) -> dict[str, torch.Tensor]:
    """The HF state dict of one version on disk (read whole; the engines copy into their parameters)."""
    from safetensors.torch import load_file

    if not handle.file.is_file():
        raise FileNotFoundError(
            f"weight sync (disk): {handle.file} is missing (version {handle.version} pruned? raise "
            "actor.weightSync.diskKeep)"
        )
    return load_file(str(handle.file))
