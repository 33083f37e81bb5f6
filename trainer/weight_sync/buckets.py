"""HF tensors packed into flat byte buckets, with a manifest that reassembles them bit-exactly.

A *bucket* is one contiguous ``uint8`` buffer ``[nbytes]`` holding whole tensors back to back (each at
an offset aligned to :data:`ALIGN` bytes); its :class:`BucketManifest` lists, per tensor, the HF name,
the dtype, the shape and the byte offset. Tensors are packed in the order the source yields them
(one HF tensor at a time, :func:`asyncrl.trainer.megatron.convert.iter_megatron_to_hf`), cast to the
wire dtype first, so the sender never holds more than one bucket besides the model.

Why bytes and not a float buffer: one buffer type for every dtype (bf16 has no numpy type, and Ray
maps numpy ``uint8`` arrays zero-copy), and the receiver's tensors are *views* of the bucket, equal
bit for bit to the sender's cast (``torch.equal`` after the same ``.to(dtype)``).

A tensor larger than the bucket size gets a bucket of its own (never split: the receiver installs
whole tensors). Peers use 512 MiB-1 GiB (slime ``--update-weight-buffer-size``, AReaL
``weight_chunked_mem_mb``, ROLL ``model_update_buffer_size_mb``; ``docs/weight-sync.md``).
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

import torch

ALIGN = 64  # bytes: every tensor starts on a cache line (and is aligned for any dtype's view)
WireDtype = Literal["float32", "bfloat16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor inside a bucket: ``nbytes`` bytes at ``offset``, viewed as ``dtype`` of ``shape``."""

    name: str
    dtype: str  # a key of DTYPES
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BucketManifest:
    """What bucket ``index`` of version ``version`` holds (``nbytes``: the buffer's length)."""

    version: int
    index: int
    nbytes: int
    entries: tuple[TensorEntry, ...]

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.entries]


@dataclass(frozen=True)
class Bucket:
    """A manifest and its buffer ``data`` ``[manifest.nbytes]`` (``torch.uint8``, CPU or device)."""

    manifest: BucketManifest
    data: torch.Tensor


def _dtype_name(dtype: torch.dtype) -> str:
    for k, v in DTYPES.items():
        if v == dtype:
            return k
    raise ValueError(f"weight sync: dtype {dtype} is not supported on the wire; valid: {sorted(DTYPES)}")


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def pack_buckets(tensors: Iterable[tuple[str, torch.Tensor]], *, version: int, bucket_bytes: int,
                 dtype: torch.dtype | None = None) -> Iterator[Bucket]:
    """Pack ``(HF name, tensor)`` pairs into buckets of at most ``bucket_bytes`` (a larger tensor alone).

    ``dtype``: the wire dtype every floating tensor is cast to (None: as given). Yields each bucket as
    soon as it is full, so only one is built at a time.
    """
    if bucket_bytes < 1:
        raise ValueError(f"weight sync: bucket_bytes must be >= 1, got {bucket_bytes}")
    pending: list[tuple[str, torch.Tensor]] = []
    size, index = 0, 0
    for name, tensor in tensors:
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        n = _aligned(t.numel() * t.element_size())
        if pending and size + n > bucket_bytes:
            yield _build(pending, version, index)
            pending, size, index = [], 0, index + 1
        pending.append((name, t))
        size += n
    if pending:
        yield _build(pending, version, index)


def _build(items: list[tuple[str, torch.Tensor]], version: int, index: int) -> Bucket:
    entries, offset = [], 0
    for name, t in items:
        nbytes = t.numel() * t.element_size()
        entries.append(TensorEntry(name, _dtype_name(t.dtype), tuple(t.shape), offset, nbytes))
        offset = _aligned(offset + nbytes)
    data = torch.zeros(offset, dtype=torch.uint8, device=items[0][1].device)
    for e, (_, t) in zip(entries, items, strict=True):
        # The tensor's own bytes: a bit-exact copy whatever the dtype (no numeric conversion here).
        data[e.offset : e.offset + e.nbytes].copy_(t.contiguous().reshape(-1).view(torch.uint8))
    return Bucket(BucketManifest(version, index, offset, tuple(entries)), data)


def unpack_bucket(manifest: BucketManifest, data: torch.Tensor) -> dict[str, torch.Tensor]:
    """The tensors of one bucket as views of ``data`` ``[manifest.nbytes]`` (uint8); the caller copies
    them if ``data`` is reused (the engines copy into their parameters anyway)."""
    if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() != manifest.nbytes:
        raise ValueError(
            f"weight sync: bucket {manifest.index} of version {manifest.version} is {data.dtype} "
            f"{list(data.shape)}, the manifest says uint8 [{manifest.nbytes}]"
        )
    out = {}
    for e in manifest.entries:
        out[e.name] = data[e.offset : e.offset + e.nbytes].view(DTYPES[e.dtype]).view(e.shape)
    return out


def unpack_all(buckets: Iterable[tuple[BucketManifest, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every bucket of one version into one HF state dict; a name twice, or two versions, is an error."""
    out: dict[str, torch.Tensor] = {}
    versions: set[int] = set()
    for manifest, data in buckets:
        versions.add(manifest.version)
        part = unpack_bucket(manifest, data)
        if twice := sorted(set(part) & set(out)):
            raise ValueError(f"weight sync: tensors {twice[:5]} arrive in two buckets of version {manifest.version}")
        out |= part
    if len(versions) > 1:
        raise ValueError(f"weight sync: buckets of versions {sorted(versions)} mixed in one state dict")
    return out


def total_bytes(manifests: Iterable[BucketManifest]) -> int:
    """Payload bytes of a version (the tensors themselves, alignment padding excluded)."""
    return sum(e.nbytes for m in manifests for e in m.entries)
