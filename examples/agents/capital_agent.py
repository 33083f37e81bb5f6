"""An OpenAI-API agent trained by asyncrl (examples/agent.yaml): plain ``openai`` code, nothing of asyncrl.

asyncrl calls ``run(client, sample)`` once per episode. ``client`` is an ``openai.AsyncOpenAI`` already pointed at
the rollout worker's endpoint with a key of this episode only; ``sample`` is one row of the job's dataset (here
``{"prompt": ..., "answer": ..., "category": ...}`` from examples/tasks/data.jsonl). Every chat completion the agent
asks for is one assistant turn sampled by the policy being trained; what the agent adds between turns (the tool's
answer, its own feedback) is shown to the model but never trained on.

The agent asks the question with a ``hint`` tool available; when the model calls the tool it gets the first letter
of the answer and asks again; a wrong answer gets one more try. It returns None, so the job's ``task.reward``
(examples/tasks/my_reward.py) scores the final answer against the row's ``answer``; return a float to score it
yourself.
"""

import json
from typing import Any

TOOLS = [{
    "type": "function",
    "function": {"name": "hint", "description": "The first letter of the answer.",
                 "parameters": {"type": "object", "properties": {}, "required": []}},
}]
SYSTEM = "Answer with the name of the city only. Call hint if you are unsure."


async def run(client: Any, sample: dict[str, Any]) -> float | None:
    prompt = sample["prompt"]  # a question, or (some rows) already a list of chat messages
    turns = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, *turns]
    for _ in range(3):
        r = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=16)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:  # answer every call, then let the model go on
            for call in msg.tool_calls:
                messages.append({"role": "tool", "tool_call_id": call.id,
                                 "content": json.dumps({"first_letter": str(sample["answer"])[:1].upper()})})
            continue
        if (msg.content or "").strip().lower() == str(sample["answer"]).lower():
            break
        messages.append({"role": "user", "content": "Not quite. Try once more."})
    return None  # task.reward scores the last answer
