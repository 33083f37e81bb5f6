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
)
from asyncrl.rollout.tokenizer import TOKENIZER, ToolTokenizer


@dataclass(frozen=True)
class TaskDef:
    """A built-in task: its problem generator, whether it has the tool, and its demo mix."""

    name: str
    problem_fn: Callable[[Random], Problem]
    uses_tool: bool
    demo_mix: Mapping[str, float]  # demonstration kind -> share (see envs/demos.py)
    max_new_tokens_needed: int  # tokens after the prompt of the longest correct solution

    def make_env(self, *, max_tool_calls: int = 4, tokenizer: ToolTokenizer = TOKENIZER) -> Environment:
        """A fresh episode environment (one per trajectory)."""
        calls = max_tool_calls if self.uses_tool else 0
        return MathToolEnv(self.name, self.problem_fn, tokenizer, calls)

    def rescore(
        self, tokens: list[int], loss_mask: list[bool], prompt_len: int, *, max_tool_calls: int = 4
    ) -> ScriptedEpisode:
        """This task's own verdict on a recorded episode (see :func:`~asyncrl.rollout.envs.base.rescore`)."""
        env = MathToolEnv(self.name, self.problem_fn, TOKENIZER, max_tool_calls if self.uses_tool else 0)
        env.load_prompt(tokens[:prompt_len])
        return rescore(env, tokens, loss_mask, prompt_len)


TASKS: Mapping[str, TaskDef] = MappingProxyType(
    {
        # rl-on-cpu.md's default mix: SFT reaches ~0.42 sampled success.
        "calculator": TaskDef(
            "calculator",
            calculator_problem,
            True,
            {"good": 0.35, "guess": 0.30, "badcall": 0.20, "miscopy": 0.15},
            24,
        ),
        "chain-calculator": TaskDef(
            "chain-calculator",
            chain_problem,
            True,
            {"good": 0.35, "guess": 0.25, "badcall": 0.20, "miscopy": 0.20},
            40,
        ),
        "arithmetic": TaskDef(
            "arithmetic", arithmetic_problem, False, {"good": 0.35, "near": 0.40, "random": 0.25}, 8
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


def make_env(name: str, *, max_tool_calls: int = 4, tokenizer: ToolTokenizer = TOKENIZER) -> Environment:
    """A fresh environment of the built-in task ``name``."""
    return get_task(name).make_env(max_tool_calls=max_tool_calls, tokenizer=tokenizer)
