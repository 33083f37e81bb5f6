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

With a pretrained model's BPE tokenizer (``rollout/tokenizer.py``) the same protocol is plain text:
the prompt (:func:`prompt_ids`) is the model's chat template over the instructions, two worked
examples and the question (a 135M instruct model follows the tags only when shown them), a closing tag may arrive inside a longer token (so the environment looks for the first
closing tag in the turn, not only at its end), and the model's EOS token ends the episode.
"""

import random
import re
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.envs.split import draw_train
from asyncrl.rollout.tokenizer import Tokenizer

OPS = ("+", "-", "*")
SYSTEM_TOOL = (
    "Solve the arithmetic question with the calculator. It takes one operation of two integers: write "
    "<calc>47+38</calc> and it answers <res>85</res>. Then give only the final number as <ans>85</ans>."
)
SYSTEM_NO_TOOL = "Solve the arithmetic question. Give only the final number as <ans>56</ans>."
# (question, the assistant's whole answer, tool results included): 12*34 = 408; (20+5)*3 = 25*3 = 75
EXAMPLES_TOOL = (
    ("Q:12*34=?", "<calc>12*34</calc><res>408</res><ans>408</ans>"),
    ("Q:(20+5)*3=?", "<calc>20+5</calc><res>25</res><calc>25*3</calc><res>75</res><ans>75</ans>"),
)
EXAMPLES_NO_TOOL = (("Q:3*4=?", "<ans>12</ans>"), ("Q:9-2=?", "<ans>7</ans>"))
_QUESTION = re.compile(r"Q:([0-9+\-*()]+)=\?")
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


def prompt_ids(tokenizer: Tokenizer, prompt_text: str, uses_tool: bool) -> list[int]:
    """The prompt of a question (``Q:47*38=?``): instructions and worked examples of the protocol
    (with or without the tool) and the question, as ``tokenizer`` formats a chat."""
    if uses_tool:
        return tokenizer.chat_prompt(SYSTEM_TOOL, prompt_text, EXAMPLES_TOOL)
    return tokenizer.chat_prompt(SYSTEM_NO_TOOL, prompt_text, EXAMPLES_NO_TOOL)


class MathToolEnv:
    """One episode of a math task; the tool is available when ``max_tool_calls > 0``."""

    def __init__(self, task: str, problem_fn: Any, tokenizer: Tokenizer, max_tool_calls: int,
                 fixed: Problem | None = None) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.truncated_reward = 0.0
        self.max_tool_calls = max_tool_calls
        self._problem_fn = problem_fn
        self._fixed = fixed
        self.problem: Problem | None = None
        self.calls = 0

    def reset(self, rng: random.Random) -> list[int]:
        """Draw a problem of the train split from ``rng`` (envs/split.py), or take the ``fixed`` one
        (an evaluation prompt of the held-out split; ``rng`` is then unused)."""
        self.problem = self._fixed if self._fixed is not None else draw_train(self._problem_fn, rng)
        self.calls = 0
        return prompt_ids(self.tokenizer, self.problem.prompt_text, self.max_tool_calls > 0)

    def load_prompt(self, prompt: list[int]) -> None:
        """Set the problem from prompt tokens (the last ``Q:<question>=?`` in them), e.g. to re-score."""
        text = self.tokenizer.decode(prompt, skip_special=True)
        found = _QUESTION.findall(text)
        if not found:
            raise ValueError(f"{self.task}: prompt {text!r} is not of the form 'Q:<question>=?'")
        self.problem = parse_question(found[-1])
        self.calls = 0

    def info(self) -> dict[str, Any]:
        p = self._need_problem()
        return {"question": p.question, "answer": p.answer, "tool_calls": self.calls}

    def _need_problem(self) -> Problem:
        if self.problem is None:
            raise RuntimeError(f"{self.task}: step() or info() called before reset(rng)")
        return self.problem

    def step(self, turn_text: str) -> EnvStep:
        # Called after every sampled token, so the first closing tag in the turn is the one this token
        # completed: with one token per tag (character tokenizer) it is the turn's end; a BPE token
        # may carry text past it (``>.``), which is ignored.
        p = self._need_problem()
        end = turn_text.find("</ans>")
        if end >= 0:
            start = turn_text.rfind("<ans>", 0, end)
            if start < 0:
                return EnvStep(done=True, reason="</ans> without <ans>")
            given = turn_text[start + len("<ans>") : end].strip()
            ok = given == str(p.answer)
            return EnvStep(done=True, reward=float(ok), success=ok, reason="answered")
        end = turn_text.find("</calc>")
        if end >= 0:
            if self.max_tool_calls == 0:
                return EnvStep(done=True, reason="tool call in a task without the tool")
            self.calls += 1
            if self.calls > self.max_tool_calls:
                return EnvStep(done=True, reason=f"more than {self.max_tool_calls} tool calls")
            start = turn_text.rfind("<calc>", 0, end)
            result = eval_call(turn_text[start + len("<calc>") : end].strip()) if start >= 0 else "?"
            return EnvStep(tokens=tuple(self.tokenizer.encode(f"<res>{result}</res>")))
        eos = self.tokenizer.eos_token
        if turn_text.endswith(eos):
            return EnvStep(done=True, reason=f"{eos} without an answer")
        return CONTINUE
