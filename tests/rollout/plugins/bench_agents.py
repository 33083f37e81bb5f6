"""The conversation of ``bench/agent_endpoint.py``, written both ways a user can bring it: an environment class
(``spec.task.environment: "bench_agents:Conversation"``) and an agent function over the real ``openai`` client
(``spec.task.agent: "bench_agents:conversation"``).

Both hold the same episode: a system and a user message (the user's ``prompt_chars`` long), then ``turns``
assistant turns of exactly ``max_tokens`` sampled tokens, each but the last answered by a user message
``follow_chars`` long. The bench's model always samples :data:`FILL` and never its end-of-turn token, so:

- the agent asks ``max_tokens`` per request and every turn ends there (``finish_reason: length``); the endpoint
  then forces the end-of-turn token and the follow-up;
- the environment class, which has no per-turn token limit, ends the turn with a stop string of ``max_tokens``
  :data:`FILL` s and writes the same end-of-turn token (``<eos>``) in front of its follow-up, so both
  trajectories hold the same tokens, sampled and forced.

What each side saw is kept here, read and cleared by the bench between ``generate`` calls: the agent's request
latencies (:data:`LATENCIES`, the client's time from request to response) and the environment's turn gaps
(:data:`STEP_GAPS`, from the observation handed back to the next turn: the engine's time for that turn).

:func:`conversation_elsewhere` is the same agent run in a helper process (:class:`Elsewhere`, this file run with
``--serve``): the worker's agent function only hands the session's base URL and key over a pipe and waits for the
reward, so the ``openai`` client's CPU is spent outside the worker's interpreter (the bench's what-if of running a
worker's agents in a process of their own).
"""

import asyncio
import json
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn

FILL = "a"  # the one character the bench's model samples
EOS_TEXT = "<eos>"  # the character tokenizer's end-of-turn token, as text its encoder reads as that one id
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
        return Turn([{"role": "user", "content": EOS_TEXT + follow_up(self.k - 1, self.shape)}])


# ------------------------------------------------------------------------------------------ agents elsewhere
class Elsewhere:
    """A helper process that runs :func:`conversation` for the worker's sessions (``python bench_agents.py
    --serve``): one JSON line per session each way. Its request latencies join :data:`LATENCIES` before the
    session's reward is handed back."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[float]]] = {}
        self._n = 0
        self._reader = threading.Thread(target=self._read, name="bench-elsewhere", daemon=True)
        self._reader.start()

    async def run(self, base_url: str, key: str, sample: dict[str, Any], shape: Shape) -> float:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[float] = loop.create_future()
        with self._lock:
            self._n += 1
            self._waiting[self._n] = (loop, fut)
            line = json.dumps({"id": self._n, "base_url": base_url, "key": key, "sample": sample,
                               "shape": [shape.turns, shape.max_tokens, shape.prompt_chars, shape.follow_chars]})
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        return await fut

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            msg = json.loads(line)
            with self._lock:
                loop, fut = self._waiting.pop(msg["id"])
            LATENCIES.extend((int(k), float(x)) for k, x in msg["latencies"])
            if "error" in msg:
                loop.call_soon_threadsafe(fut.set_exception, RuntimeError(msg["error"]))
            else:
                loop.call_soon_threadsafe(fut.set_result, float(msg["reward"]))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)


ELSEWHERE: Elsewhere | None = None  # started by the bench before a worker runs conversation_elsewhere


async def conversation_elsewhere(client: Any, sample: dict[str, Any]) -> float:
    """:func:`conversation`, run by the helper process with this session's base URL and key."""
    assert ELSEWHERE is not None, "bench_agents.ELSEWHERE: start an Elsewhere first"
    return await ELSEWHERE.run(str(client.base_url), str(client.api_key), sample, SHAPE)


def _serve() -> None:
    """The helper process: run one :func:`conversation` per line read, each with its own client (one SSL context for
    all of them), and write its reward and request latencies back."""
    import openai

    loop = asyncio.new_event_loop()
    out_lock = threading.Lock()
    context = ssl.create_default_context()

    async def one(msg: dict[str, Any]) -> None:
        record: list[tuple[int, float]] = []
        reply: dict[str, Any] = {"id": msg["id"]}
        try:
            async with openai.AsyncOpenAI(base_url=msg["base_url"], api_key=msg["key"], max_retries=0, timeout=600.0,
                                          http_client=openai.DefaultAsyncHttpxClient(verify=context)) as client:
                reply["reward"] = await converse(client, msg["sample"], Shape(*msg["shape"]), record)
        except Exception as exc:  # the worker's agent function raises it again (agent_exception)
            reply["error"] = f"{type(exc).__name__}: {exc}"
        reply["latencies"] = record
        with out_lock:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()

    def read() -> None:
        for line in sys.stdin:
            asyncio.run_coroutine_threadsafe(one(json.loads(line)), loop)
        loop.call_soon_threadsafe(loop.stop)

    threading.Thread(target=read, daemon=True).start()
    loop.run_forever()


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
