"""Agent functions for the endpoint's tests: OpenAI-API agents written as a user would (the real openai client).

They run in the worker's agent runner process (``rollout/agent/runner.py``), so what they record for the tests
crosses in files of a folder the test process names (``$TOY_AGENTS_DIR``, inherited by the runner)."""

import asyncio
import atexit
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if "TOY_AGENTS_DIR" not in os.environ:  # the test process makes the folder (its runner processes inherit it) and removes it
    os.environ["TOY_AGENTS_DIR"] = tempfile.mkdtemp(prefix="toy-agents-")
    atexit.register(shutil.rmtree, os.environ["TOY_AGENTS_DIR"], ignore_errors=True)
DIR = Path(os.environ["TOY_AGENTS_DIR"])

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                           "required": ["q"]}}}]

class _Seen:
    """What the agents saw, by the sample's seed: the answers' contents, in order (one JSON line each, in
    ``DIR/seen-<seed>.jsonl``, written by the runner process, read by the test)."""

    def append(self, seed: str, content: str) -> None:
        with open(DIR / f"seen-{seed}.jsonl", "a") as f:
            f.write(json.dumps(content) + "\n")

    def values(self) -> Iterator[list[str]]:
        for p in sorted(DIR.glob("seen-*.jsonl")):
            yield [json.loads(line) for line in p.read_text().splitlines()]


SEEN = _Seen()
HANG = threading.Event()  # set by a test to release the hanging agent (never set: it hangs past the timeout)


def _first(sample: dict) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"hello {sample.get('seed', 0) % 97}"}]


async def three_turns(client: Any, sample: dict, fault: str = "") -> float:
    """Three turns of a conversation, each a user message after the model's answer, at most 6 tokens each
    (``fault``: what the first session to get here does after its first turn, see :func:`exits_once`)."""
    messages = _first(sample)
    for k in range(3):
        if k == 1 and fault == "exits" and _first_time(fault):
            os._exit(3)
        if k == 1 and fault == "blocks" and _first_time(fault):
            time.sleep(120)
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6, tools=TOOLS)
        msg = r.choices[0].message
        SEEN.append(str(sample.get("seed")), msg.content or "")
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"more {k}"})
    return 0.5


async def edits_history(client: Any, sample: dict) -> float:
    """Two turns, then a request whose history drops the first exchange (a harness that truncates): a new branch."""
    messages = _first(sample)
    for k in range(2):
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=5)
        messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": f"next {k}"}]
    rewritten = [messages[0], {"role": "user", "content": "start over"}]
    r = await client.chat.completions.create(model="policy", messages=rewritten, max_tokens=5)
    rewritten += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and again"}]
    await client.chat.completions.create(model="policy", messages=rewritten, max_tokens=5)
    return 1.0


async def raises(client: Any, sample: dict) -> float:
    await client.chat.completions.create(model="policy", messages=_first(sample), max_tokens=3)
    raise RuntimeError("the agent's own bug")


async def hangs(client: Any, sample: dict) -> float:
    await client.chat.completions.create(model="policy", messages=_first(sample), max_tokens=3)
    await asyncio.get_running_loop().run_in_executor(None, HANG.wait, 30)
    return 0.0


async def no_reward(client: Any, sample: dict) -> None:
    await client.chat.completions.create(model="policy", messages=_first(sample), max_tokens=3)
    return None


async def never_calls(client: Any, sample: dict) -> float:
    return 1.0


async def malformed(client: Any, sample: dict) -> float:
    await client.chat.completions.create(model="policy", messages=_first(sample), max_tokens=3)
    # an image part: the endpoint serves text only (400), and the episode is aborted
    await client.chat.completions.create(model="policy", max_tokens=3, messages=[
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}])
    return 1.0


async def nan_reward(client: Any, sample: dict) -> float:
    await client.chat.completions.create(model="policy", messages=_first(sample), max_tokens=3)
    return float("nan")


async def by_seed(client: Any, sample: dict) -> float:
    """A mixed group: the agent's behaviour follows its sample's seed (fault injection per session)."""
    kind = ("ok", "raises", "no_request")[sample["seed"] % 3]
    if kind == "raises":
        return await raises(client, sample)
    if kind == "no_request":
        return await never_calls(client, sample)
    return await three_turns(client, sample)


def _first_time(what: str) -> bool:
    """True for the first caller of ``what`` in this test process's folder (any process, any session)."""
    try:
        (DIR / f"once-{what}").open("x").close()
        return True
    except FileExistsError:
        return False


async def exits_once(client: Any, sample: dict) -> float:
    """The first session ends the runner's interpreter (``os._exit``) after its first turn; later ones are healthy."""
    return await three_turns(client, sample, "exits")


async def blocks_once(client: Any, sample: dict) -> float:
    """The first session blocks the runner's event loop (a synchronous sleep) after its first turn."""
    return await three_turns(client, sample, "blocks")


async def returns_text(client: Any, sample: dict) -> Any:
    await client.chat.completions.create(model="policy", messages=_first(sample), max_tokens=3)
    return "1.0"
