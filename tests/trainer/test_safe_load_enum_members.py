"""DCP metadata whose enum members are pickled by name (``getattr(<enum>, <name>)``, as Debian bookworm's Python
3.11.2 in the job image writes them) is read; every other ``getattr`` stays refused.

Found on the real cluster: each checkpoint the job image wrote named ``builtins.getattr`` and was refused as
unsafe at resume, so a gang restart, a resumed suspension and ``asyncrl export`` all failed there."""

import enum
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

from asyncrl.trainer.checkpoint.safe_load import UnsafeCheckpointError, read_metadata


class ByName(pickle.Pickler):
    """Pickles enum members as Python 3.11.2 does: ``getattr(cls, name)``."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


def metadata() -> Metadata:
    props = TensorProperties(dtype=torch.float32, memory_format=torch.contiguous_format)
    md = TensorStorageMetadata(properties=props, size=torch.Size([2]),
                               chunks=[ChunkStorageMetadata(offsets=torch.Size([0]), sizes=torch.Size([2]))])
    return Metadata(state_dict_metadata={"w": md})


def write(path: Path, obj: Any, pickler: type[pickle.Pickler] = ByName) -> Path:
    buf = io.BytesIO()
    pickler(buf, protocol=4).dump(obj)
    path.write_bytes(buf.getvalue())
    return path


def test_enum_members_by_name_are_read(tmp_path: Path) -> None:
    path = write(tmp_path / ".metadata", metadata())
    assert b"getattr" in path.read_bytes()  # the form Python 3.11.2 writes
    got = read_metadata(path)
    assert got.state_dict_metadata["w"].properties.memory_format == torch.contiguous_format


class Evil:
    """getattr of an admitted class that is no enum: a way from data to a callable."""

    def __reduce__(self) -> Any:
        return getattr, (torch.Size, "__class__")


class NotAMember:
    def __reduce__(self) -> Any:
        return getattr, (_MEM_FORMAT_ENCODING, "__init_subclass__")


@pytest.mark.parametrize("payload", [Evil(), NotAMember()], ids=["getattr-of-a-class", "getattr-not-a-member"])
def test_any_other_getattr_is_refused(tmp_path: Path, payload: Any) -> None:
    path = write(tmp_path / ".metadata", payload, pickle.Pickler)
    with pytest.raises(UnsafeCheckpointError, match="builtins.getattr"):
        read_metadata(path)
