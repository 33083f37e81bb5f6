"""Datasets (``spec.task.dataset``): rows of a JSONL or Parquet file as the samples of a job.

Reading order: the file is read within its caps (``maxRowBytes``, ``maxRows``, ``maxFileBytes``,
``maxDecodedBytes``, ``maxDepth``: ``asyncrl.api.dataset_limits``) and every row checked at once
(:func:`load_dataset`, all problems reported together with the file, the row and the fix; a refused file
leaves nothing loaded); the rows are split into train and held-out
sides by a keyed hash of each row's id (:func:`is_heldout`); :class:`DatasetSamples` hands a rollout
worker the sample of its group ``k`` (the :class:`~asyncrl.rollout.envs.interface.SampleSource` of a
dataset job).

The held-out split is a property of the row, not of its position: the id is ``idField``'s value, or
the prompt's content (canonical JSON), hashed with a fixed key into ``BUCKETS`` buckets; a row is
held out when its bucket is below ``heldoutFraction * BUCKETS``. It is the same in every process,
run and resume, whatever the seed, and survives reordering or appending rows to the file; rows
with the same prompt are always on the same side, so no held-out prompt is ever trained on.

The training order: rollout worker ``w`` of ``W`` takes, for its group ``k`` (its prompt cursor),
position ``p = k * W + w`` of an endless stream made of epochs over the training rows, each epoch a
fresh seeded permutation (or file order when ``shuffle`` is false). Positions of different
``(w, k)`` differ, so within an epoch no row is drawn twice; the driver checkpoints every worker's
cursor, so a resumed run continues each worker's stream and replays no prompt.
"""

import functools
import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.api.dataset import DatasetSpec
from asyncrl.api.dataset_file import (
    FIELD,
    DatasetError,
    check_rows,
    dataset_format,
    prompt_messages,
    read_rows,
)
from asyncrl.rollout.envs.interface import Message, Sample

BUCKETS = 10_000
_KEY = b"asyncrl-dataset-heldout-v1"  # changing it moves every row: a new split
__all__ = ["BUCKETS", "Dataset", "DatasetError", "DatasetSamples", "is_heldout", "load_dataset",
           "prompt_messages", "row_id", "summary"]


def row_id(row: Mapping[str, Any], spec: DatasetSpec) -> str:
    """The id that decides a row's side of the split: ``idField``'s value, else the prompt's content."""
    value = row[spec.id_field] if spec.id_field is not None else row[spec.prompt_field]
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def is_heldout(key: str, fraction: float) -> bool:
    """True when the row with id ``key`` is in the held-out share ``fraction`` (see the module docstring)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, key=_KEY).digest()
    return int.from_bytes(digest, "big") % BUCKETS < round(fraction * BUCKETS)


# ----------------------------------------------------------------------------- the dataset
@dataclass(frozen=True)
class Dataset:
    """A checked dataset and its split: ``train`` and ``heldout`` are row numbers (0-based, file order)."""

    spec: DatasetSpec
    rows: Sequence[dict[str, Any]]
    train: tuple[int, ...]
    heldout: tuple[int, ...]

    def messages(self, row: Mapping[str, Any]) -> list[Message]:
        """The prompt messages of ``row`` (``systemPrompt`` first when set)."""
        return prompt_messages(row[self.spec.prompt_field], self.spec.system_prompt)

    def answer(self, row: Mapping[str, Any]) -> Any:
        """The answer ``row`` hands the environment and the reward (None without ``answerField``)."""
        return None if self.spec.answer_field is None else row[self.spec.answer_field]


def load_dataset(spec: DatasetSpec) -> Dataset:
    """Read ``spec.path``, check every row and split them; a :class:`DatasetError` lists all problems.

    Read once per process: a rollout worker, the evaluator and the startup probe each bind the task,
    so the checked dataset is cached by the file (resolved path, size, modification time) and the
    spec; a file changed in between is read again. Rows are shared: samples hand out copies."""
    path = Path(spec.path)
    try:
        st = path.resolve().stat()
    except (OSError, RuntimeError):  # missing, unreadable, a symlink loop: read_rows says which, with the fix
        return _load_dataset(spec)
    return _cached_dataset(str(path.resolve()), st.st_size, st.st_mtime_ns, spec.model_dump_json())


@functools.lru_cache(maxsize=4)
def _cached_dataset(resolved: str, size: int, mtime_ns: int, spec_json: str) -> Dataset:
    # (a DatasetError is not cached: lru_cache keeps only returned values)
    return _load_dataset(DatasetSpec.model_validate_json(spec_json))


def _load_dataset(spec: DatasetSpec) -> Dataset:
    rows, where = read_rows(spec.path, dataset_format(spec), spec.limits)
    problems = check_rows(rows, where, spec, spec.path)
    if problems:
        raise DatasetError(problems)
    train: list[int] = []
    heldout: list[int] = []
    for i, r in enumerate(rows):
        (heldout if is_heldout(row_id(r, spec), spec.heldout_fraction) else train).append(i)
    if not train:
        raise DatasetError([f"{spec.path}: all {len(rows)} rows are held out for evaluation "
                            f"({FIELD}.heldoutFraction={spec.heldout_fraction}); lower heldoutFraction or add rows"])
    return Dataset(spec, rows, tuple(train), tuple(heldout))


@dataclass
class DatasetSamples:
    """The :class:`~asyncrl.rollout.envs.interface.SampleSource` of a dataset job.

    ``workers``: the job's rollout workers (``spec.rollout.replicas``); ``seed``: the shuffle seed
    (``dataset.seed``, else ``spec.train.seed``). A sample is a copy of its row (the user's code may
    change it freely).
    """

    dataset: Dataset
    workers: int
    seed: int
    _orders: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"DatasetSamples: workers must be >= 1, got {self.workers}")

    def order(self, epoch: int) -> tuple[int, ...]:
        """The training rows in the order of ``epoch`` (a permutation of ``dataset.train``)."""
        if epoch not in self._orders:
            rows = list(self.dataset.train)
            if self.dataset.spec.shuffle:
                # A str seed goes through SHA-512: the same permutation in every process.
                random.Random(f"asyncrl-dataset-order:{self.seed}:{epoch}").shuffle(rows)
            if len(self._orders) >= 2:  # workers move forward: keep the current and the next epoch
                self._orders.pop(min(self._orders))
            self._orders[epoch] = tuple(rows)
        return self._orders[epoch]

    def row_index(self, worker: int, index: int) -> int:
        """The row number of group ``index`` of rollout worker ``worker``."""
        if not 0 <= worker < self.workers or index < 0:
            raise ValueError(f"DatasetSamples: worker {worker} of {self.workers}, group {index}: out of range")
        epoch, at = divmod(index * self.workers + worker, len(self.dataset.train))
        return self.order(epoch)[at]

    def train(self, worker: int, index: int, rng: random.Random) -> Sample:
        """The row of group ``index`` of ``worker`` (``rng`` is unused: the cursor decides)."""
        return dict(self.dataset.rows[self.row_index(worker, index)])

    def heldout(self, n: int, seed: int) -> list[Sample]:
        """``n`` held-out rows in an order drawn from ``seed`` (the same list every time); with fewer
        held-out rows than ``n`` the order repeats, so each row is evaluated about equally often."""
        ids = list(self.dataset.heldout)
        if n > 0 and not ids:
            raise DatasetError([
                f"{self.dataset.spec.path}: none of its {len(self.dataset.rows)} rows is held out "
                f"({FIELD}.heldoutFraction={self.dataset.spec.heldout_fraction}), so spec.eval has nothing to "
                "evaluate; raise heldoutFraction, add rows, or set spec.eval.everySteps to 0"
            ])
        random.Random(f"asyncrl-dataset-heldout:{seed}").shuffle(ids)
        return [dict(self.dataset.rows[ids[i % len(ids)]]) for i in range(n)]


def summary(dataset: Dataset) -> dict[str, Any]:
    """Plain-data description for logs and the run summary."""
    n = len(dataset.rows)
    return {"path": dataset.spec.path, "rows": n, "train": len(dataset.train), "heldout": len(dataset.heldout),
            "heldout_share": round(len(dataset.heldout) / n, 4) if n else math.nan}
