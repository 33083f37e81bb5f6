"""Agent functions for the endpoint's tests: OpenAI-API agents written as a user would (the real openai client)."""

from typing import Any

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                            "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                                                           "required": ["q"]}}}]


async def three_turns(client: Any, sample: dict) -> float:
    """Three turns of a conversation, each a user message after the model's answer, at most 6 tokens each."""
    messages: list[dict] = [{"role": "system", "content": "be brief"},
                            {"role": "user", "content": f"hello {sample.get('seed', 0) % 97}"}]
    for k in range(3):
        r = await client.chat.completions.create(model="policy", messages=messages, max_tokens=6, tools=TOOLS)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": f"more {k}"})
    return float(len(messages) % 2)
