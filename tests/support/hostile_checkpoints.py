"""One table of hostile checkpoint folders: each row changes one thing of a real sealed sharded folder, as
someone who sends a checkpoint ("export this one for me") could, and reseals its marker (``meta.json`` with
*correct* sizes and SHA-256s: whoever writes a folder can compute them).

- ``mutate(folder, canary)``: the change; ``canary`` is a path outside the folder that a payload would
  create if the folder ran code (rows with ``runs_code``), or where a file "elsewhere" is put.
- ``file``: the file the refusal must name; ``message``: a fragment of the refusal (the rule broken).

Used by ``tests/trainer/test_hostile_checkpoints.py`` (the gate :func:`sharded_checkpoint.verified`,
a resume, ``asyncrl export``).
"""

import dataclasses
import io
import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from asyncrl.trainer.checkpoint.folder import FILES_KEY, META_FILE, file_record


@dataclass(frozen=True)
class HostileFolder:
    id: str
    mutate: Callable[[Path, Path], None]
    file: str
    message: str
    runs_code: bool = False


class Payload:
    """Unpickling this runs ``touch canary`` (a stand-in for any command): what a crafted pickle does."""

    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.canary}",)


def reseal(folder: Path, extra: dict[str, Path] | None = None) -> None:
    """Rewrite the marker with the right size and SHA-256 of every file it lists (and of ``extra``: listed
    name -> the file its record is computed from), as a folder's author can."""
    meta = json.loads((folder / META_FILE).read_text())
    files = {name: file_record(folder / name) for name in meta[FILES_KEY]}
    files |= {name: file_record(path) for name, path in (extra or {}).items()}
    (folder / META_FILE).write_text(json.dumps({**meta, FILES_KEY: files}, indent=2, sort_keys=True))


def _metadata(folder: Path) -> Any:
    with open(folder / ".metadata", "rb") as f:
        return pickle.load(f)  # noqa: S301 -- the test's own folder, before any change


def _write_metadata(folder: Path, metadata: Any) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def _replace(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _payload_metadata(folder: Path, canary: Path) -> None:
    _replace(folder / ".metadata", pickle.dumps(Payload(canary)))
    reseal(folder)


def _payload_inside_metadata(folder: Path, canary: Path) -> None:
    metadata = _metadata(folder)
    metadata.planner_data = {"note": Payload(canary)}  # a real Metadata carrying the payload one level down
    _write_metadata(folder, metadata)
    reseal(folder)


def _payload_common(folder: Path, canary: Path) -> None:
    state = torch.load(folder / "common.pt", weights_only=True)
    buf = io.BytesIO()
    torch.save({**state, "counters": Payload(canary)}, buf)
    _replace(folder / "common.pt", buf.getvalue())
    reseal(folder)


def _byte_items(metadata: Any) -> list[Any]:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    keys = {k for k, v in metadata.state_dict_metadata.items() if isinstance(v, BytesStorageMetadata)}
    return [index for index in metadata.storage_data if index.fqn in keys]


def _repoint_byte_item(folder: Path, obj: Any) -> None:
    """The first byte item (a layer's ``_extra_state``) re-pointed at ``torch.save(obj)``, appended to its shard."""
    metadata = _metadata(folder)
    index = _byte_items(metadata)[0]
    info = metadata.storage_data[index]
    buf = io.BytesIO()
    torch.save(obj, buf)
    shard = folder / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(buf.getvalue())
    metadata.storage_data[index] = dataclasses.replace(info, offset=offset, length=len(buf.getvalue()))
    _write_metadata(folder, metadata)
    reseal(folder)


def _payload_byte_item(folder: Path, canary: Path) -> None:
    _repoint_byte_item(folder, [Payload(canary)])


def _extra_state(folder: Path, canary: Path) -> None:
    """Extra state holding a pickle as bytes (what TransformerEngine's layers unpickle in full on load): data to
    torch's weights-only reader, code to such a layer."""
    _repoint_byte_item(folder, [torch.frombuffer(bytearray(pickle.dumps(Payload(canary))), dtype=torch.uint8)])


def _slice_elsewhere(absolute: bool) -> Callable[[Path, Path], None]:
    """The first tensor's slice read from a copy of its shard outside the folder (``..`` or absolute)."""

    def mutate(folder: Path, canary: Path) -> None:
        metadata = _metadata(folder)
        index = next(i for i in metadata.storage_data if i not in set(_byte_items(metadata)))
        info = metadata.storage_data[index]
        outside = folder.parent / "outside.distcp"
        outside.write_bytes((folder / info.relative_path).read_bytes())
        where = str(outside) if absolute else f"../{outside.name}"
        metadata.storage_data[index] = dataclasses.replace(info, relative_path=where)
        _write_metadata(folder, metadata)
        reseal(folder)

    return mutate


def _past_the_end(folder: Path, canary: Path) -> None:
    metadata = _metadata(folder)
    index = next(iter(metadata.storage_data))
    info = metadata.storage_data[index]
    metadata.storage_data[index] = dataclasses.replace(info, offset=(folder / info.relative_path).stat().st_size)
    _write_metadata(folder, metadata)
    reseal(folder)


def _storage_by_name(folder: Path, canary: Path) -> None:
    metadata = _metadata(folder)
    metadata.storage_data = {index.fqn: info for index, info in metadata.storage_data.items()}
    _write_metadata(folder, metadata)
    reseal(folder)


def _transform(folder: Path, canary: Path) -> None:
    metadata = _metadata(folder)
    index = next(iter(metadata.storage_data))
    metadata.storage_data[index] = dataclasses.replace(metadata.storage_data[index], transform_descriptors=["zstd"])
    _write_metadata(folder, metadata)
    reseal(folder)


def _not_metadata(folder: Path, canary: Path) -> None:
    _replace(folder / ".metadata", pickle.dumps({"state_dict_metadata": {}}))
    reseal(folder)


def _garbled(folder: Path, canary: Path) -> None:
    _replace(folder / ".metadata", b"\x80\x04garbage")
    reseal(folder)


def _backend(folder: Path, canary: Path) -> None:
    config = json.loads((folder / "metadata.json").read_text())
    _replace(folder / "metadata.json", json.dumps({**config, "sharded_backend": "zarr"}).encode())
    reseal(folder)


def _unlisted(folder: Path, canary: Path) -> None:
    (folder / "payload.py").write_text("import os\nos.system('true')\n")


def _unlisted_link(folder: Path, canary: Path) -> None:
    (folder / "extra").symlink_to(folder.parent)


def _listed(name: Callable[[Path], str]) -> Callable[[Path, Path], None]:
    """The marker lists one more name, with the correct record of the file that name reaches."""

    def mutate(folder: Path, canary: Path) -> None:
        secret = folder.parent / "secret.bin"
        secret.write_bytes(b"not the checkpoint's")
        reseal(folder, {name(folder): secret})

    return mutate


def _listed_link(folder: Path, canary: Path) -> None:
    """common.pt replaced by a link to a byte-identical copy elsewhere (the checksum still matches)."""
    copy = folder.parent / "common-elsewhere.pt"
    copy.write_bytes((folder / "common.pt").read_bytes())
    (folder / "common.pt").unlink()
    (folder / "common.pt").symlink_to(copy)


def _marker_link(folder: Path, canary: Path) -> None:
    copy = folder.parent / "meta-elsewhere.json"
    copy.write_bytes((folder / META_FILE).read_bytes())
    (folder / META_FILE).unlink()
    (folder / META_FILE).symlink_to(copy)


def _bad_record(folder: Path, canary: Path) -> None:
    meta = json.loads((folder / META_FILE).read_text())
    meta[FILES_KEY]["common.pt"] = "trust me"
    (folder / META_FILE).write_text(json.dumps(meta))


HOSTILE_FOLDERS: list[HostileFolder] = [
    HostileFolder("metadata-is-a-payload", _payload_metadata, ".metadata", "names the global posix.system",
                  runs_code=True),
    HostileFolder("metadata-carries-a-payload", _payload_inside_metadata, ".metadata",
                  "names the global posix.system", runs_code=True),
    HostileFolder("common-pt-carries-a-payload", _payload_common, "common.pt",
                  "needs full unpickling (the global posix.system", runs_code=True),
    HostileFolder("byte-item-is-a-payload", _payload_byte_item, "__0_0.distcp: byte item",
                  "needs full unpickling (the global posix.system", runs_code=True),
    HostileFolder("extra-state-carries-a-pickle", _extra_state, "__0_0.distcp: byte item",
                  "holds a layer's extra state"),
    HostileFolder("slice-read-through-dotdot", _slice_elsewhere(absolute=False), ".metadata",
                  "not a file its marker lists"),
    HostileFolder("slice-read-from-an-absolute-path", _slice_elsewhere(absolute=True), ".metadata",
                  "not a file its marker lists"),
    HostileFolder("slice-past-the-end", _past_the_end, ".metadata", "which has"),
    HostileFolder("storage-keyed-by-name", _storage_by_name, ".metadata",
                  "does not record where each tensor lies as DCP writes it"),
    HostileFolder("slice-transformed", _transform, ".metadata", "which no checkpoint here uses"),
    HostileFolder("metadata-is-not-metadata", _not_metadata, ".metadata", "holds a dict, not DCP metadata"),
    HostileFolder("metadata-is-garbled", _garbled, ".metadata", "is not DCP metadata (UnpicklingError"),
    HostileFolder("another-backend", _backend, "metadata.json", "not the backends written here"),
    HostileFolder("unlisted-file", _unlisted, "payload.py", "is not listed in meta.json"),
    HostileFolder("unlisted-link", _unlisted_link, "extra", "is a symbolic link"),
    HostileFolder("listed-absolute-name", _listed(lambda f: str(f.parent / "secret.bin")), "secret.bin",
                  "an absolute path"),
    HostileFolder("listed-dotdot-name", _listed(lambda f: "../secret.bin"), "../secret.bin",
                  "a path with '..'"),
    HostileFolder("listed-name-with-a-nul", _listed(lambda f: "common\x00.pt"), "'common\\x00.pt'",
                  "not a file name"),
    HostileFolder("listed-file-is-a-link", _listed_link, "common.pt", "which is a symbolic link"),
    HostileFolder("marker-is-a-link", _marker_link, "meta.json", "is a symbolic link"),
    HostileFolder("record-is-not-a-record", _bad_record, "common.pt", "not {'bytes': int, 'sha256': hex}"),
]
