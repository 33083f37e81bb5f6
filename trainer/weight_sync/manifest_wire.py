"""A bucket manifest on the broadcast wire: JSON, length-capped, checked field by field before use.

The receiver allocates a bucket of the size the manifest names and then views slices of it as tensors,
so every number in it is checked first: the manifest's own length (:data:`MAX_MANIFEST_BYTES`) before
its buffer is allocated, the bucket's size against the receiver's cap (``max_bucket_bytes``, default
:data:`MAX_BUCKET_BYTES`), and each entry against the bucket (a known dtype, its bytes = the product of
its shape times the dtype's size, an aligned offset, inside the bucket, after the previous entry, a new
name). A value that breaks a rule is one :class:`ManifestError` naming the field, the value and the rule.

``null`` is the end-of-version marker (:func:`encode` of None).
"""

import json
import math
from typing import Any

import torch

from asyncrl.trainer.weight_sync.buckets import ALIGN, DTYPES, BucketManifest, TensorEntry

MAX_MANIFEST_BYTES = 4 << 20  # a bucket of a few thousand tensors is ~100 KiB of JSON
MAX_BUCKET_BYTES = 8 << 30  # a tensor larger than the bucket size gets its own bucket (a 128k x 16k bf16 embedding: 4 GiB)
MAX_NAME_CHARS = 1024
MAX_DIMS = 8
_FIELDS = ("version", "index", "nbytes", "entries")


class ManifestError(ValueError):
    """A manifest from the wire that breaks a rule (what the receiver would otherwise allocate or view)."""


def encode(manifest: BucketManifest | None) -> bytes:
    """``manifest`` as compact JSON (``null`` for the end marker)."""
    if manifest is None:
        return b"null"
    body = {"version": manifest.version, "index": manifest.index, "nbytes": manifest.nbytes,
            "entries": [[e.name, e.dtype, list(e.shape), e.offset, e.nbytes] for e in manifest.entries]}
    return json.dumps(body, separators=(",", ":")).encode()


def check_length(n: int) -> int:
    """The manifest length read from the wire, before its buffer is allocated."""
    if not 1 <= n <= MAX_MANIFEST_BYTES:
        raise ManifestError(f"weight sync (broadcast): the source announces a {n}-byte manifest; it must be in "
                            f"[1, {MAX_MANIFEST_BYTES}] (a receiver of another protocol version, or not our source)")
    return n


def decode(raw: bytes, *, max_bucket_bytes: int = MAX_BUCKET_BYTES) -> BucketManifest | None:
    """The manifest (None: the version's end) from ``raw``; :class:`ManifestError` for any broken rule."""
    check_length(len(raw))
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"weight sync (broadcast): the manifest is not JSON ({exc})") from None
    if obj is None:
        return None
    if not isinstance(obj, dict) or sorted(obj) != sorted(_FIELDS):
        got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise ManifestError(f"weight sync (broadcast): the manifest must be an object with {list(_FIELDS)}, got {got}")
    version, index = _count(obj, "version"), _count(obj, "index")
    nbytes = _count(obj, "nbytes")
    where = f"bucket {index} of version {version}"
    if nbytes > max_bucket_bytes:
        raise ManifestError(f"weight sync (broadcast): {where}: nbytes {nbytes} is over this receiver's cap "
                            f"{max_bucket_bytes}")
    entries = obj["entries"]
    if not isinstance(entries, list):
        raise ManifestError(f"weight sync (broadcast): {where}: entries must be a list")
    out: list[TensorEntry] = []
    names: set[str] = set()
    end = 0
    for i, raw_entry in enumerate(entries):
        e = _entry(raw_entry, f"{where}: entries[{i}]")
        if e.name in names:
            raise ManifestError(f"weight sync (broadcast): {where}: entries[{i}].name {e.name!r} appears twice")
        if e.offset < end or e.offset + e.nbytes > nbytes:
            raise ManifestError(f"weight sync (broadcast): {where}: entries[{i}] spans [{e.offset}, "
                                f"{e.offset + e.nbytes}); entries must follow each other inside the bucket's "
                                f"{nbytes} bytes (the previous ends at {end})")
        names.add(e.name)
        end = e.offset + e.nbytes
        out.append(e)
    return BucketManifest(version, index, nbytes, tuple(out))


def _count(obj: dict[str, Any], field: str, where: str = "the manifest") -> int:
    v = obj[field] if isinstance(obj, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ManifestError(f"weight sync (broadcast): {where}: {field} must be an integer >= 0, got {v!r}")
    return v


def _entry(raw: Any, where: str) -> TensorEntry:
    if not isinstance(raw, list) or len(raw) != 5:
        raise ManifestError(f"weight sync (broadcast): {where} must be [name, dtype, shape, offset, nbytes]")
    name, dtype, shape, offset, nbytes = raw
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise ManifestError(f"weight sync (broadcast): {where}.name must be a string of 1-{MAX_NAME_CHARS} characters")
    if dtype not in DTYPES:
        raise ManifestError(f"weight sync (broadcast): {where}.dtype {dtype!r}; valid: {sorted(DTYPES)}")
    if (not isinstance(shape, list) or len(shape) > MAX_DIMS
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise ManifestError(f"weight sync (broadcast): {where}.shape {shape!r} must be a list of at most "
                            f"{MAX_DIMS} integers >= 0")
    fields = {"offset": offset, "nbytes": nbytes}
    off, n = _count(fields, "offset", where), _count(fields, "nbytes", where)
    expected = math.prod(shape) * torch.empty((), dtype=DTYPES[dtype]).element_size()
    if n != expected:
        raise ManifestError(f"weight sync (broadcast): {where} ({name}): nbytes {n} != {dtype} {shape} = {expected}")
    if off % ALIGN:
        raise ManifestError(f"weight sync (broadcast): {where} ({name}): offset {off} is not a multiple of {ALIGN}")
    return TensorEntry(name, dtype, tuple(shape), off, n)
