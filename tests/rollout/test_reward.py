"""Reward functions by import path (rollout/envs/reward.py) and the single-turn dataset environment.

The reward module lives in tests/rollout/userland and is imported by path, as a user's would
(``spec.task.pythonPath`` + ``spec.task.reward``)."""

import json
import math
import sys
from pathlib import Path

import pytest

from asyncrl.api.dataset import DatasetSpec
from asyncrl.rollout.envs.dataset import load_dataset
from asyncrl.rollout.envs.interface import AssistantMessage, NonFiniteReward, Reset, check_turn
from asyncrl.rollout.envs.reward import DatasetEnv, ImportPathError, import_object, load_reward

USERLAND = str(Path(__file__).parent / "userland")


@pytest.fixture
def dataset(tmp_path: Path):
    rows = [{"prompt": "2+2?", "answer": 4, "max_len": 3}, {"prompt": "3+3?", "answer": 6}]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_dataset(DatasetSpec(path=str(tmp_path / "d.jsonl"), system_prompt="Answer with a number."))


def turn(text: str) -> AssistantMessage:
    return AssistantMessage(text=text, content=text)


def test_reward_by_import_path_scores_the_final_text(dataset) -> None:
    fn = load_reward("dataset_reward:exact", python_path=[USERLAND])
    assert USERLAND in sys.path
    env = DatasetEnv(dataset, fn)
    reset = env.reset(dict(dataset.rows[0]))
    assert isinstance(reset, Reset)
    assert list(reset.messages) == [{"role": "system", "content": "Answer with a number."},
                                    {"role": "user", "content": "2+2?"}]
    done = check_turn(env.step(turn(" 4\n")), "DatasetEnv.step")
    assert (done.done, done.reward, done.success) == (True, 1.0, True)
    env2 = DatasetEnv(dataset, fn)
    env2.reset(dict(dataset.rows[1]))
    wrong = check_turn(env2.step(turn("7")), "DatasetEnv.step")
    assert (wrong.done, wrong.reward, wrong.success) == (True, 0.0, False)
    assert env2.info() == {"id": "3+3?", "answer": 6, "reward": 0.0}


def test_a_dotted_attribute_and_the_whole_sample(dataset) -> None:
    fn = load_reward("dataset_reward:Scorer.length", python_path=[USERLAND])
    env = DatasetEnv(dataset, fn)
    env.reset(dict(dataset.rows[0]))  # max_len 3 from the row itself
    assert env.step(turn("four")).reward == 0.0
    env.reset(dict(dataset.rows[0]))
    assert env.step(turn("4")).reward == 1.0


def test_a_non_finite_reward_is_the_interfaces_nonfinite_fault(dataset) -> None:
    env = DatasetEnv(dataset, load_reward("dataset_reward:nan_reward", python_path=[USERLAND]))
    env.reset(dict(dataset.rows[0]))
    out = env.step(turn("4"))
    assert out.done and math.isnan(out.reward)
    with pytest.raises(NonFiniteReward):
        check_turn(out, "DatasetEnv.step")
    env = DatasetEnv(dataset, lambda c, a, s: "1.0")  # a string is no reward either
    env.reset(dict(dataset.rows[0]))
    with pytest.raises(NonFiniteReward, match="'1.0' is not a finite number"):
        check_turn(env.step(turn("4")), "DatasetEnv.step")


def test_a_raising_reward_raises_from_step(dataset) -> None:
    # the runner (rollout/envs/runner.py) turns this into EnvFault("exception") for this episode only
    env = DatasetEnv(dataset, load_reward("dataset_reward:raises", python_path=[USERLAND]))
    env.reset(dict(dataset.rows[0]))
    with pytest.raises(KeyError, match="the user's bug"):
        env.step(turn("4"))


@pytest.mark.parametrize(("path", "fragment"), [
    ("no_such_module_xyz:score", "no module 'no_such_module_xyz' on the Python path"),
    ("dataset_reward:missing", "dataset_reward has no attribute 'missing'; callables there: Scorer, exact"),
    ("dataset_reward:Scorer.nope", "dataset_reward.Scorer has no attribute 'nope'"),
    ("dataset_reward:NOT_CALLABLE", "is a int, not a function"),
    ("dataset_reward:two_args", "cannot be called as fn(completion, answer, sample)"),
    ("broken_import:f", "importing 'broken_import' raised RuntimeError: broken at import"),
    ("needs_missing_dep:f", "it imports 'asyncrl_no_such_dependency', which is not installed"),
    ("no_colon", "is not 'package.module:function'"),
])
def test_a_bad_import_path_names_the_field_and_the_fix(path: str, fragment: str) -> None:
    with pytest.raises(ImportPathError) as info:
        load_reward(path, python_path=[USERLAND])
    assert str(info.value).startswith("spec.task.reward: ")
    assert fragment in str(info.value)


def test_the_missing_module_message_names_the_python_path_fix() -> None:
    with pytest.raises(ImportPathError) as info:
        import_object("never_imported_reward:score", python_path=["examples/no-such-folder"])
    text = str(info.value)
    assert "no-such-folder" in text and "spec.task.pythonPath" in text and "PYTHONPATH" in text
