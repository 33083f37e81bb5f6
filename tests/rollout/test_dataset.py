"""Datasets (rollout/envs/dataset.py): JSONL and Parquet rows, their checks, the held-out split, the
seeded order and each worker's cursor over it."""

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.api.dataset import DatasetSpec
from asyncrl.rollout.envs.dataset import (
    DatasetError,
    DatasetSamples,
    is_heldout,
    load_dataset,
    prompt_messages,
    row_id,
)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(n: int) -> list[dict[str, Any]]:
    return [{"question": f"What is {i}+{i}?", "answer": 2 * i, "level": i % 3} for i in range(n)]


def spec(path: Path, **kw: Any) -> DatasetSpec:
    return DatasetSpec.model_validate({"path": str(path), "promptField": "question", **kw})


def test_jsonl_and_parquet_give_the_same_rows_and_split(tmp_path: Path) -> None:
    rows = qa_rows(200)
    jsonl = write_jsonl(tmp_path / "qa.jsonl", rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "qa.parquet")
    a, b = load_dataset(spec(jsonl)), load_dataset(spec(tmp_path / "qa.parquet"))
    assert list(a.rows) == rows and list(b.rows) == rows
    assert a.train == b.train and a.heldout == b.heldout
    assert a.messages(rows[3]) == [{"role": "user", "content": "What is 3+3?"}]
    assert a.answer(rows[3]) == 6


def test_prompt_as_chat_messages_and_the_system_prompt(tmp_path: Path) -> None:
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": "x"},
            {"prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "yo"}], "answer": "y"},
            {"prompt": "plain", "answer": "z"}]
    ds = load_dataset(DatasetSpec(path=str(write_jsonl(tmp_path / "c.jsonl", rows)), system_prompt="Be brief."))
    assert ds.messages(rows[0]) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert ds.messages(rows[1])[0] == {"role": "system", "content": "own"}  # a prompt's own system message wins
    assert ds.messages(rows[2])[-1] == {"role": "user", "content": "plain"}


def test_missing_file_names_it_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as info:
        load_dataset(DatasetSpec(path=str(tmp_path / "nope.jsonl")))
    (msg,) = info.value.problems
    assert "spec.task.dataset.path" in msg and "nope.jsonl: no such file" in msg and "give an existing" in msg


def test_unknown_suffix_asks_for_the_format(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("a\n")
    with pytest.raises(DatasetError, match="set spec.task.dataset.format to jsonl or parquet"):
        load_dataset(DatasetSpec(path=str(tmp_path / "d.csv")))
    rows = load_dataset(DatasetSpec(path=str(write_jsonl(tmp_path / "d.txt", [{"prompt": "p", "answer": 1}])),
                                    format="jsonl")).rows
    assert rows == [{"prompt": "p", "answer": 1}]


def test_every_bad_line_and_row_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "a", "answer": 1}\n\n{not json\n[1, 2]\n{"prompt": "b", "answer": 2}\n')
    with pytest.raises(DatasetError) as info:
        load_dataset(DatasetSpec(path=str(path)))
    problems = info.value.problems
    assert len(problems) == 2, problems
    assert f"{path}:3: not JSON" in problems[0]  # the line number (blank line 2 counted)
    assert f"{path}:4: a row must be a JSON object" in problems[1]

    path.write_text('{"prompt": "a", "answer": 1}\n{"prompt": 5, "answer": 2}\n{"answer": 3}\n'
                    '{"prompt": [{"role": "robot", "content": "x"}], "answer": 4}\n')
    with pytest.raises(DatasetError) as info:
        load_dataset(DatasetSpec(path=str(path)))
    text = str(info.value)
    assert f"1 of 4 rows lack the field 'prompt' (spec.task.dataset.promptField): {path}:3" in text
    assert f"{path}:2: 'prompt': a prompt is a string or a list of chat messages, got int" in text
    assert f"{path}:4: 'prompt': message 0 has role 'robot'" in text


def test_a_field_no_row_has_lists_the_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    with pytest.raises(DatasetError) as info:
        load_dataset(DatasetSpec(path=str(path), answer_field="solution"))  # promptField 'prompt' is wrong too
    text = str(info.value)
    assert "no row has the field 'prompt' (spec.task.dataset.promptField)" in text
    assert "no row has the field 'solution' (spec.task.dataset.answerField)" in text
    assert "'answer', 'level', 'question': set spec.task.dataset.answerField to one of them" in text


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1 but not really")
    with pytest.raises(DatasetError, match=r"x.parquet: not a readable Parquet file"):
        load_dataset(DatasetSpec(path=str(tmp_path / "x.parquet")))


def test_empty_and_all_held_out_datasets_are_refused(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DatasetError, match="has no rows"):
        load_dataset(DatasetSpec(path=str(tmp_path / "e.jsonl")))
    one = write_jsonl(tmp_path / "one.jsonl", [{"prompt": "p", "answer": 1}])
    # find a fraction that holds this one row out: its bucket + 1 (10,000 buckets)
    frac = 0.95
    if not is_heldout("p", frac):
        pytest.fail("row 'p' falls in the top 5% of buckets; pick another prompt for this test")
    with pytest.raises(DatasetError, match="all 1 rows are held out"):
        load_dataset(DatasetSpec(path=str(one), heldout_fraction=frac))


# ----------------------------------------------------------------------------- the held-out split
def test_split_is_disjoint_stable_and_about_the_fraction(tmp_path: Path) -> None:
    rows = qa_rows(2000)
    a = load_dataset(spec(write_jsonl(tmp_path / "a.jsonl", rows)))
    assert set(a.train) & set(a.heldout) == set() and len(a.train) + len(a.heldout) == 2000
    # 2000 rows at 0.1: sd sqrt(2000 * 0.1 * 0.9) = 13.4 rows, so 200 +- 54 (4 sd)
    assert 146 <= len(a.heldout) <= 254, len(a.heldout)
    # the split is a property of each row: reversed file, other seeds, no shuffle -> the same held-out prompts
    b = load_dataset(spec(write_jsonl(tmp_path / "b.jsonl", rows[::-1]), seed=7, shuffle=False))
    held = {rows[i]["question"] for i in a.heldout}
    assert {b.rows[i]["question"] for i in b.heldout} == held
    # the same prompt twice is on one side only (no held-out prompt is ever trained on)
    c = load_dataset(spec(write_jsonl(tmp_path / "c.jsonl", rows + rows[:50])))
    train_q = {c.rows[i]["question"] for i in c.train}
    assert train_q.isdisjoint({c.rows[i]["question"] for i in c.heldout})


def test_id_field_decides_the_split(tmp_path: Path) -> None:
    rows = [{"id": f"r{i}", "question": "same prompt", "answer": i} for i in range(400)]
    ds = load_dataset(spec(write_jsonl(tmp_path / "d.jsonl", rows), idField="id"))
    assert ds.heldout and ds.train  # without idField the one prompt would put every row on one side
    assert all(is_heldout(f"r{i}", 0.1) for i in ds.heldout)
    assert row_id(rows[0], ds.spec) == "r0"


def test_heldout_samples_are_held_out_rows_the_same_every_time(tmp_path: Path) -> None:
    ds = load_dataset(spec(write_jsonl(tmp_path / "d.jsonl", qa_rows(300))))
    samples = DatasetSamples(ds, workers=2, seed=0)
    first = samples.heldout(len(ds.heldout) + 5, seed=3)
    assert first == DatasetSamples(ds, workers=3, seed=9).heldout(len(ds.heldout) + 5, seed=3)
    held = [ds.rows[i] for i in ds.heldout]
    assert all(s in held for s in first)
    assert sorted(map(str, first[: len(held)])) == sorted(map(str, held))  # each once before repeating
    assert first[len(held):] == first[:5]
    assert samples.heldout(4, seed=4) != samples.heldout(4, seed=3)


def test_no_heldout_rows_with_eval_is_an_error(tmp_path: Path) -> None:
    ds = load_dataset(spec(write_jsonl(tmp_path / "d.jsonl", qa_rows(10)), heldoutFraction=0.0))
    assert not ds.heldout
    with pytest.raises(DatasetError, match="raise heldoutFraction, add rows, or set spec.eval.everySteps to 0"):
        DatasetSamples(ds, workers=1, seed=0).heldout(4, seed=0)


# ----------------------------------------------------------------------------- order and cursors
def _stream(samples: DatasetSamples, worker: int, start: int, n: int) -> list[str]:
    rng = random.Random(0)
    return [samples.train(worker, k, rng)["question"] for k in range(start, start + n)]


def test_shuffle_is_seeded_and_every_epoch_visits_each_training_row_once(tmp_path: Path) -> None:
    ds = load_dataset(spec(write_jsonl(tmp_path / "d.jsonl", qa_rows(101))))
    n = len(ds.train)
    s = DatasetSamples(ds, workers=1, seed=5)
    epoch0, epoch1 = _stream(s, 0, 0, n), _stream(s, 0, n, n)
    train_q = sorted(ds.rows[i]["question"] for i in ds.train)
    assert sorted(epoch0) == train_q and sorted(epoch1) == train_q
    assert epoch0 != epoch1  # a fresh order every epoch
    assert epoch0 == _stream(DatasetSamples(ds, workers=1, seed=5), 0, 0, n)  # same seed, same order
    assert epoch0 != _stream(DatasetSamples(ds, workers=1, seed=6), 0, 0, n)
    no_shuffle = load_dataset(spec(ds.spec.path, shuffle=False))
    assert _stream(DatasetSamples(no_shuffle, workers=1, seed=5), 0, 0, n) == [
        ds.rows[i]["question"] for i in ds.train]


def test_workers_interleave_and_a_resumed_cursor_replays_no_prompt(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(120))
    ds = load_dataset(spec(path))
    n, W = len(ds.train), 3
    run = DatasetSamples(ds, workers=W, seed=1)
    # an epoch of n groups shared by 3 workers: worker w takes positions w, w+3, ... -> disjoint rows
    per_worker = {w: _stream(run, w, 0, n // W) for w in range(W)}
    drawn = [q for w in range(W) for q in per_worker[w]]
    assert len(drawn) == len(set(drawn)) == W * (n // W)
    # "checkpoint" each worker's cursor after 7 groups, then resume in a fresh process's objects
    cursor = 7
    resumed = DatasetSamples(load_dataset(spec(path)), workers=W, seed=1)
    for w in range(W):
        before, after = per_worker[w][:cursor], _stream(resumed, w, cursor, n // W - cursor)
        assert after == per_worker[w][cursor:]  # the uninterrupted stream, continued
        assert set(before).isdisjoint(after)  # nothing drawn before the checkpoint comes again this epoch


def test_prompt_messages_refuses_what_is_not_a_conversation() -> None:
    with pytest.raises(ValueError, match="the message list is empty"):
        prompt_messages([])
    with pytest.raises(ValueError, match="message 1 has no string content"):
        prompt_messages([{"role": "user", "content": "a"}, {"role": "user", "content": 3}])
    with pytest.raises(ValueError, match="got dict"):
        prompt_messages({"role": "user", "content": "a"})


def test_the_dataset_reader_knows_the_interfaces_roles() -> None:
    from asyncrl.api.dataset_file import MESSAGE_ROLES
    from asyncrl.rollout.envs.interface import ROLES

    assert MESSAGE_ROLES == ROLES  # api/ cannot import rollout/, so the reader keeps its own copy


def test_asyncrl_validate_checks_a_dataset_it_can_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.trainer.cli import main

    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "qa.jsonl", qa_rows(3))
    job = ("apiVersion: asyncrl.io/v1alpha1\nkind: AsyncRLJob\nmetadata: {name: ds}\nspec:\n  task:\n"
           "    dataset: {path: %s, answerField: solution}\n    reward: m:f\n")
    (tmp_path / "bad.yaml").write_text(job % "qa.jsonl")
    assert main(["validate", "bad.yaml"]) == 1
    err = capsys.readouterr().err
    assert "bad.yaml: qa.jsonl: no row has the field 'prompt' (spec.task.dataset.promptField)" in err
    assert "no row has the field 'solution'" in err
    (tmp_path / "elsewhere.yaml").write_text(job % "/data/in-the-volume.jsonl")
    assert main(["validate", "elsewhere.yaml"]) == 0  # not readable here: checked when the job starts
    both = capsys.readouterr()
    assert "warning: spec.task.dataset.path: /data/in-the-volume.jsonl: no such file here" in both.err
    assert "AsyncRLJob ds is valid" in both.out
    assert main(["validate", "--local", "elsewhere.yaml"]) == 1  # for a run on this machine: an error
    assert "/data/in-the-volume.jsonl: no such file; give an existing JSONL" in capsys.readouterr().err


def test_docs_tasks_name_every_dataset_and_reward_service_field() -> None:
    from asyncrl.api.dataset import RewardServiceSpec
    from tests.support.helpers import ROOT

    text = (ROOT / "docs" / "tasks.md").read_text()
    for model in (DatasetSpec, RewardServiceSpec):
        missing = [f.alias for f in model.model_fields.values() if f"`{f.alias}`" not in text
                   and f"{f.alias}:" not in text]
        assert missing == [], f"docs/tasks.md does not explain {model.__name__} fields {missing}"
