"""The conversation of ``bench/agent_endpoint.py``, written both ways a user can bring it: an environment class
(``spec.task.environment: "bench_agents:Conversation"``) and an agent function over the real ``openai`` client
(``spec.task.agent: "bench_agents:conversation"``).

Both hold the same episode: a system and a user message (the user's ``prompt_chars`` long), then ``turns``
assistant turns of exactly ``max_tokens`` sampled tokens, each but the last answered by a user message
``follow_chars`` long. The bench's model always samples :data:`FILL` and never its end-of-turn token, so:

- the agent asks ``max_tokens`` per request and every turn ends there (``finish_reason: length``); the endpoint
  then forces the end-of-turn token and the follow-up;
- the environment class, which has no per-turn token limit, ends the turn with a stop string of ``max_tokens``
  :data:`FILL` s and writes one character (:data:`TURN_END_STAND_IN`) in front of its follow-up where the endpoint
  forces its end-of-turn token, so both trajectories hold as many tokens, sampled and forced. (An environment's
  messages are data: ``<eos>`` typed there is five characters, not the end-of-turn id.)

What each side saw is kept here, read and cleared by the bench between ``generate`` calls: the agent's request
latencies (:data:`LATENCIES`, the client's time from request to response) and the environment's turn gaps
(:data:`STEP_GAPS`, from the observation handed back to the next turn: the engine's time for that turn).
"""

import time
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn

FILL = "a"  # the one character the bench's model samples
TURN_END_STAND_IN = "\n"  # one token, where the endpoint forces the end-of-turn id (content cannot write that id)
TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                           "required": ["q"]}}}]
_TEXT = "the quick brown fox jumps over the lazy dog and keeps running past the river bank "


@dataclass(frozen=True)
class Shape:
    """One episode's shape (the environment gets it as ``spec.task.args``; the agent reads :data:`SHAPE`)."""

    turns: int = 4
    max_tokens: int = 16
    prompt_chars: int = 64
    follow_chars: int = 12


SHAPE = Shape()  # what the agent function runs: the bench sets it before it starts a worker (one process)
LATENCIES: list[tuple[int, float]] = []  # (turn, seconds) per request, appended on the agents' loop
STEP_GAPS: list[tuple[int, float]] = []  # (turn, seconds) per environment turn, appended on the runner's loop


def _text(head: str, n: int) -> str:
    return (head + _TEXT * (1 + n // len(_TEXT)))[:n]


def first_messages(sample: dict[str, Any], shape: Shape) -> list[dict[str, Any]]:
    """The system and user message an episode starts with (the user's content ``prompt_chars`` long)."""
    return [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": _text(f"task {int(sample.get('seed', 0)) % 1000:03d}: ", shape.prompt_chars)}]


def follow_up(turn: int, shape: Shape) -> str:
    """The user's answer to assistant turn ``turn`` (0-based), ``follow_chars`` long."""
    return _text(f"more {turn}: ", shape.follow_chars)


async def converse(client: Any, sample: dict[str, Any], shape: Shape, record: list[tuple[int, float]]) -> float:
    """The episode through the endpoint: ``turns`` chat completions of ``max_tokens`` each (latencies to ``record``)."""
    messages = first_messages(sample, shape)
    for k in range(shape.turns):
        t0 = time.perf_counter()
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=shape.max_tokens,
                                                 tools=TOOLS)
        record.append((k, time.perf_counter() - t0))
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
        if k + 1 < shape.turns:
            messages.append({"role": "user", "content": follow_up(k, shape)})
    return 1.0


async def conversation(client: Any, sample: dict[str, Any]) -> float:
    """The agent function (``spec.task.agent: "bench_agents:conversation"``): :func:`converse` at :data:`SHAPE`."""
    return await converse(client, sample, SHAPE, LATENCIES)


class Conversation:
    """The episode as an environment class (``Conversation(**asdict(shape))``)."""

    def __init__(self, turns: int = 4, max_tokens: int = 16, prompt_chars: int = 64, follow_chars: int = 12) -> None:
        self.shape = Shape(turns, max_tokens, prompt_chars, follow_chars)
        self.k = 0
        self._back = 0.0  # when the last observation was handed back

    def reset(self, sample: dict[str, Any]) -> Reset:
        self._back = time.perf_counter()
        return Reset(first_messages(sample, self.shape), tools=TOOLS, stop=(FILL * self.shape.max_tokens,))

    async def step(self, msg: AssistantMessage) -> Turn:
        STEP_GAPS.append((self.k, time.perf_counter() - self._back))
        self.k += 1
        if self.k >= self.shape.turns:
            return Turn(done=True, reward=1.0, success=True, reason="conversation over")
        self._back = time.perf_counter()
        return Turn([{"role": "user", "content": TURN_END_STAND_IN + follow_up(self.k - 1, self.shape)}])
