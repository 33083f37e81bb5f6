import random

import pytest

from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs import TASKS, Environment, get_task, make_env, replay
from asyncrl.rollout.envs.math_tasks import OPS, MathToolEnv, eval_call, parse_question
from asyncrl.rollout.envs.split import BUCKETS, draw_train, is_heldout
from asyncrl.rollout.tokenizer import TOKENIZER


def _env(task: str, question: str, max_tool_calls: int = 4) -> tuple[MathToolEnv, list[int]]:
    env = make_env(task, max_tool_calls=max_tool_calls)
    assert isinstance(env, MathToolEnv)
    prompt = TOKENIZER.encode(f"Q:{question}=?", bos=True)
    env.load_prompt(prompt)
    return env, prompt


def test_registry_names_match_the_spec_and_errors_list_them() -> None:
    for name in TASKS:
        assert TaskSpec(name=name).name == name  # the api's name pattern accepts every built-in task
        assert isinstance(make_env(name), Environment)
    assert TaskSpec().name in TASKS  # the default task is built in
    with pytest.raises(KeyError, match="calculator, chain-calculator, arithmetic"):
        get_task("sudoku")


def test_tool() -> None:
    assert eval_call("47+38") == "85"
    assert eval_call("-89*12") == "-1068"
    assert eval_call("(47+38)*12") == "?"
    assert eval_call("4+") == "?"


def test_calculator_correct_episode_and_env_tokens() -> None:
    env, prompt = _env("calculator", "47*38")
    ep = replay(env, prompt, ["<calc>47*38</calc>", "<ans>1786</ans>"])  # 47*38 = 1786
    assert (ep.done, ep.reward, ep.success) == (True, 1.0, True)
    text = TOKENIZER.decode(ep.tokens)
    assert text == "<bos>Q:47*38=?<calc>47*38</calc><res>1786</res><ans>1786</ans>"
    forced = [TOKENIZER.decode([t]) for t, m in zip(ep.tokens, ep.loss_mask, strict=True) if not m]
    assert "".join(forced[len(prompt) :]) == "<res>1786</res>"


@pytest.mark.parametrize(
    ("turns", "reason"),
    [
        (["<ans>1787</ans>"], "answered"),  # wrong answer
        (["<calc>47*38</calc>", "<ans>1768</ans>"], "answered"),  # miscopy
        (["1786</ans>"], "</ans> without <ans>"),
        (["<calc>1</calc>", "<calc>2</calc>", "<calc>3</calc>"], "more than 2 tool calls"),
        (["12<eos>"], "<eos> without an answer"),
    ],
)
def test_calculator_incorrect_episodes(turns: list[str], reason: str) -> None:
    env, prompt = _env("calculator", "47*38", max_tool_calls=2)
    ep = replay(env, prompt, turns)
    assert (ep.done, ep.reward, ep.success, ep.reason) == (True, 0.0, False, reason)


def test_malformed_call_gets_question_mark() -> None:
    env, prompt = _env("calculator", "47*38")
    ep = replay(env, prompt, ["<calc>47*</calc>"])
    assert TOKENIZER.decode(ep.tokens).endswith("<calc>47*</calc><res>?</res>")
    assert not ep.done


def test_chain_needs_two_calls() -> None:
    # (47+38)*12 = 85*12 = 1020
    env, prompt = _env("chain-calculator", "(47+38)*12")
    ep = replay(env, prompt, ["<calc>47+38</calc>", "<calc>85*12</calc>", "<ans>1020</ans>"])
    assert (ep.reward, ep.success) == (1.0, True)
    assert TOKENIZER.decode(ep.tokens).count("<res>") == 2
    # one call with the whole expression is refused by the tool
    env, prompt = _env("chain-calculator", "(47+38)*12")
    ep = replay(env, prompt, ["<calc>(47+38)*12</calc>", "<ans>1000</ans>"])
    assert "<res>?</res>" in TOKENIZER.decode(ep.tokens) and ep.reward == 0.0
    # right-nested form: 12-(47+38) = 12-85 = -73
    env, prompt = _env("chain-calculator", "12-(47+38)")
    ep = replay(env, prompt, ["<calc>47+38</calc>", "<calc>12-85</calc>", "<ans>-73</ans>"])
    assert ep.success


def test_arithmetic_is_single_turn() -> None:
    env, prompt = _env("arithmetic", "47+38")
    assert replay(env, prompt, ["<ans>85</ans>"]).success
    env, prompt = _env("arithmetic", "47+38")
    ep = replay(env, prompt, ["<calc>47+38</calc>"])
    assert (ep.done, ep.reward, ep.reason) == (True, 0.0, "tool call in a task without the tool")


@pytest.mark.parametrize("name", list(TASKS))
def test_problems_are_deterministic_and_parse_back(name: str) -> None:
    a, b = make_env(name), make_env(name)
    pa, pb = a.reset(random.Random(3)), b.reset(random.Random(3))
    assert pa == pb
    rng = random.Random(0)
    assert max(len(make_env(name).reset(rng)) for _ in range(300)) == get_task(name).max_prompt_tokens
    assert isinstance(a, MathToolEnv) and a.problem is not None
    assert parse_question(a.problem.question) == a.problem
    assert a.info()["answer"] == a.problem.answer


def test_chain_problem_mix() -> None:
    rng = random.Random(0)
    qs = []
    for _ in range(200):
        env = make_env("chain-calculator")
        env.reset(rng)
        assert isinstance(env, MathToolEnv) and env.problem is not None
        qs.append(env.problem.question)
    left = sum(q.startswith("(") for q in qs)
    assert 60 < left < 140  # both nestings appear (~50/50)
    assert all(len(q) == 10 for q in qs)  # fixed-length prompts: no padding in a fresh batch


# ---- the held-out split (rollout/envs/split.py) ---------------------------------------------------


def _space(lo: int, hi: int) -> list[str]:
    return [f"{a}{op}{b}" for a in range(lo, hi + 1) for op in OPS for b in range(lo, hi + 1)]


def test_split_sizes_of_the_enumerable_tasks() -> None:
    # arithmetic: 9 x 3 x 9 = 243 questions, calculator 90 x 3 x 90 = 24,300 (the counts quoted in split.py)
    arithmetic, calculator = _space(1, 9), _space(10, 99)
    assert (len(arithmetic), len(calculator)) == (243, 24_300)
    assert sum(map(is_heldout, arithmetic)) == 36
    held = sum(map(is_heldout, calculator))
    assert held == 3043 and abs(held / len(calculator) - 1 / BUCKETS) < 0.01


@pytest.mark.parametrize("name", list(TASKS))
def test_training_draws_never_hit_the_heldout_split(name: str) -> None:
    task = get_task(name)
    heldout = {p.question for p in task.heldout_problems(256, seed=3)}
    assert heldout and all(is_heldout(q) for q in heldout)
    rng = random.Random(7)
    drawn = set()
    for _ in range(5000):  # through the environment, as rollout and the warm start's demos draw
        env = task.make_env()
        env.reset(rng)
        assert env.problem is not None
        drawn.add(env.problem.question)
    assert not any(is_heldout(q) for q in drawn)
    assert drawn.isdisjoint(heldout)
    if name == "arithmetic":
        assert len(drawn) == 243 - 36  # every train-side problem is still drawn


def test_a_train_side_draw_is_unchanged_and_a_heldout_one_is_redrawn() -> None:
    task = get_task("calculator")
    seen = {"kept": 0, "redrawn": 0}
    for seed in range(400):
        before = task.problem_fn(random.Random(seed))  # the draw before the split existed
        after = draw_train(task.problem_fn, random.Random(seed))
        if is_heldout(before.question):
            seen["redrawn"] += 1
            assert after != before and not is_heldout(after.question)
        else:
            seen["kept"] += 1
            assert after == before
    assert seen["kept"] > 300 and seen["redrawn"] > 20  # ~1/8 of 400 redrawn


@pytest.mark.parametrize("name", list(TASKS))
def test_heldout_problems_are_fixed_by_seed_and_posed_as_is(name: str) -> None:
    task = get_task(name)
    a, b, c = task.heldout_problems(32, 0), task.heldout_problems(32, 0), task.heldout_problems(32, 1)
    assert a == b and a != c and len(a) == 32
    env = task.make_env(problem=a[5])
    prompt = env.reset(random.Random(123))  # the rng is not used for a posed problem
    assert env.problem == a[5] and f"Q:{a[5].question}=?" in TOKENIZER.decode(prompt)
    with pytest.raises(ValueError, match="n must be >= 0"):
        task.heldout_problems(-1, 0)
