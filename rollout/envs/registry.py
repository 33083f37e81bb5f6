"""Built-in tasks by name (the names ``spec.task.name`` accepts)."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from random import Random
from types import MappingProxyType

from asyncrl.rollout.envs.base import Environment, ScriptedEpisode, rescore
from asyncrl.rollout.envs.math_tasks import (
    MathToolEnv,
    Problem,
    arithmetic_problem,
    calculator_problem,
    chain_problem,
    prompt_ids,
)
from asyncrl.rollout.envs.split import heldout_problems
from asyncrl.rollout.tokenizer import TOKENIZER, Tokenizer


@dataclass(frozen=True)
class TaskDef:
    """A built-in task: its problem generator, whether it has the tool, and its demo mix."""

    name: str
    problem_fn: Callable[[Random], Problem]
    uses_tool: bool
    demo_mix: Mapping[str, float]  # demonstration kind -> share (see envs/demos.py)
    max_new_tokens_needed: int  # tokens after the prompt of the longest correct solution
    max_prompt_tokens: int  # longest prompt, <bos> included

    def make_env(self, *, max_tool_calls: int = 4, tokenizer: Tokenizer = TOKENIZER,
                 problem: Problem | None = None) -> MathToolEnv:
        """A fresh episode environment (one per trajectory; an :class:`Environment`): its ``reset``
        draws a problem of the train split, or poses ``problem`` (an evaluation prompt)."""
        calls = max_tool_calls if self.uses_tool else 0
        return MathToolEnv(self.name, self.problem_fn, tokenizer, calls, fixed=problem)

    def heldout_problems(self, n: int, seed: int) -> list[Problem]:
        """The evaluation prompts: ``n`` problems of this task's held-out split drawn from ``seed``
        (see :mod:`~asyncrl.rollout.envs.split`; never drawn for training)."""
        return heldout_problems(self.problem_fn, n, seed)

    def rescore(
        self,
        tokens: list[int],
        loss_mask: list[bool],
        prompt_len: int,
        *,
        max_tool_calls: int = 4,
        tokenizer: Tokenizer = TOKENIZER,
    ) -> ScriptedEpisode:
        """This task's own verdict on a recorded episode (see :func:`~asyncrl.rollout.envs.base.rescore`)."""
        env = MathToolEnv(self.name, self.problem_fn, tokenizer, max_tool_calls if self.uses_tool else 0)
        env.load_prompt(tokens[:prompt_len])
        return rescore(env, tokens, loss_mask, prompt_len)


TASKS: Mapping[str, TaskDef] = MappingProxyType(
    {
        "calculator": TaskDef(
            name="calculator",
            problem_fn=calculator_problem,
            uses_tool=True,
            # the measured default mix: SFT (300 steps) reaches ~0.42 sampled success
            demo_mix={"good": 0.35, "guess": 0.30, "badcall": 0.20, "miscopy": 0.15},
            max_new_tokens_needed=24,  # <calc>99*99</calc><res>9801</res><ans>9801</ans>
            max_prompt_tokens=10,  # <bos>Q:47*38=?
        ),
        "chain-calculator": TaskDef(
            name="chain-calculator",
            problem_fn=chain_problem,
            uses_tool=True,
            # measured: SFT 300 steps -> 0.29 sampled success; GRPO (16x8, lr 3e-4) 0.35 -> 0.65 in 400 steps
            demo_mix={"good": 0.35, "guess": 0.25, "badcall": 0.20, "miscopy": 0.20},
            max_new_tokens_needed=40,  # two calls with results up to 6 digits, then the answer
            max_prompt_tokens=15,  # <bos>Q:(47+38)*12=?
        ),
        "arithmetic": TaskDef(
            name="arithmetic",
            problem_fn=arithmetic_problem,
            uses_tool=False,
            # measured: SFT 300 steps -> 0.25 sampled success (0.145 with good 0.5, 0.05 on 1..20 operands)
            demo_mix={"good": 0.6, "near": 0.25, "random": 0.15},
            max_new_tokens_needed=4,  # <ans>81</ans>
            max_prompt_tokens=8,  # <bos>Q:7*8=?
        ),
    }
)


def get_task(name: str) -> TaskDef:
    """The built-in task ``name``; an unknown name raises a ``KeyError`` listing the valid ones."""
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(
            f"spec.task.name {name!r} is not a built-in task; valid names: {', '.join(TASKS)}"
        ) from None


def make_env(name: str, *, max_tool_calls: int = 4, tokenizer: Tokenizer = TOKENIZER) -> Environment:
    """A fresh environment of the built-in task ``name``."""
    return get_task(name).make_env(max_tool_calls=max_tool_calls, tokenizer=tokenizer)


def max_prompt_tokens(task_name: str, tokenizer: Tokenizer = TOKENIZER) -> int:
    """Most prompt tokens of ``task_name`` under ``tokenizer`` (exact for the character tokenizer).

    Another tokenizer's bound: its prompt around an empty question, plus one token per character of
    the longest question (every BPE token of this text spells at least one character).
    """
    task = get_task(task_name)
    if tokenizer is TOKENIZER:
        return task.max_prompt_tokens
    longest_question = task.max_prompt_tokens - 1  # character tokens without <bos>
    return len(prompt_ids(tokenizer, "", task.uses_tool)) + longest_question


def max_sequence_length(task_name: str, max_new_tokens: int, tokenizer: Tokenizer = TOKENIZER) -> int:
    """Longest trajectory of ``task_name`` (prompt + ``spec.task.maxNewTokens``).

    Pass it as ``max_sequence_length`` to ``resolve_arch`` on both sides (actor and rollout).
    """
    return max_prompt_tokens(task_name, tokenizer) + max_new_tokens
