"""The built-in verifiable math tasks: ``calculator``, ``chain-calculator`` and ``arithmetic``.

Agent protocol (tags are single tokens, ``docs/architecture.md``, the embedded model and tasks):
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

from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.runner import EnvRunner
from asyncrl.rollout.envs.split import ProblemFn, draw_train, heldout_problems
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


MATH_STOP = ("</calc>", "</ans>")  # a turn ends at the first closing tag: the tool answers inline


class MathTurn:
    """The turn-level environment of a math task (an ordinary user of ``envs/interface.py``).

    ``reset`` takes a sample ``{"question": "47*38", ...}`` and poses it with the instructions and
    worked examples (the character alphabets render only the question); a turn ends at the first
    ``</calc>`` or ``</ans>`` (stop strings, so the tool's ``<res>..</res>`` is forced inline) or at
    the end-of-turn token. The tool is available when ``max_tool_calls > 0``.
    """

    truncated_reward = 0.0

    def __init__(self, task: str, max_tool_calls: int) -> None:
        self.task = task
        self.max_tool_calls = max_tool_calls
        self.problem: Problem | None = None
        self.calls = 0

    def reset(self, sample: dict[str, Any]) -> Reset:
        self.problem = parse_question(str(sample["question"]))
        self.calls = 0
        tool = self.max_tool_calls > 0
        system, examples = (SYSTEM_TOOL, EXAMPLES_TOOL) if tool else (SYSTEM_NO_TOOL, EXAMPLES_NO_TOOL)
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for q, a in examples:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": self.problem.prompt_text})
        return Reset(msgs, stop=MATH_STOP)

    def info(self) -> dict[str, Any]:
        p = self._need_problem()
        return {"question": p.question, "answer": p.answer, "tool_calls": self.calls}

    def _need_problem(self) -> Problem:
        if self.problem is None:
            raise RuntimeError(f"{self.task}: step() or info() called before reset()")
        return self.problem

    def step(self, msg: AssistantMessage) -> Turn:
        # The first closing tag in the turn is the one that ended it: with one token per tag (character
        # tokenizer) it is the turn's last token; a BPE token may carry text past it (``>.``), ignored.
        p, text = self._need_problem(), msg.text
        end = text.find("</ans>")
        if end >= 0:
            start = text.rfind("<ans>", 0, end)
            if start < 0:
                return Turn(done=True, reason="</ans> without <ans>")
            ok = text[start + len("<ans>") : end].strip() == str(p.answer)
            return Turn(done=True, reward=float(ok), success=ok, reason="answered")
        end = text.find("</calc>")
        if end >= 0:
            if self.max_tool_calls == 0:
                return Turn(done=True, reason="tool call in a task without the tool")
            self.calls += 1
            if self.calls > self.max_tool_calls:
                return Turn(done=True, reason=f"more than {self.max_tool_calls} tool calls")
            start = text.rfind("<calc>", 0, end)
            result = eval_call(text[start + len("<calc>") : end].strip()) if start >= 0 else "?"
            return Turn([{"role": "tool", "content": f"<res>{result}</res>"}])
        return Turn(done=True, reason=f"{msg.ended_by} without an answer")


@dataclass(frozen=True)
class MathSamples:
    """The samples of a math task: train-side problems from the group's rng, held-out ones by seed."""

    problem_fn: ProblemFn[Problem]

    def train(self, worker: int, index: int, rng: random.Random) -> dict[str, Any]:
        return problem_sample(draw_train(self.problem_fn, rng))

    def heldout(self, n: int, seed: int) -> list[dict[str, Any]]:
        return [problem_sample(p) for p in heldout_problems(self.problem_fn, n, seed)]


def problem_sample(p: Problem) -> dict[str, Any]:
    return {"question": p.question, "answer": p.answer}


class MathToolEnv(TurnAdapter):
    """One episode of a math task as the engines see it: :class:`MathTurn` behind the
    :class:`~asyncrl.rollout.envs.adapter.TurnAdapter` (the path every environment takes)."""

    def __init__(self, task: str, problem_fn: ProblemFn[Problem], tokenizer: Tokenizer, max_tool_calls: int,
                 fixed: Problem | None = None, *, runner: EnvRunner | None = None,
                 sample: dict[str, Any] | None = None) -> None:
        super().__init__(task, MathTurn(task, max_tool_calls), dict(sample or {}), tokenizer, runner=runner)
        self.max_tool_calls = max_tool_calls
        self._problem_fn = problem_fn
        self._fixed = fixed
        self.turn_env: MathTurn = self.env  # type: ignore[assignment]

    @property
    def problem(self) -> Problem | None:
        return self.turn_env.problem

    @property
    def calls(self) -> int:
        return self.turn_env.calls

    def reset(self, rng: random.Random | None = None) -> list[int]:
        """Pose this episode's sample; without one, the ``fixed`` problem (an evaluation prompt) or a
        train-side problem drawn from ``rng`` (envs/split.py)."""
        if not self.sample:  # type: ignore[has-type]  # (mypy: the base class declares it)
            if self._fixed is None and rng is None:
                raise ValueError(f"{self.task}: reset() needs an rng, a sample or a fixed problem")
            p = self._fixed if self._fixed is not None else draw_train(self._problem_fn, rng)  # type: ignore[arg-type]
            self.sample = problem_sample(p)
        return super().reset(rng)

    def load_prompt(self, prompt: list[int]) -> None:
        """Set the problem from prompt tokens (the last ``Q:<question>=?`` in them), e.g. to re-score."""
        text = self.tokenizer.decode(prompt, skip_special=True)
        found = _QUESTION.findall(text)
        if not found:
            raise ValueError(f"{self.task}: prompt {text!r} is not of the form 'Q:<question>=?'")
        self.sample = problem_sample(parse_question(found[-1]))
        super().reset()
