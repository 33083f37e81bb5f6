"""A task no one here wrote: a ``reasoning-gym`` generator, scored by the generator's own scorer.

An ordinary user of the task interface (``envs/interface.py``): a job names it by import path::

    task:
      environment: asyncrl.rollout.envs.reasoning_gym_task:ReasoningGymEnv
      args: {generator: chain_sum, min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}

``reasoning-gym`` is an optional dependency (the ``bench`` and ``test`` extras of ``pyproject.toml``).
Each episode poses one item of the generator, its question text exactly as the generator writes it
(``"State the final answer to the following arithmetic problem: 4 - 1 ="``), as the user's message; the
assistant's turn (ended by the end-of-turn token) is the answer, and the reward is
``dataset.score_answer(answer, item)``: the generator's scorer, partial credit included (``chain_sum``:
1.0 for the same decimal value, ``"+03"`` and ``"3.0"`` too; ``len(oracle) / len(answer)`` when the
oracle is a substring, e.g. 0.5 for ``"13"`` against ``"3"``; else 0). ``success`` is a full score.

Samples are the seeded samples of an environment without a dataset (``SeededSamples``: even seeds
train, odd seeds held out); the item is drawn from ``Random(seed)`` among the generator's indices and
redrawn until its question falls on the sample's side of the built-in tasks' keyed-hash split
(``envs/split.py``: 1/8 of the questions held out), so no held-out question is ever trained on, even
where the generator's space is small (``chain_sum`` with two one-digit terms: 200 questions).

The warm start (:func:`demonstrations`): the generator's own answers, mixed as the built-in tool-free
task's demos are (``good`` the generator's answer, ``near`` one character changed within its class,
``random`` a random answer of the same form), so a supervised pass leaves a policy far from perfect for
RL to improve. The form follows the answer: an integer (``chain_sum``: one digit changed, a number in
-9..18) or a word (``spell_backward``'s reversed word, ``SPELL_BACKWARD``: one letter changed, a random
lower-case string of the same length; its scorer is case-insensitive, so a changed letter differs in
lower case).
"""

import functools
import random
import re
import string
from collections.abc import Mapping
from typing import Any

from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.split import MAX_REDRAWS, is_heldout

TASK = "reasoning-gym"
ENVIRONMENT = "asyncrl.rollout.envs.reasoning_gym_task:ReasoningGymEnv"  # spec.task.environment
CHAIN_SUM = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}  # "a + b" / "a - b", a, b in 0..9
DEFAULT_ARGS: Mapping[str, Any] = {"generator": "chain_sum", **CHAIN_SUM}
# reversed words of 3 to 5 letters (16,772 words in the generator's list); its scorer: 1.0 for the reversal
# (case-insensitive), else 1/len per position that matches it, 0.8 for the reversal followed by more
SPELL_BACKWARD: Mapping[str, Any] = {"generator": "spell_backward", "min_word_len": 3, "max_word_len": 5}
DEMO_MIX: Mapping[str, float] = {"good": 0.6, "near": 0.25, "random": 0.15}  # the built-in arithmetic task's
INDICES = 2**31 - 1  # the generator's items are indexed; an item is a function of (seed, index)
BASE_SEED = 0


@functools.cache
def _dataset(generator: str, config: tuple[tuple[str, Any], ...]) -> Any:
    try:
        import reasoning_gym
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "spec.task.environment reasoning_gym_task needs the 'reasoning-gym' package: "
            "pip install 'asyncrl[bench]' (or pip install reasoning-gym)"
        ) from None
    try:
        return reasoning_gym.create_dataset(generator, seed=BASE_SEED, size=INDICES, **dict(config))
    except (KeyError, ValueError, TypeError, AssertionError) as exc:
        raise ValueError(f"spec.task.args: reasoning-gym generator {generator!r} with {dict(config)} is not valid "
                         f"({exc}); e.g. generator: chain_sum, min_terms: 2, max_terms: 2") from None


def dataset(generator: str = "chain_sum", **config: Any) -> Any:
    """The generator's dataset (one per process and configuration)."""
    return _dataset(generator, tuple(sorted(config.items())))


def item_of(ds: Any, sample: Mapping[str, Any]) -> dict[str, Any]:
    """The generator's item of an episode ``sample`` (``{"seed": int, "split": "train" | "heldout"}``)."""
    seed, split = sample.get("seed"), sample.get("split", "train")
    if not isinstance(seed, int) or split not in ("train", "heldout"):
        raise ValueError(f"{TASK}: sample {dict(sample)!r} must be {{'seed': int, 'split': 'train' | 'heldout'}}")
    rng = random.Random(seed)
    for _ in range(MAX_REDRAWS):
        item: dict[str, Any] = ds[rng.randrange(INDICES)]
        if is_heldout(item["question"]) == (split == "heldout"):
            return item
    raise RuntimeError(f"{TASK}: {MAX_REDRAWS} draws found no {split} question")


class ReasoningGymEnv:
    """One episode of a reasoning-gym generator (a :class:`~asyncrl.rollout.envs.interface.TurnEnvironment`).

    Args (``spec.task.args``): ``generator`` (a reasoning-gym dataset name) and that generator's own
    configuration fields (e.g. ``chain_sum``'s ``min_terms``); default: two one-digit terms.
    """

    truncated_reward = 0.0

    def __init__(self, generator: str = "chain_sum", **config: Any) -> None:
        self.generator = generator
        self.config = dict(CHAIN_SUM if generator == "chain_sum" and not config else config)
        self.ds = dataset(generator, **self.config)
        self.item: dict[str, Any] | None = None

    def reset(self, sample: Mapping[str, Any]) -> Reset:
        self.item = item_of(self.ds, sample)
        return Reset([{"role": "user", "content": self.item["question"]}])

    def score(self, answer: str) -> float:
        """The generator's own score of ``answer`` for this episode's item."""
        if self.item is None:
            raise RuntimeError(f"{TASK}: step() or score() called before reset()")
        return float(self.ds.score_answer(answer, self.item))

    def step(self, msg: AssistantMessage) -> Turn:
        s = self.score(msg.content.strip())
        return Turn(done=True, reward=s, success=s >= 1.0, reason="answered")

    def info(self) -> dict[str, Any]:
        item = self.item or {}
        return {"question": item.get("question"), "answer": item.get("answer")}


def _change_digit(answer: str, rng: random.Random) -> str:
    """``answer`` with one digit replaced (never a leading zero, so the value really changes)."""
    sign, digits = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
    i = rng.randrange(len(digits))
    choices = [d for d in "0123456789" if d != digits[i] and not (i == 0 and d == "0" and len(digits) > 1)]
    return sign + digits[:i] + rng.choice(choices) + digits[i + 1:]


def _change_letter(answer: str, rng: random.Random) -> str:
    """``answer`` with one letter replaced by another lower-case letter (different in lower case, so a
    case-insensitive scorer sees the change)."""
    at = [i for i, c in enumerate(answer) if c.isalpha()]
    if not at:
        raise ValueError(f"{TASK}: answer {answer!r} is neither an integer nor has a letter to change")
    i = rng.choice(at)
    return answer[:i] + rng.choice([c for c in string.ascii_lowercase if c != answer[i].lower()]) + answer[i + 1:]


_INTEGER = re.compile(r"-?[0-9]+")


def demo_answer(answer: str, kind: str, rng: random.Random) -> str:
    """The assistant's answer text of a demonstration of ``kind`` (see :data:`DEMO_MIX`): for an integer
    answer a changed digit or a number in -9..18, for any other a changed letter or a random lower-case
    string of the answer's length."""
    numeric = _INTEGER.fullmatch(answer) is not None
    if kind == "good":
        return answer
    if kind == "near":
        return _change_digit(answer, rng) if numeric else _change_letter(answer, rng)
    if kind == "random":
        if numeric:
            return str(rng.randint(-9, 18))
        return "".join(rng.choice(string.ascii_lowercase) for _ in answer)
    raise ValueError(f"unknown demo kind {kind!r}; valid: {', '.join(DEMO_MIX)}")


def demonstrations(n: int, rng: random.Random, tokenizer: Any, *, mix: Mapping[str, float] = DEMO_MIX,
                   args: Mapping[str, Any] = DEFAULT_ARGS) -> list[tuple[list[int], list[bool]]]:
    """``n`` warm-start demonstrations ``(tokens, loss_mask)`` on train-side items, played through the
    environment (its prompt and end-of-turn tokens exactly as the engine would see them)."""
    from asyncrl.rollout.envs.adapter import TurnAdapter
    from asyncrl.rollout.envs.base import replay

    kinds, weights = list(mix), list(mix.values())
    out = []
    for _ in range(n):
        env = ReasoningGymEnv(**dict(args))
        adapter = TurnAdapter(TASK, env, {"seed": 2 * rng.randrange(2**40), "split": "train"}, tokenizer)
        prompt = adapter.reset()
        assert env.item is not None  # set by reset
        text = demo_answer(str(env.item["answer"]), rng.choices(kinds, weights)[0], rng)
        ep = replay(adapter, prompt, [text + tokenizer.eos_token])
        if not ep.done:
            raise RuntimeError(f"{TASK} demo did not end: {tokenizer.decode(ep.tokens)!r} ({ep.reason})")
        out.append((ep.tokens, ep.loss_mask))
    return out
