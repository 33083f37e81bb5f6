"""reasoning-gym's chain_sum and spell_backward as tasks (rollout/envs/reasoning_gym_task.py): rendered as the
generator writes them, scored by the generator's own scorer, split like the built-in tasks, warm-started on
their answers."""

import random

import pytest
import reasoning_gym  # a test extra (pyproject): never a skip

from asyncrl.api.model import ModelSpec  # noqa: E402
from asyncrl.api.task import TaskSpec  # noqa: E402
from asyncrl.rollout.envs import replay  # noqa: E402
from asyncrl.rollout.envs.adapter import TurnAdapter  # noqa: E402
from asyncrl.rollout.envs.binding import bind_task, has_demonstrations, task_tokenizer  # noqa: E402
from asyncrl.rollout.envs.charset import TEXT_TOKENIZER  # noqa: E402
from asyncrl.rollout.envs.reasoning_gym_task import (  # noqa: E402
    DEFAULT_ARGS,
    ENVIRONMENT,
    SPELL_BACKWARD,
    ReasoningGymEnv,
    demo_answer,
    demonstrations,
    item_of,
)
from asyncrl.rollout.envs.split import is_heldout  # noqa: E402

HELDOUT = {"seed": 7, "split": "heldout"}


def _episode(answer: str, sample: dict = HELDOUT) -> tuple[ReasoningGymEnv, object]:
    env = ReasoningGymEnv()
    adapter = TurnAdapter("reasoning-gym", env, sample, TEXT_TOKENIZER)
    prompt = adapter.reset()
    assert env.item is not None
    ep = replay(adapter, prompt, [answer.format(a=env.item["answer"]) + TEXT_TOKENIZER.eos_token])
    return env, ep


def test_the_prompt_is_the_generators_question() -> None:

    env = ReasoningGymEnv()
    adapter = TurnAdapter("reasoning-gym", env, HELDOUT, TEXT_TOKENIZER)
    prompt = adapter.reset()
    item = env.item
    assert item is not None and item["metadata"]["source_dataset"] == "chain_sum"
    # the very item reasoning-gym itself makes at that index (the dataset is a function of seed and index)
    direct = reasoning_gym.create_dataset("chain_sum", seed=0, size=2**31 - 1, **{k: v for k, v in DEFAULT_ARGS.items()
                                                                                if k != "generator"})
    assert direct[item["metadata"]["source_index"]] == item
    assert item["question"].startswith("State the final answer to the following arithmetic problem: ")
    assert TEXT_TOKENIZER.decode(prompt) == "<bos>" + item["question"]  # the character alphabet renders the user turn
    a, op, b = item["metadata"]["expression"].split()
    assert item["answer"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))


@pytest.mark.parametrize(
    ("answer", "reward"),
    [
        ("{a}", 1.0),  # the oracle's text
        ("+0{a}", 1.0),  # the generator's scorer compares decimal values: "+04" == "4" (exact match would say 0)
        ("{a}.0", 1.0),
        ("9{a}9", None),  # oracle a substring: partial credit len(oracle) / len(answer)
        ("x", 0.0),
    ],
)
def test_the_reward_is_the_generators_score(answer: str, reward: float | None) -> None:
    env, ep = _episode(answer)
    assert env.item is not None
    oracle = env.item["answer"]
    expected = len(oracle) / (len(oracle) + 2) if reward is None else reward  # "9" + "-3" + "9": 2/4 = 0.5
    assert ep.done and ep.reward == pytest.approx(expected, abs=1e-12)
    assert ep.reward == env.ds.score_answer(answer.format(a=oracle), env.item)  # the generator's own verdict
    assert ep.success == (expected == 1.0)


def test_a_wrong_value_scores_zero() -> None:
    env = ReasoningGymEnv()
    env.reset(HELDOUT)
    assert env.item is not None
    oracle = env.item["answer"]
    wrong = demo_answer(oracle, "near", random.Random(1))  # one digit changed: same length, so no substring
    assert len(wrong) == len(oracle) and wrong != oracle
    assert (env.score(wrong), env.score(oracle)) == (0.0, 1.0)


def test_train_and_heldout_questions_never_meet() -> None:
    env = ReasoningGymEnv()
    train = {item_of(env.ds, {"seed": 2 * i, "split": "train"})["question"] for i in range(400)}
    held = {item_of(env.ds, {"seed": 2 * i + 1, "split": "heldout"})["question"] for i in range(400)}
    assert train and held and not train & held
    assert all(is_heldout(q) for q in held) and not any(is_heldout(q) for q in train)
    # two one-digit terms and two operators: 200 questions, about 1/8 of them held out
    assert 15 <= len(held) <= 40 and len(train) > 120


def test_a_job_names_it_by_import_path() -> None:
    spec = TaskSpec(environment=ENVIRONMENT, args=dict(DEFAULT_ARGS))
    binding = bind_task(spec)
    env = binding.new_env()
    assert isinstance(env, ReasoningGymEnv) and env.generator == "chain_sum"
    assert task_tokenizer(ModelSpec(), spec) is TEXT_TOKENIZER  # the tiny presets read it in printable ASCII
    assert not has_demonstrations(spec)  # a user's environment: the warm start is the user's (bench/paper/external.py)
    held = binding.samples.heldout(3, seed=0)
    assert [s["split"] for s in held] == ["heldout"] * 3


def test_a_bad_generator_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"spec.task.args: reasoning-gym generator 'no_such'"):
        ReasoningGymEnv(generator="no_such")


def test_demonstrations_train_only_the_answer_and_good_ones_score_one() -> None:
    demos = demonstrations(40, random.Random(3), TEXT_TOKENIZER)
    for tokens, mask in demos:
        text = TEXT_TOKENIZER.decode(tokens)
        trained = TEXT_TOKENIZER.decode([t for t, m in zip(tokens, mask, strict=True) if m])
        assert text.endswith(trained) and trained.endswith("<eos>")  # the answer and its end-of-turn only
        assert "problem:" in text and "problem:" not in trained
    rng = random.Random(0)
    assert demo_answer("-3", "good", rng) == "-3"
    near = demo_answer("-3", "near", rng)
    assert near.startswith("-") and near != "-3" and len(near) == 2  # one digit changed, sign kept
    with pytest.raises(ValueError, match="unknown demo kind 'bad'"):
        demo_answer("1", "bad", rng)


# --- spell_backward (bench/paper/external.py's task): reversed words, a per-position scorer ----------------------
def _word_env(sample: dict = HELDOUT) -> ReasoningGymEnv:
    env = ReasoningGymEnv(**dict(SPELL_BACKWARD))
    env.reset(sample)
    assert env.item is not None
    return env


def _episode_of(env: ReasoningGymEnv, answer: str) -> tuple[ReasoningGymEnv, object]:
    adapter = TurnAdapter("reasoning-gym", env, HELDOUT, TEXT_TOKENIZER)
    prompt = adapter.reset()
    return env, replay(adapter, prompt, [answer + TEXT_TOKENIZER.eos_token])


def test_spell_backward_poses_the_generators_question() -> None:
    env = ReasoningGymEnv(**dict(SPELL_BACKWARD))
    adapter = TurnAdapter("reasoning-gym", env, HELDOUT, TEXT_TOKENIZER)
    prompt = adapter.reset()
    item = env.item
    assert item is not None and item["metadata"]["source_dataset"] == "spell_backward"
    direct = reasoning_gym.create_dataset("spell_backward", seed=0, size=2**31 - 1, min_word_len=3, max_word_len=5)
    assert direct[item["metadata"]["source_index"]] == item
    word = item["metadata"]["word"]
    assert item["question"] == f"Spell this word backward (example: sun -> nus): {word}"
    assert TEXT_TOKENIZER.decode(prompt) == "<bos>" + item["question"]
    assert item["answer"] == word[::-1] and 3 <= len(word) <= 5


def test_spell_backward_reward_is_the_generators_per_position_score() -> None:
    env = _word_env()
    assert env.item is not None
    oracle = env.item["answer"]
    n = len(oracle)
    first = "z" if oracle[0].lower() != "z" else "y"
    cases = [
        (oracle, 1.0),
        (oracle.upper(), 1.0),  # the scorer lower-cases both sides
        (oracle + "x", 0.8),  # every position matches, then more: 1.0 - 0.2
        (first + oracle[1:], (n - 1) / n),  # the first position wrong: the other n - 1 count 1/n each
        (oracle[:2], 2 / n),  # a prefix: its positions only
        ("", 0.0),
    ]
    for answer, expected in cases:
        assert env.score(answer) == pytest.approx(expected, abs=1e-12), answer
        assert env.score(answer) == env.ds.score_answer(answer, env.item)  # the generator's own verdict
    _, ep = _episode_of(env, oracle)
    assert ep.done and ep.reward == 1.0 and ep.success


def test_word_demos_change_one_letter_or_draw_a_random_word() -> None:
    rng = random.Random(0)
    for answer in ("olleh", "Tejon", "abc"):
        near = demo_answer(answer, "near", rng)
        assert len(near) == len(answer) and near.isalpha()
        changed = [i for i, (a, b) in enumerate(zip(answer, near, strict=True)) if a.lower() != b.lower()]
        assert len(changed) == 1 and near[changed[0]].islower()  # one letter, different even case-insensitively
        rand = demo_answer(answer, "random", rng)
        assert len(rand) == len(answer) and rand.isalpha() and rand.islower()
    assert demo_answer("-3", "random", random.Random(0)).lstrip("-").isdigit()  # an integer keeps its form
    with pytest.raises(ValueError, match=r"neither an integer nor has a letter"):
        demo_answer("?!", "near", rng)


def test_word_demonstrations_train_the_reversal_only() -> None:
    demos = demonstrations(30, random.Random(2), TEXT_TOKENIZER, args=SPELL_BACKWARD, mix={"good": 1.0})
    for tokens, mask in demos:
        text = TEXT_TOKENIZER.decode(tokens)
        trained = TEXT_TOKENIZER.decode([t for t, m in zip(tokens, mask, strict=True) if m])
        prefix = "<bos>Spell this word backward (example: sun -> nus): "
        assert text.startswith(prefix) and text.endswith(trained) and trained.endswith("<eos>")
        word = text[len(prefix):len(text) - len(trained)]
        assert trained == word[::-1] + "<eos>"  # good demos only: the generator's answer, the word reversed
        assert not is_heldout(f"Spell this word backward (example: sun -> nus): {word}")  # train side only
