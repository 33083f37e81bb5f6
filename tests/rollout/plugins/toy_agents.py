"""Agent functions for the endpoint's tests: OpenAI-API agents written as a user would (the real openai client)."""

import asyncio
import threading
from typing import Any

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                           "required": ["q"]}}}]

# what the agents saw, by the sample's "tag" (the tests read it): the answers' contents, in order
SEEN: dict[str, list[str]] = {}
HANG = threading.Event()  # set by a test to release the hanging agent (never set: it hangs past the timeout)


def _first(sample: dict) -> list[dict]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"hello {sample.get('seed', 0) % 97}"}]


async def three_turns(client: Any, sample: dict) -> float:
    """Three turns of a conversation, each a user message after the model's answer, at most 6 tokens each."""
    messages = _first(sample)
    seen = SEEN.setdefault(str(sample.get("seed")), [])
    for k in range(3):
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6, tools=TOOLS)
        msg = r.choices[0].message
        seen.append(msg.content or "")
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
