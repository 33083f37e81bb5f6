"""The caps on a ``spec.task.dataset`` file: what one row, the row count, the file and its decoded rows may
weigh, and how deep a row may nest. A dataset file is data that people download and pass on; a careless
or hostile one must be refused in one line, not take the process down.

The defaults fit real datasets with room to spare and keep one process's copy of the rows (every rollout
worker, the evaluator and the driver's start-up probe each hold the whole dataset) within a few GiB:

- ``maxRowBytes`` 1 MiB (a JSONL line's UTF-8 text without its newline; a Parquet row decoded): a
  32,768-token prompt is about 128 KiB of text (about 4 bytes a token), so 1 MiB holds a long chat
  with tool outputs eight times over, while a row no model can take as a prompt is refused at once.
- ``maxRows`` 1,000,000: GSM8K's and MATH's training splits (about 7,500 rows each) fit more than a
  hundred times; the largest public instruction sets (over ten million rows) must raise it, knowingly.
- ``maxFileBytes`` 1 GiB: a million rows of 1 KiB each; the file is read whole into memory.
- ``maxDecodedBytes`` 2 GiB: what a Parquet file's rows may take once decoded (dictionaries expanded,
  pages decompressed), twice the file cap since Parquet text compresses two to four times. This is the
  cap that stops a *Parquet bomb*: a few KiB of dictionary-encoded pages that repeat one long value a
  million times. It is checked against the file's metadata before any page is decoded, then counted on
  each row group read with its dictionaries kept (so a repeated value costs its bytes once), and only
  rows under every cap are turned into Python values.
- ``maxDepth`` 64 levels of ``[ ]`` / ``{ }`` (the row object is level 1; a chat prompt is 3 or 4):
  checked on the text before it is parsed, without recursion. The ceiling (256) stays far below Python's
  recursion limit (1000), against which ``json`` and the reward-service client recurse.

Python values take more room than their text: a row of many small numbers costs several times its
bytes as Python objects. The caps bound the text and the decoded columns, not that factor.
"""

from dataclasses import dataclass

KIB = 2**10
MIB = 2**20
GIB = 2**30

DEFAULT_MAX_ROW_BYTES = 1 * MIB
DEFAULT_MAX_ROWS = 1_000_000
DEFAULT_MAX_FILE_BYTES = 1 * GIB
DEFAULT_MAX_DECODED_BYTES = 2 * GIB
DEFAULT_MAX_DEPTH = 64

# Ceilings of the fields (the spec refuses more): past these a dataset belongs in a data loader of its own.
CEILING_ROW_BYTES = 256 * MIB
CEILING_ROWS = 1_000_000_000
CEILING_FILE_BYTES = 1024 * GIB
CEILING_DECODED_BYTES = 1024 * GIB
CEILING_DEPTH = 256

# A Parquet footer (the file's metadata, one entry per row group and column) larger than this is refused
# before it is parsed: a thousand row groups of a hundred columns take a few MiB.
PARQUET_FOOTER_MAX_BYTES = 64 * MIB


@dataclass(frozen=True)
class ReadLimits:
    """The caps one read of a dataset file applies (``DatasetSpec.limits``); the defaults are the spec's."""

    row_bytes: int = DEFAULT_MAX_ROW_BYTES
    rows: int = DEFAULT_MAX_ROWS
    file_bytes: int = DEFAULT_MAX_FILE_BYTES
    decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES
    depth: int = DEFAULT_MAX_DEPTH


def size_text(n: int) -> str:
    """``n`` bytes for a message: ``1 MiB``, ``1.5 GiB``, ``832 bytes``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} bytes"
