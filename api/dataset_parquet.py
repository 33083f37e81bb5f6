"""Reading a Parquet dataset file within its caps, so that a small file cannot decode to more than it may.

The order (each step refuses in one line naming the file, the cap, the field and the fix):

1. the footer: its length, read from the file's last 8 bytes, at most ``PARQUET_FOOTER_MAX_BYTES`` before
   Arrow parses it;
2. the metadata, before any page is decoded: the row count (``maxRows``), the nesting of the columns
   (``maxDepth``), and the bytes the column chunks declare, each chunk at least its values times their
   width (``maxDecodedBytes``);
3. the rows, a row group at a time, read with every string and binary column *dictionary-encoded* (a
   value repeated a million times is held once): each row's decoded size is computed from the buffers
   (:func:`value_bytes`, dictionary values counted at every use) against ``maxRowBytes``, their running sum
   against ``maxDecodedBytes`` (the refusal names the first row past it);
4. only when every row group passed, the rows become Python values, a slice at a time (decoded, then
   converted: the extra memory is one slice, ``SLICE_BYTES`` or one row).

A *Parquet bomb* (a dictionary page holding one long value, and data pages that repeat its index) is so
refused in step 3 while it still weighs what it weighs on disk. Not checked: a file whose page headers
state more than its metadata declares (Arrow decompresses what a page header says, up to 2 GiB a page).
"""

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from asyncrl.api.dataset_limits import PARQUET_FOOTER_MAX_BYTES, ReadLimits, size_text
from asyncrl.api.dataset_problems import FIELD, DatasetError, Problems

BATCH_ROWS = 4096  # rows turned into Python values at a time, at most ...
SLICE_BYTES = 64 * 2**20  # ... and at most this many bytes of them decoded (or one row): the extra memory
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8, "BYTE_ARRAY": 4}
_NESTED = (pa.ListType, pa.LargeListType, pa.FixedSizeListType, pa.StructType, pa.MapType)


def _unreadable(path: str, why: object) -> DatasetError:
    return DatasetError([f"{path}: not a readable Parquet file ({why}); write it with pyarrow.parquet.write_table "
                         f"or set {FIELD}.format"])


def check_footer(path: Path) -> None:
    """Refuse a file whose footer is not Parquet's or is longer than ``PARQUET_FOOTER_MAX_BYTES``."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        f.seek(max(0, size - 8))
        tail = f.read(8)
    if len(tail) < 8 or tail[4:] not in (b"PAR1", b"PARE"):
        raise _unreadable(str(path), "it does not end in the Parquet magic bytes PAR1")
    if tail[4:] == b"PARE":
        raise DatasetError([f"{path}: an encrypted Parquet file; write it unencrypted (no key reaches the job)"])
    (footer,) = struct.unpack("<I", tail[:4])
    if footer > PARQUET_FOOTER_MAX_BYTES:
        raise DatasetError([f"{path}: its metadata (footer) is {size_text(footer)}, more than "
                            f"{size_text(PARQUET_FOOTER_MAX_BYTES)}; write fewer row groups or columns"])


def type_depth(t: pa.DataType) -> int:
    """Levels of lists, structs and maps in ``t`` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(t, 0)]
    while stack:
        t, depth = stack.pop()
        if isinstance(t, pa.DictionaryType):
            stack.append((t.value_type, depth))
        elif isinstance(t, pa.ExtensionType):
            stack.append((t.storage_type, depth))
        elif isinstance(t, _NESTED):
            stack.extend((t.field(i).type, depth + 1) for i in range(t.num_fields))
            deepest = max(deepest, depth + 1)
    return deepest


def declared_bytes(md: pq.FileMetaData) -> int:
    """The bytes the file's column chunks declare decoded: each chunk's uncompressed size, at least its values
    times their width (a run of equal numbers compresses to nothing but decodes to its width each)."""
    total = 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            total += max(col.total_uncompressed_size, col.num_values * _WIDTH.get(col.physical_type, 1))
    return total


def check_metadata(path: str, pf: pq.ParquetFile, limits: ReadLimits) -> None:
    """Refuse, from the metadata alone, a file with too many rows, too deep columns or too many declared bytes."""
    md, found = pf.metadata, []
    if md.num_rows > limits.rows:
        found.append(f"{path}: {md.num_rows} rows, more than {FIELD}.maxRows = {limits.rows}; split the file or "
                     f"raise {FIELD}.maxRows")
    for f in pf.schema_arrow:
        if (depth := 1 + type_depth(f.type)) > limits.depth:
            found.append(f"{path}: column {f.name!r} nests {depth} levels (the row is 1; more than {FIELD}.maxDepth "
                         f"= {limits.depth}); flatten it or raise {FIELD}.maxDepth (at most 256)")
    if (declared := declared_bytes(md)) > limits.decoded_bytes:
        found.append(f"{path}: its row groups declare {declared} bytes decoded ({size_text(declared)}), more than "
                     f"{FIELD}.maxDecodedBytes = {limits.decoded_bytes} ({size_text(limits.decoded_bytes)}); split "
                     f"the file or raise {FIELD}.maxDecodedBytes")
    if found:
        raise DatasetError(found)


def value_bytes(arr: pa.Array) -> np.ndarray:
    """``[len(arr)]`` int64: the bytes each value of ``arr`` takes decoded (dictionaries expanded): its payload
    plus the offset or width Arrow gives it. Recursion follows the type, whose depth the metadata check bounds."""
    n, t = len(arr), arr.type
    if isinstance(arr, pa.DictionaryArray):
        sizes = value_bytes(arr.dictionary)
        index = pc.fill_null(arr.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        used = sizes[index] if len(sizes) else np.zeros(n, np.int64)
        return np.where(arr.is_null().to_numpy(zero_copy_only=False), 0, used)
    if isinstance(arr, pa.ExtensionArray):
        return value_bytes(arr.storage)
    if pa.types.is_binary(t) or pa.types.is_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        offset = 8 if pa.types.is_large_binary(t) or pa.types.is_large_string(t) else 4
        return pc.fill_null(pc.binary_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64) + offset
    if isinstance(arr, pa.ListArray | pa.LargeListArray):  # MapArray is a ListArray of key/item structs
        inner = np.concatenate([[0], np.cumsum(value_bytes(arr.values))])
        offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        return inner[offsets[1:]] - inner[offsets[:-1]] + (8 if isinstance(arr, pa.LargeListArray) else 4)
    if isinstance(arr, pa.FixedSizeListArray):
        size = t.list_size
        inner = value_bytes(arr.values)[arr.offset * size:(arr.offset + n) * size]
        return inner.reshape(n, size).sum(axis=1) if size else np.zeros(n, np.int64)
    if isinstance(arr, pa.StructArray):
        return sum((value_bytes(child) for child in arr.flatten()), np.zeros(n, np.int64))
    try:
        width = max(1, t.bit_width // 8)
    except ValueError:  # a type Parquet does not produce: its buffers, spread evenly
        width = -(-arr.nbytes // max(n, 1))
    return np.full(n, width, np.int64)


def _byte_array_columns(pf: pq.ParquetFile) -> list[str]:
    schema = pf.schema
    return [schema.column(i).path for i in range(len(schema)) if schema.column(i).physical_type == "BYTE_ARRAY"]


def _measured_batches(path: str, pf: pq.ParquetFile, limits: ReadLimits) -> list[tuple[pa.RecordBatch, np.ndarray]]:
    """Every batch of the file, dictionaries kept, with its rows' decoded sizes, when each row and their sum
    are within the caps."""
    batches: list[tuple[pa.RecordBatch, np.ndarray]] = []
    problems = Problems("rows over maxRowBytes")
    start = total = 0
    for batch in _batches(path, pf):
        sizes = sum((value_bytes(c) for c in batch.columns), np.zeros(batch.num_rows, np.int64))
        for i in np.flatnonzero(sizes > limits.row_bytes)[:8]:
            problems.add(f"{path} row {start + i}: {int(sizes[i])} bytes decoded, more than {FIELD}.maxRowBytes = "
                         f"{limits.row_bytes} ({size_text(limits.row_bytes)}); shorten the row or raise "
                         f"{FIELD}.maxRowBytes")
        running = total + np.cumsum(sizes)
        if len(running) and running[-1] > limits.decoded_bytes:
            over = start + int(np.argmax(running > limits.decoded_bytes))  # the first row past the cap
            problems.stop(f"{path}: its rows decode to more than {FIELD}.maxDecodedBytes = {limits.decoded_bytes} "
                          f"({size_text(limits.decoded_bytes)}) by row {over}, from {Path(path).stat().st_size} "
                          f"bytes on disk; split the file or raise {FIELD}.maxDecodedBytes")
            break
        total = int(running[-1]) if len(running) else total
        start += batch.num_rows
        if start > limits.rows:  # the metadata's row count was checked; the pages are what counts
            problems.stop(f"{path}: more than {FIELD}.maxRows = {limits.rows} rows; split the file or raise "
                          f"{FIELD}.maxRows")
            break
        if not problems:
            batches.append((batch, sizes))
    if problems:
        raise DatasetError(problems.lines())
    return batches


def _batches(path: str, pf: pq.ParquetFile) -> Iterator[pa.RecordBatch]:
    """``pf``'s batches; running out of memory (or stack) while decoding one is a refusal naming its first row."""
    # A row group at a time, whole: a batch across two groups would meet two dictionaries, which Arrow
    # cannot join for a nested column ("Nested data conversions not implemented for chunked array outputs"),
    # and smaller batches of one group each copy the group's dictionary (4096-row batches of a 200,000-row
    # group of distinct strings read 5x slower). Kept dictionary-encoded, a group weighs what its pages do.
    groups = range(pf.metadata.num_row_groups)
    batches = (b for g in groups if (n := pf.metadata.row_group(g).num_rows) > 0
               for b in pf.iter_batches(batch_size=n, row_groups=[g], use_threads=False))
    row = 0
    while True:
        try:
            batch = next(batches, None)
        except (MemoryError, RecursionError) as exc:
            raise _exhausted(path, row, exc) from None
        if batch is None:
            return
        row += batch.num_rows
        yield batch


def _exhausted(path: str, row: int, exc: BaseException) -> DatasetError:
    what = "out of memory" if isinstance(exc, MemoryError) else "out of stack (too deeply nested)"
    return DatasetError([f"{path} row {row}: {what} while decoding the file; lower {FIELD}.maxDecodedBytes and "
                         "maxDepth to what the process can hold, split the file, or give the pods more memory"])


def _slices(sizes: np.ndarray) -> Iterator[tuple[int, int]]:
    """``(first row, rows)`` of consecutive slices of a batch whose rows decode to ``sizes`` bytes: each at
    most ``BATCH_ROWS`` rows and ``SLICE_BYTES`` bytes, or a single row."""
    ends = np.cumsum(sizes)
    first = 0
    while first < len(sizes):
        before = int(ends[first - 1]) if first else 0
        last = int(np.searchsorted(ends, before + SLICE_BYTES, side="right"))  # rows [first, last) fit
        last = min(max(last, first + 1), first + BATCH_ROWS)
        yield first, last - first
        first = last


def _python_rows(path: str, batches: list[tuple[pa.RecordBatch, np.ndarray]], schema: pa.Schema,
                 ) -> list[dict[str, Any]]:
    """The rows of ``batches`` as dicts, each batch released once converted. A slice is first cast to the
    file's own ``schema`` (its dictionaries expanded): Arrow turns plain columns into Python values about
    twice as fast as dictionary ones."""
    rows: list[dict[str, Any]] = []
    while batches:
        (batch, sizes), first = batches.pop(0), len(rows)
        try:
            for at, length in _slices(sizes):
                rows.extend(batch.slice(at, length).cast(schema).to_pylist())
        except (MemoryError, RecursionError) as exc:
            at = len(rows)
            rows.clear()  # nothing half-loaded, and the memory back before the message is built
            batches.clear()
            raise _exhausted(path, at, exc) from None
        except UnicodeDecodeError as exc:
            part = batch.slice(len(rows) - first, length)
            bad = next(i for i in range(part.num_rows) if not _decodes(part.slice(i, 1)))
            raise DatasetError([f"{path} row {len(rows) + bad}: a string column holds bytes that are not UTF-8 "
                                f"({exc.reason} at byte {exc.start}); fix the text or write the column as "
                                "binary"]) from None
    return rows


def _decodes(row: pa.RecordBatch) -> bool:
    try:
        row.to_pylist()
    except UnicodeDecodeError:
        return False
    return True


def read_parquet(path: Path, limits: ReadLimits) -> tuple[list[dict[str, Any]], list[str]]:
    """The rows of the Parquet file ``path`` and where each is (``data.parquet row 16``, 0-based), or a
    :class:`DatasetError` from the first step of the module docstring that refuses the file."""
    name = str(path)
    check_footer(path)
    try:
        plain = pq.ParquetFile(path)
        check_metadata(name, plain, limits)
        pf = pq.ParquetFile(path, metadata=plain.metadata, read_dictionary=_byte_array_columns(plain))
        rows = _python_rows(name, _measured_batches(name, pf, limits), plain.schema_arrow)
    except (pa.ArrowException, OSError, IndexError) as exc:
        raise _unreadable(name, exc) from None
    return rows, [f"{name} row {i}" for i in range(len(rows))]
