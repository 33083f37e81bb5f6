"""The turn-level environment interface: what a user implements to bring an agent task.

An environment sees *chat messages*, never tokens. asyncrl renders them through the model's chat
template, samples the assistant's turn, parses its tool calls, calls :meth:`TurnEnvironment.step`
with the finished turn and forces the observation it answers (never trained on: ``loss_mask``
False, version -1). Version stamps, partial rollouts across weight updates and the token budget
stay inside asyncrl (``rollout/envs/adapter.py``, ``rollout/episode.py``). A complete environment::

    from asyncrl.rollout.envs.interface import Reset, Turn

    class Guess:  # spec.task.environment: "mypkg.guess:Guess", spec.task.args: {low: 1, high: 9}
        def __init__(self, low: int = 1, high: int = 9) -> None:
            self.low, self.high, self.tries = low, high, 0
        def reset(self, sample: dict) -> Reset:  # a dataset row, or {"seed": int, "split": ...}
            self.target = self.low + sample["seed"] % (self.high - self.low + 1)
            return Reset([{"role": "user", "content": f"Guess my number ({self.low}-{self.high})."}])
        def step(self, msg) -> Turn:  # msg: AssistantMessage (.content, .tool_calls, .malformed)
            self.tries, guess = self.tries + 1, msg.content.strip()
            if guess == str(self.target) or self.tries == 3:
                return Turn(done=True, reward=float(guess == str(self.target)), success=guess == str(self.target))
            hint = "higher" if guess.isdigit() and int(guess) < self.target else "lower"
            return Turn([{"role": "user", "content": hint}])

Rules of the contract:

- ``Factory(**spec.task.args)`` is called once per episode (a fresh, stateful object each time); the
  job calls it once at start too, so a factory that fails to import or construct fails the job
  (exit code 2) before any rollout.
- ``reset`` returns a :class:`Reset` (or a plain list of messages); ``tools`` are OpenAI-style function
  schemas, rendered by the chat template (``apply_chat_template(..., tools=...)``).
- ``step`` is called once per assistant turn. A turn ends at the model's end-of-turn token (EOS) or,
  when ``Reset.stop`` names stop strings, at the first of them in the turn (the observation is then
  forced inline, continuing the assistant's text: the format of the built-in math tasks).
- ``step`` (and ``reset``) may be ``async def``: asyncrl awaits it off the decode loop; a plain
  ``def`` runs in a worker thread. Other episodes keep decoding while one waits.
- Failures never take the job down: an exception, a call past ``spec.task.envTimeoutSeconds``, a
  non-finite reward or messages that are not ``{"role": str, "content": str}`` abort that episode only
  (counted in ``asyncrl_env_errors_total{reason}``).
- Tool calls are parsed in the model's own format (``spec.task.toolCallFormat``: ``hermes``
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` or plain ``json``); a malformed call
  is in ``AssistantMessage.malformed`` (the environment scores it), never an exception.
"""

import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

Message = dict[str, Any]  # {"role": "system"|"user"|"assistant"|"tool", "content": str, ...}
Sample = dict[str, Any]  # one prompt's data: a dataset row, or {"seed": int, "split": "train"|"heldout"}
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
Split = Literal["train", "heldout"]


@dataclass(frozen=True)
class Reset:
    """The start of an episode: the conversation so far and the tools the assistant may call.

    ``stop``: strings that also end an assistant turn (first occurrence); empty = only the
    end-of-turn token does.
    """

    messages: Sequence[Message]
    tools: Sequence[Mapping[str, Any]] | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: ``arguments`` is the decoded JSON object."""

    name: str
    arguments: Mapping[str, Any]
    id: str = ""

    def to_message(self) -> dict[str, Any]:
        """OpenAI-style ``tool_calls`` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": dict(self.arguments)}}


@dataclass(frozen=True)
class AssistantMessage:
    """One finished assistant turn.

    ``text`` is all the sampled text of the turn (end-of-turn token excluded); ``content`` the text
    without tool-call blocks; ``malformed`` one description per tool call that could not be parsed;
    ``ended_by`` the end-of-turn token's text (``eos`` True) or the stop string that ended the turn.
    """

    text: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    malformed: tuple[str, ...] = ()
    ended_by: str = "<eos>"
    eos: bool = True

    def to_message(self) -> Message:
        """The OpenAI-style message (what the chat template renders for this turn)."""
        msg: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_message() for c in self.tool_calls]
        return msg


@dataclass(frozen=True)
class Turn:
    """The environment's answer to one assistant turn.

    ``observation``: messages to show the assistant before its next turn (tool results, the user's
    reply); ``reward`` and ``success`` are final only when ``done``.
    """

    observation: Sequence[Message] = ()
    done: bool = False
    reward: float = 0.0
    success: bool = False
    reason: str = ""


ResetResult = Reset | Sequence[Message]
StepResult = Turn | Awaitable[Turn]


@runtime_checkable
class TurnEnvironment(Protocol):
    """One episode of a user's agent task (see the module docstring). Optional, each its own protocol
    below: ``info() -> dict`` (:class:`WithInfo`) and ``truncated_reward: float``
    (:class:`WithTruncatedReward`); an environment without them works as is."""

    def reset(self, sample: Sample) -> ResetResult | Awaitable[ResetResult]: ...

    def step(self, msg: AssistantMessage) -> StepResult: ...


@runtime_checkable
class WithInfo(Protocol):
    """Optional on a :class:`TurnEnvironment`: ``info()``, plain data describing the episode's problem,
    copied into ``Trajectory.info`` (without it: ``{}``; when it raises: ``{"info_error": ...}``)."""

    def info(self) -> Mapping[str, Any]: ...


@runtime_checkable
class WithTruncatedReward(Protocol):
    """Optional on a :class:`TurnEnvironment`: the reward of an episode cut off by ``maxNewTokens``
    before it ended (without it: 0)."""

    truncated_reward: float


EnvFactory = Callable[..., TurnEnvironment]  # Factory(**spec.task.args) -> a fresh episode


@runtime_checkable
class SampleSource(Protocol):
    """Where an episode's ``sample`` comes from: a built-in task's generator or a dataset.

    ``train(worker, index, rng)`` is the sample of group ``index`` of rollout worker ``worker`` (the
    prompt cursor decides it, so a resumed run replays no prompt; ``rng`` is seeded from the job
    seed, worker and index); ``heldout(n, seed)`` the evaluation samples, disjoint from training.
    """

    def train(self, worker: int, index: int, rng: random.Random) -> Sample: ...

    def heldout(self, n: int, seed: int) -> list[Sample]: ...


@dataclass(frozen=True)
class SeededSamples:
    """The samples of an environment without a dataset: ``{"seed": int, "split": ...}``; the
    environment makes its own problem from the seed. Held-out seeds are odd, training seeds even,
    so the two never meet."""

    def train(self, worker: int, index: int, rng: random.Random) -> Sample:
        return {"seed": 2 * rng.randrange(2**40), "split": "train"}

    def heldout(self, n: int, seed: int) -> list[Sample]:
        rng = random.Random(seed)
        return [{"seed": 2 * rng.randrange(2**40) + 1, "split": "heldout"} for _ in range(n)]


def check_messages(messages: Any, what: str) -> list[Message]:
    """``messages`` as a list of well-formed chat messages, or a ``ValueError`` naming what is wrong
    (``what``: where they came from, e.g. ``"Guess.step observation"``)."""
    # ``type(x) is list`` / ``dict`` first: the common case, decided without the ABCs' instance checks
    if type(messages) is not list and (isinstance(messages, Mapping) or isinstance(messages, str | bytes)
                                       or not isinstance(messages, Sequence)):
        raise ValueError(f"{what}: expected a list of chat messages, got {type(messages).__name__}")
    out = []
    for i, m in enumerate(messages):
        if type(m) is not dict and not isinstance(m, Mapping):
            raise ValueError(f"{what}[{i}]: expected a dict with role and content, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise ValueError(f"{what}[{i}].role: {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"{what}[{i}].content: expected a string, got {type(content).__name__}")
        out.append(dict(m))
    return out


def check_turn(turn: Any, what: str) -> Turn:
    """``turn`` as a valid :class:`Turn` (finite reward, well-formed observation), else ``ValueError``."""
    if not isinstance(turn, Turn):
        raise ValueError(f"{what}: expected a Turn, got {type(turn).__name__}")
    if isinstance(turn.reward, bool) or not isinstance(turn.reward, int | float) or not math.isfinite(turn.reward):
        raise NonFiniteReward(f"{what}: reward {turn.reward!r} is not a finite number")
    obs = check_messages(turn.observation, f"{what}.observation")
    if not turn.done and not obs:
        raise ValueError(f"{what}: a turn that is not done must carry an observation for the next turn")
    return Turn(tuple(obs), bool(turn.done), float(turn.reward), bool(turn.success), str(turn.reason))


class NonFiniteReward(ValueError):
    """A reward that is NaN, infinite or not a number."""


__all__ = [
    "ROLES",
    "AssistantMessage",
    "EnvFactory",
    "Message",
    "NonFiniteReward",
    "Reset",
    "Sample",
    "SampleSource",
    "SeededSamples",
    "Split",
    "ToolCall",
    "Turn",
    "TurnEnvironment",
    "WithInfo",
    "WithTruncatedReward",
    "check_messages",
    "check_turn",
]
