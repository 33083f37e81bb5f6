"""Hostile and careless dataset files (tests/support/hostile_datasets.py): each is refused in one line naming the
file, the line or row, the rule and the fix, the same by ``asyncrl validate`` and at the job's start, or read
whole with nothing lost. No case may leave a traceback, hang, or load part of a file."""

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.api.dataset import DatasetFormat, DatasetSpec
from asyncrl.api.dataset_file import dataset_problems, read_rows
from asyncrl.api.dataset_limits import DEFAULT_MAX_DECODED_BYTES
from asyncrl.api.dataset_parquet import _slices, declared_bytes
from asyncrl.rollout.envs.dataset import DatasetError, load_dataset
from tests.support.hostile_datasets import HOSTILE_DATASETS, ROW_LINE, HostileDataset, dictionary_bomb, make

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_hang() -> Iterator[None]:
    """A case that blocks (a pipe opened for reading waits for a writer) fails here instead of hanging."""
    def hung(*_: object) -> None:
        raise TimeoutError("reading the dataset blocked for 60 s")
    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def _spec(case: HostileDataset, path: Path) -> DatasetSpec:
    return DatasetSpec.model_validate({"path": str(path), "heldoutFraction": 0.0, **case.spec})


@pytest.mark.parametrize("case", HOSTILE_DATASETS, ids=lambda c: c.id)
def test_a_hostile_dataset_is_refused_in_one_line_or_read_whole(case: HostileDataset, tmp_path: Path) -> None:
    path = make(case, tmp_path / "data")
    spec = _spec(case, path)
    problems = dataset_problems(spec)  # asyncrl validate's check
    if not case.refusal:
        assert problems == []
        assert tuple(load_dataset(spec).rows) == case.rows  # nothing lost, nothing changed
        return
    assert len(problems) == case.lines, problems
    assert any(case.refusal in line for line in problems), problems
    for line in problems:
        assert "\n" not in line and len(line) < 400, line
        assert str(path) in line or line.startswith("... and "), line
    with pytest.raises(DatasetError) as info:  # the job's start: the same words
        load_dataset(spec)
    assert info.value.problems == problems


def test_the_bomb_is_small_on_disk_and_refused_before_its_rows_are_python_values(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    pq.write_table(dictionary_bomb(20_000, 200_000), path, compression="zstd")
    # what the metadata declares is what the pages hold: the dictionary once, 20,000 indices in one run
    declared = declared_bytes(pq.ParquetFile(path).metadata)
    assert path.stat().st_size < 4096 and declared < 2**20 < DEFAULT_MAX_DECODED_BYTES
    # it is the count of the decoded rows that refuses it: under a cap of 10 rows' bytes (200,012 each),
    # row 10 is the first past it
    (problem,) = dataset_problems(DatasetSpec(path=str(path), maxDecodedBytes=200_012 * 10))
    assert "by row 10," in problem


def test_a_dataset_just_under_every_cap_is_read_whole(tmp_path: Path) -> None:
    # 3 rows of 39 bytes (+ newline) = 120 bytes: maxRowBytes 39, maxRows 3, maxFileBytes 120 all hold
    path = tmp_path / "d.jsonl"
    path.write_text((ROW_LINE + "\n") * 3)
    spec = DatasetSpec(path=str(path), maxRowBytes=39, maxRows=3, maxFileBytes=120, heldoutFraction=0.0)
    assert dataset_problems(spec) == [] and len(load_dataset(spec).rows) == 3
    # one byte or row less: every line is then too long, the fourth row or the 120th byte too many
    for field, cap, refused in (("maxRowBytes", 38, 3), ("maxRows", 2, 1), ("maxFileBytes", 119, 1)):
        problems = dataset_problems(DatasetSpec.model_validate({**spec.to_spec_dict(), field: cap}))
        assert len(problems) == refused and all(f"spec.task.dataset.{field} = {cap}" in p for p in problems)


def test_a_parquet_file_under_the_caps_gives_the_rows_it_holds(tmp_path: Path) -> None:
    # dictionary-read columns, nested lists and structs, maps and nulls come back as plain Python values
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": i, "tags": {"k": "v"} if i else None,
             "meta": [("a", i)]} for i in range(5000)]
    schema = pa.schema([("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                        ("answer", pa.int64()), ("tags", pa.struct([("k", pa.string())])),
                        ("meta", pa.map_(pa.string(), pa.int64()))])
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=3000)  # 2 groups, 2 batches
    read, where = read_rows(path, DatasetFormat.PARQUET)
    assert read == rows and where[4999] == f"{path} row 4999"


def test_validate_prints_the_refusal_of_a_bomb_and_a_deep_row_one_line_each(tmp_path: Path) -> None:
    bomb, deep = tmp_path / "bomb.parquet", tmp_path / "deep.jsonl"
    pq.write_table(dictionary_bomb(20_000, 200_000), bomb, compression="zstd")
    deep.write_text('{"prompt": "p", "answer": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    jobs = []
    for data in (bomb, deep):
        job = tmp_path / f"{data.stem}.yaml"
        job.write_text(f"apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {{name: {data.stem}}}\n"
                       f"spec: {{task: {{dataset: {{path: {data}}}, reward: 'my_reward:score'}}}}\n")
        jobs.append(job)
    run = subprocess.run([sys.executable, "-c", "import sys; from asyncrl.trainer.cli import main; "
                          "sys.exit(main(sys.argv[1:]))", "validate", *map(str, jobs)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{jobs[0]}: {bomb}: its rows decode to more than spec.task.dataset.maxDecodedBytes")
    assert lines[1].startswith(f"{jobs[1]}: {deep}:1: the row nests 100001 levels")


def test_running_out_of_memory_is_a_refusal_naming_the_line(tmp_path: Path) -> None:
    # A real MemoryError: a child process whose address space ends 64 MiB past what it uses reads a 160 MiB
    # line (the cap raised to allow it); the line cannot be held, and the refusal names it.
    path = tmp_path / "d.jsonl"
    with open(path, "w") as f:
        f.write(ROW_LINE + "\n")
        f.write('{"prompt": "' + "x" * (160 * 2**20) + '", "answer": 1}\n')
    code = f"""
import resource, sys
from asyncrl.api.dataset import DatasetSpec
from asyncrl.api.dataset_file import local_check
used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + 64 * 2**20, resource.RLIM_INFINITY))
problems, _ = local_check(DatasetSpec(path={str(path)!r}, maxRowBytes=2**28))
print("\\n".join(problems))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr
    (line,) = run.stdout.strip().splitlines()
    assert line.startswith(f"{path}:2: out of memory while reading the file"), line


def test_rows_become_python_values_in_slices_of_bounded_bytes() -> None:
    mib = 2**20
    # ends at 30, 60, 90, 190, 191 MiB: [0, 2) fits 64 MiB; [2, 3) reaches 90 (a third would make 190);
    # row 3 alone is over 64 MiB (100 MiB): a slice of its own; then row 4
    sizes = np.array([30, 30, 30, 100, 1]) * mib
    assert list(_slices(sizes)) == [(0, 2), (2, 1), (3, 1), (4, 1)]
    assert list(_slices(np.ones(5000, np.int64))) == [(0, 4096), (4096, 904)]  # BATCH_ROWS rows at most
    assert list(_slices(np.zeros(0, np.int64))) == []
