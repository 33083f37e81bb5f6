"""Atomic actor checkpoints: one folder per checkpoint, written to a temporary sibling and renamed.

A reader sees either the previous complete folder or the new complete folder, never a partial
one: the files are written and fsync'ed inside ``.<name>.tmp-<pid>``, then the folder is renamed
into place (``rename`` of a directory is atomic on POSIX file systems). Replacing an existing
folder moves it aside first and deletes it after the new one is in place.
"""

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "actor.pt"
META_FILE = "meta.json"


def write_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any], meta: dict[str, Any]) -> Path:
    """Write ``state`` (torch-serialisable: tensors, numbers, dicts, lists) and ``meta`` (JSON).

    Returns the final folder.
    """
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    with open(tmp / STATE_FILE, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    with open(tmp / META_FILE, "w") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old)
    return final


def read_checkpoint(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, meta)`` of a folder written by :func:`write_checkpoint` (tensors on the CPU)."""
    folder = Path(directory)
    if not (folder / STATE_FILE).is_file():
        raise FileNotFoundError(f"{folder} is not an actor checkpoint (no {STATE_FILE})")
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    meta = json.loads((folder / META_FILE).read_text())
    return state, meta


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
