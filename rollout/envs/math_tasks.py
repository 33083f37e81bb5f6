"""The built-in verifiable math tasks: ``calculator``, ``chain-calculator`` and ``arithmetic``.

Agent protocol (tags are single tokens, ``reference/rl-on-cpu.md`` §1):
``<calc>47+38</calc>`` asks the tool, which answers ``<res>85</res>`` (``<res>?</res>`` when the
expression is not ``int op int``); ``<ans>85</ans>`` ends the episode with reward 1 if the answer is
the true value, else 0. ``<eos>``, a tool call beyond ``max_tool_calls`` or a tool call in a task
without the tool end it with reward 0.

- ``calculator``: ``Q:47*38=?``; one tool call suffices.
- ``chain-calculator``: ``Q:(47+38)*12=?`` or ``Q:12*(47+38)=?``: the tool takes only ``a op b``, so
  the agent needs two calls and must carry the first result into the second. Harder to copy
  faithfully (results up to 6 digits), so a tiny model keeps improving for minutes.
- ``arithmetic``: ``Q:7*8=?`` answered directly (single turn, no tool): one-digit operands, so
  the task stays learnable without a tool by a tiny model.
"""

import random
import re
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.tokenizer import EOS, ToolTokenizer

OPS = ("+", "-", "*")
_CALL = re.compile(r"^(-?\d{1,7})([+\-*])(-?\d{1,7})$")


def apply_op(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}; valid: {OPS}")


def eval_call(expr: str) -> str:
    """The tool: ``'47+38' -> '85'``; anything but ``int op int`` gives ``'?'``."""
    m = _CALL.match(expr)
    if not m:
        return "?"
    return str(apply_op(int(m.group(1)), m.group(2), int(m.group(3))))


@dataclass(frozen=True)
class Problem:
    """A question, its true answer and the tool calls of a correct solution, in order."""

    question: str  # e.g. "(47+38)*12"
    answer: int
    calls: tuple[tuple[str, int], ...]  # ((expression, result), ...), later calls use earlier results

    @property
    def prompt_text(self) -> str:
        return f"Q:{self.question}=?"


def _two_digit(rng: random.Random) -> int:
    return rng.randint(10, 99)


def calculator_problem(rng: random.Random) -> Problem:
    a, op, b = _two_digit(rng), rng.choice(OPS), _two_digit(rng)
    r = apply_op(a, op, b)
    return Problem(f"{a}{op}{b}", r, ((f"{a}{op}{b}", r),))


def chain_problem(rng: random.Random) -> Problem:
    a, op1, b, op2, c = _two_digit(rng), rng.choice(OPS), _two_digit(rng), rng.choice(OPS), _two_digit(rng)
    inner = apply_op(a, op1, b)
    if rng.random() < 0.5:  # (a op1 b) op2 c
        r = apply_op(inner, op2, c)
        return Problem(f"({a}{op1}{b}){op2}{c}", r, ((f"{a}{op1}{b}", inner), (f"{inner}{op2}{c}", r)))
    r = apply_op(c, op2, inner)  # c op2 (a op1 b)
    return Problem(f"{c}{op2}({a}{op1}{b})", r, ((f"{a}{op1}{b}", inner), (f"{c}{op2}{inner}", r)))


def arithmetic_problem(rng: random.Random) -> Problem:
    # Small operands: without a tool a 0.3M-param model cannot learn 2-digit sums in a short warm
    # start (measured: 0.004 sampled success after 300 SFT steps on 2-digit + - *; 0.05 on 1..20).
    op = rng.choice(OPS)
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    r = apply_op(a, op, b)
    return Problem(f"{a}{op}{b}", r, ((f"{a}{op}{b}", r),))  # the call a tool would take (none here)


_FLAT = re.compile(r"^(\d+)([+\-*])(\d+)$")
_LEFT = re.compile(r"^\((\d+)([+\-*])(\d+)\)([+\-*])(\d+)$")
_RIGHT = re.compile(r"^(\d+)([+\-*])\((\d+)([+\-*])(\d+)\)$")


def parse_question(question: str) -> Problem:
    """The :class:`Problem` of a question text (``47+38``, ``(47+38)*12`` or ``12*(47+38)``)."""
    if m := _FLAT.match(question):
        a, op, b = int(m[1]), m[2], int(m[3])
        r = apply_op(a, op, b)
        return Problem(question, r, ((question, r),))
    if m := _LEFT.match(question):
        a, op1, b, op2, c = int(m[1]), m[2], int(m[3]), m[4], int(m[5])
        inner = apply_op(a, op1, b)
        r = apply_op(inner, op2, c)
        return Problem(question, r, ((f"{a}{op1}{b}", inner), (f"{inner}{op2}{c}", r)))
    if m := _RIGHT.match(question):
        c, op2, a, op1, b = int(m[1]), m[2], int(m[3]), m[4], int(m[5])
        inner = apply_op(a, op1, b)
        r = apply_op(c, op2, inner)
        return Problem(question, r, ((f"{a}{op1}{b}", inner), (f"{c}{op2}{inner}", r)))
    raise ValueError(
        f"{question!r} is not a question of the built-in math tasks (e.g. '47+38', '(47+38)*12')"
    )


class MathToolEnv:
    """One episode of a math task; the tool is available when ``max_tool_calls > 0``."""

    def __init__(self, task: str, problem_fn: Any, tokenizer: ToolTokenizer, max_tool_calls: int) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.truncated_reward = 0.0
        self.max_tool_calls = max_tool_calls
        self._problem_fn = problem_fn
        self.problem: Problem | None = None
        self.calls = 0

    def reset(self, rng: random.Random) -> list[int]:
        self.problem = self._problem_fn(rng)
        self.calls = 0
        return self.tokenizer.encode(self.problem.prompt_text, bos=True)

    def load_prompt(self, prompt: list[int]) -> None:
        """Set the problem from prompt tokens (``<bos>Q:...=?``), e.g. to re-score a trajectory."""
        text = self.tokenizer.decode(prompt, skip_special=True)
        if not (text.startswith("Q:") and text.endswith("=?")):
            raise ValueError(f"{self.task}: prompt {text!r} is not of the form 'Q:<question>=?'")
        self.problem = parse_question(text[2:-2])
        self.calls = 0

    def info(self) -> dict[str, Any]:
        p = self._need_problem()
        return {"question": p.question, "answer": p.answer, "tool_calls": self.calls}

    def _need_problem(self) -> Problem:
        if self.problem is None:
            raise RuntimeError(f"{self.task}: step() or info() called before reset(rng)")
        return self.problem

    def step(self, turn_text: str) -> EnvStep:
        p = self._need_problem()
        if turn_text.endswith("</ans>"):
            start = turn_text.rfind("<ans>")
            if start < 0:
                return EnvStep(done=True, reason="</ans> without <ans>")
            given = turn_text[start + len("<ans>") : -len("</ans>")]
            ok = given == str(p.answer)
            return EnvStep(done=True, reward=float(ok), success=ok, reason="answered")
        if turn_text.endswith("</calc>"):
            if self.max_tool_calls == 0:
                return EnvStep(done=True, reason="tool call in a task without the tool")
            self.calls += 1
            if self.calls > self.max_tool_calls:
                return EnvStep(done=True, reason=f"more than {self.max_tool_calls} tool calls")
            start = turn_text.rfind("<calc>")
            result = eval_call(turn_text[start + len("<calc>") : -len("</calc>")]) if start >= 0 else "?"
            return EnvStep(tokens=tuple(self.tokenizer.encode(f"<res>{result}</res>")))
        if turn_text.endswith(EOS):
            return EnvStep(done=True, reason="<eos> without an answer")
        return CONTINUE
