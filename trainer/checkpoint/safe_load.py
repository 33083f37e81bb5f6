"""Reading a sharded checkpoint folder as data, never as code.

megatron's ``dist_checkpointing`` (over torch's distributed checkpoint, DCP) unpickles three kinds of file
when it loads a folder:

1. ``.metadata``, DCP's index of the folder: a plain ``pickle.load`` (``FileSystemReader.read_metadata``);
2. every *byte item* (a megatron ``ShardedObject``: here each layer's ``_extra_state``), inside a
   ``.distcp`` file: ``torch.load(weights_only=False)`` (``DefaultLoadPlanner.load_bytes``);
3. ``common.pt`` (the common state: the manifest, counters, scalars): ``torch.load`` with torch's default,
   weights-only since torch 2.6 unless the environment says ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``.

A pickle may name any importable callable and call it (``os.system``), and ``meta.json``'s checksums are
whatever the folder's author computed: a folder someone sends is code unless each of these is read by an
unpickler that admits only data. Here:

- ``.metadata`` goes through :class:`MetadataUnpickler`, which admits the classes DCP's metadata is made of
  (:data:`METADATA_GLOBALS`: the globals a folder written here names, listed from a real one) and torch's
  dtypes, nothing else;
- byte items and ``common.pt`` go through ``torch.load(weights_only=True)``;
- every slice the metadata points at must be in a file the marker lists (so: in the folder, checksummed);
- ``metadata.json`` (megatron's choice of loader) must name the backends written here (:data:`BACKENDS`).

:func:`check_folder` does all of it before megatron opens anything (every rank, from
:func:`~asyncrl.trainer.checkpoint.sharded.verified`), each refusal a :class:`CheckpointError`
naming the file. :func:`install` (one of the checkpoint shims) makes DCP's own reads in this process go
through the same unpicklers, so a file swapped after the check is refused too; :class:`CommonLoader` is
megatron's common-state loader with ``weights_only=True`` spelled out.
"""

import io
import json
import os
import pickle
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from asyncrl.trainer.checkpoint.folder import CheckpointError

METADATA_FILE = ".metadata"  # DCP's index (a pickle)
COMMON_FILE = "common.pt"  # megatron's common state (torch.save)
CONFIG_FILE = "metadata.json"  # megatron's backend choice (JSON)
# What megatron writes into metadata.json for the torch_dist strategy used here; another backend is another loader.
BACKENDS = {"sharded_backend": "torch_dist", "sharded_backend_version": 1,
            "common_backend": "torch", "common_backend_version": 1}
_DCP = "torch.distributed.checkpoint"
# Every global a .metadata written here names (pickletools over a real folder: model, Adam state, EWMA, DP=2).
METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # torch.layout pickles as _get_layout("torch.strided"): a table lookup
    (f"{_DCP}.filesystem", "_StorageInfo"),
    *((f"{_DCP}.metadata", name) for name in (
        "Metadata", "BytesStorageMetadata", "ChunkStorageMetadata", "MetadataIndex", "StorageMeta",
        "TensorProperties", "TensorStorageMetadata", "_MEM_FORMAT_ENCODING")),
    *((f"{_DCP}.planner", name) for name in ("SavePlan", "TensorWriteData", "WriteItem", "WriteItemType")),
})
TRUST_FIX = ("it was not written by an asyncrl checkpoint, or was changed after: resume or export a checkpoint "
             "from a source you trust (meta.json's checksums detect corruption, not tampering)")
# How torch's weights-only unpickler names the global it refused ("unsupported GLOBAL posix.system whose module ...",
# "Unsupported global: GLOBAL builtins.eval was not an allowed global ...").
_UNSUPPORTED = re.compile(r"unsupported(?: global:)? GLOBAL ([\w.]+)", re.I)


class UnsafeCheckpointError(CheckpointError):
    """A file of a checkpoint folder that only a full unpickler could read: refused, never run."""


# The refusals of the shims since the last take_refusals(): DCP turns a reader's error into text inside its own
# (an AssertionError of joined messages), so the loader asks here what was refused.
_REFUSED: list[UnsafeCheckpointError] = []


def take_refusals() -> list[UnsafeCheckpointError]:
    """What the installed shims refused since the last call (and forget it)."""
    out = list(_REFUSED)
    _REFUSED.clear()
    return out


class RefusedGlobal(pickle.UnpicklingError):
    """A global that :class:`MetadataUnpickler` does not admit (the text is ``module.name``)."""


class MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP metadata: only :data:`METADATA_GLOBALS` and torch dtypes can be named (``find_class``
    is the only way a pickle reaches a callable: ``GLOBAL``, ``STACK_GLOBAL`` and ``EXT*`` all go through it)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):  # an enum member by name: only that, see _enum_member
            return _enum_member
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):  # torch.float32 is a global
            return getattr(torch, name)
        raise RefusedGlobal(f"{module}.{name}")


def _enum_member(cls: Any, name: Any) -> Any:
    """What ``builtins.getattr`` may do in DCP metadata: fetch a member of an admitted enum by its name.

    Python 3.11 up to 3.11.? (Debian bookworm's 3.11.2, so the job image) pickles an enum member as
    ``getattr(<enum class>, <member name>)``; later releases pickle it by value. Found on the real cluster: every
    checkpoint the job image wrote named ``builtins.getattr`` (for ``_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT``)
    and was refused at resume. Any other use of getattr (an attribute of anything else: a way to reach code)
    stays refused."""
    import enum

    if (isinstance(cls, type) and issubclass(cls, enum.Enum) and (cls.__module__, cls.__name__) in METADATA_GLOBALS
            and isinstance(name, str) and name in cls.__members__):
        return cls.__members__[name]
    raise RefusedGlobal(f"builtins.getattr on {getattr(cls, '__qualname__', type(cls).__name__)}.{name}")


def read_metadata(path: Path) -> Any:
    """DCP's ``Metadata`` from the file ``path``, read by :class:`MetadataUnpickler`; an
    :class:`UnsafeCheckpointError` naming the file and the refused global otherwise."""
    from torch.distributed.checkpoint.metadata import Metadata

    folder, name = path.parent, path.name
    try:
        with open(path, "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except RefusedGlobal as exc:
        raise UnsafeCheckpointError(folder, f"{name} names the global {exc}, which a checkpoint's metadata never "
                                            f"holds (unpickling it could run code): refused; {TRUST_FIX}") from exc
    except Exception as exc:  # noqa: BLE001 -- a truncated or garbled pickle: say which file
        raise CheckpointError(folder, f"{name} is not DCP metadata ({type(exc).__name__}: {exc})") from exc
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpointError(folder, f"{name} holds a {type(metadata).__name__}, not DCP metadata; {TRUST_FIX}")
    return metadata


def load_weights_only(data: io.BytesIO | Path, what: str, folder: Path) -> Any:
    """``torch.load(weights_only=True)`` of ``data``; what needs more is an :class:`UnsafeCheckpointError`
    naming ``what`` (a file, or a byte item and its file) and the global it asked for."""
    try:
        return torch.load(data, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        m = _UNSUPPORTED.search(str(exc))
        named = f"the global {m.group(1)}" if m else "more than tensors and plain data"
        raise UnsafeCheckpointError(folder, f"{what} needs full unpickling ({named}; a checkpoint holds only "
                                            f"tensors and plain data): refused; {TRUST_FIX}") from exc
    except Exception as exc:  # noqa: BLE001 -- verified bytes torch cannot read: say which
        raise CheckpointError(folder, f"{what} does not load ({type(exc).__name__}: {exc})") from exc


def check_folder(folder: str | os.PathLike[str], files: Iterable[str]) -> None:
    """Everything megatron would unpickle in ``folder`` (whose marker lists ``files``), read here as data
    first: :data:`CONFIG_FILE`, :data:`METADATA_FILE` (and where its slices lie), each byte item,
    :data:`COMMON_FILE`. Raises a :class:`CheckpointError` naming the file; returns None when all is data."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    folder = Path(folder)
    listed = set(files)
    for name in (CONFIG_FILE, METADATA_FILE, COMMON_FILE):
        if name not in listed:
            raise CheckpointError(folder, f"its marker lists no {name}, which a sharded checkpoint has")
    _check_backends(folder)
    metadata = read_metadata(folder / METADATA_FILE)
    storage = _storage(folder, metadata)
    for fqn, info in storage:
        if info.relative_path not in listed:
            raise UnsafeCheckpointError(folder, f"{METADATA_FILE} places {fqn!r} in {info.relative_path!r}, not a "
                                                "file its marker lists (a path out of the folder, or an unchecked "
                                                f"file): refused; {TRUST_FIX}")
        if info.transform_descriptors:  # never written here (no compression extension)
            raise UnsafeCheckpointError(folder, f"{METADATA_FILE} asks to transform {fqn!r} with "
                                                f"{info.transform_descriptors}, which no checkpoint here uses; "
                                                f"{TRUST_FIX}")
        size = (folder / info.relative_path).stat().st_size
        if not (0 <= info.offset and 0 <= info.length and info.offset + info.length <= size):
            raise CheckpointError(folder, f"{METADATA_FILE} places {fqn!r} at bytes {info.offset}+{info.length} of "
                                          f"{info.relative_path}, which has {size}; {TRUST_FIX}")
    byte_keys = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    for fqn, info in storage:
        if fqn in byte_keys:
            with open(folder / info.relative_path, "rb") as f:
                f.seek(info.offset)
                data = io.BytesIO(f.read(info.length))
            what = f"{info.relative_path}: byte item {fqn!r}"
            item = load_weights_only(data, what, folder)
            if "_extra_state" in fqn and not _no_extra_state(item):
                raise UnsafeCheckpointError(folder, f"{what} holds a layer's extra state (TransformerEngine's FP8 "
                                                    "metadata, which its layers unpickle in full on load); the "
                                                    f"actor's layers keep none: refused; {TRUST_FIX}")
    load_weights_only(folder / COMMON_FILE, COMMON_FILE, folder)


def _storage(folder: Path, metadata: Any) -> list[tuple[str, Any]]:
    """``(tensor name, _StorageInfo)`` of every slice ``metadata`` records, each of the types DCP writes
    (the unpickler admits only DCP's classes, but it cannot say which goes where)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

    storage, entries = metadata.storage_data, getattr(metadata, "state_dict_metadata", None)
    ok = isinstance(storage, dict) and bool(storage) and isinstance(entries, dict) and all(
        isinstance(k, MetadataIndex) and isinstance(k.fqn, str) and isinstance(v, _StorageInfo)
        and isinstance(v.relative_path, str) and type(v.offset) is int and type(v.length) is int
        for k, v in storage.items())
    if not ok:
        raise CheckpointError(folder, f"{METADATA_FILE} does not record where each tensor lies as DCP writes it "
                                      f"(MetadataIndex -> _StorageInfo); {TRUST_FIX}")
    return [(k.fqn, v) for k, v in storage.items()]


def _no_extra_state(item: Any) -> bool:
    """Whether a ``_extra_state`` byte item holds nothing (what megatron's local layers save: ``[None]``)."""
    def empty(x: Any) -> bool:
        return (x is None or (isinstance(x, torch.Tensor) and x.numel() == 0)
                or (isinstance(x, io.BytesIO) and x.getbuffer().nbytes == 0))

    return isinstance(item, list | tuple) and all(empty(x) for x in item)


def _check_backends(folder: Path) -> None:
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(folder, f"{CONFIG_FILE} is unreadable ({type(exc).__name__}: {exc})") from exc
    if config != BACKENDS:
        raise UnsafeCheckpointError(folder, f"{CONFIG_FILE} says {config}, not the backends written here "
                                            f"{BACKENDS} (it chooses megatron's loader); {TRUST_FIX}")


def load_common(folder: str | Path) -> dict[str, Any]:
    """``common.pt`` of a checked folder, weights-only (megatron's ``load_common_state_dict`` is torch's
    default load, which the environment can turn into a full unpickle)."""
    folder = Path(folder)
    state = load_weights_only(folder / COMMON_FILE, COMMON_FILE, folder)
    if not isinstance(state, dict):
        raise CheckpointError(folder, f"{COMMON_FILE} holds a {type(state).__name__}, not the common state")
    return state


def common_loader() -> Any:
    """megatron's common-state load strategy, reading ``common.pt`` weights-only (:func:`load_common`) and no
    ``ShardedObject`` files (the torch_dist strategy keeps those inside the ``.distcp`` files)."""
    from megatron.core.dist_checkpointing.strategies.common import TorchCommonLoadStrategy

    class CommonLoader(TorchCommonLoadStrategy):
        def load_common(self, checkpoint_dir: str | Path) -> dict[str, Any]:
            return load_common(checkpoint_dir)

        def load_sharded_objects(self, sharded_objects_state_dict: Any, checkpoint_dir: str | Path) -> Any:
            raise CheckpointError(checkpoint_dir, "it asks for ShardedObject files (megatron's 'torch' backend), "
                                                  "which a checkpoint here never has")

    return CommonLoader()


def install() -> None:
    """Make DCP's readers in this process unpickle as :func:`check_folder` does (idempotent): ``.metadata``
    through :class:`MetadataUnpickler`, byte items weights-only. Every DCP load in the process is affected,
    which is the point: no path through DCP unpickles arbitrary globals."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    FileSystemReader.read_metadata = _read_metadata  # type: ignore[method-assign]
    DefaultLoadPlanner.load_bytes = _load_bytes  # type: ignore[method-assign]


def _read_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
    """``FileSystemReader.read_metadata`` with :class:`MetadataUnpickler` (the rest as DCP's own)."""
    from torch.distributed.checkpoint.metadata import StorageMeta

    try:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
    except UnsafeCheckpointError as exc:
        _REFUSED.append(exc)
        raise
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = StorageMeta()
    metadata.storage_meta.load_id = self.load_id
    return metadata


def _load_bytes(self: Any, read_item: Any, value: io.BytesIO) -> None:
    """``DefaultLoadPlanner.load_bytes`` with ``weights_only=True`` (DCP's own passes False)."""
    from torch.distributed.checkpoint._traverse import set_element

    fqn = read_item.dest_index.fqn
    try:
        obj = load_weights_only(value, f"byte item {fqn!r}", Path("(sharded state)"))
    except UnsafeCheckpointError as exc:
        _REFUSED.append(exc)
        raise
    if self.flatten_state_dict:
        set_element(self.original_state_dict, self.mappings[fqn], obj)
    else:
        self.state_dict[fqn] = obj
