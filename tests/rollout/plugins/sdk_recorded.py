"""The OpenAI Agents SDK example (examples/agents/cs_sdk_agent.py) with what it saw recorded, for test_agents_sdk.py.

It runs in the worker's agent runner process (``rollout/agent/runner.py``), so what it records crosses to the test
in a file of the folder ``$SDK_RECORD_DIR`` names (set by the test before the worker, and so its runner, starts):

- ``record.json``, written when the run ends: ``wire`` (each chat completion as it came over the wire), ``responses``
  (each model response as the SDK parsed it: its output items as ``[type, name, arguments]``) and ``tools`` (each tool
  the SDK ran: ``[name, result]``);
- ``pause.json``, written by the test when it wants to act between the first tool and the next request (a weight
  update): ``{"address": [host, port], "authkey": hex}`` of a ``multiprocessing.connection.Listener``. After the
  first tool ran, the hook sends ``"tool"`` there and waits for the test's answer, off the event loop (the runner's
  heartbeat goes on), so the next request leaves only once the test has done its part.
"""

import asyncio
import json
import multiprocessing.connection
import os
from pathlib import Path
from typing import Any

import openai
from agents import RunHooks
from agents.items import ModelResponse


def _dir() -> Path:
    return Path(os.environ["SDK_RECORD_DIR"])


class _Recorder(RunHooks[Any]):
    def __init__(self) -> None:
        self.responses: list[list[list[Any]]] = []
        self.tools: list[list[str]] = []

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        self.responses.append([[i.type, getattr(i, "name", None), getattr(i, "arguments", None)]
                               for i in response.output])

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        self.tools.append([tool.name, str(result)])
        pause = _dir() / "pause.json"
        if len(self.tools) == 1 and pause.exists():
            await asyncio.get_running_loop().run_in_executor(None, _hand_over, json.loads(pause.read_text()))


def _hand_over(pause: dict[str, Any]) -> None:
    """Tell the test the first tool ran and wait until it answers (it has done its part)."""
    with multiprocessing.connection.Client(tuple(pause["address"]), authkey=bytes.fromhex(pause["authkey"])) as c:
        c.send("tool")
        c.recv()


async def recorded_run(client: Any, sample: dict[str, Any]) -> float:
    """The example's ``run`` with the recorder as its hooks and the raw responses kept (an HTTP client hook)."""
    import cs_sdk_agent  # on the path once the runner bound the task (spec.task.pythonPath)

    rec, wire = _Recorder(), []

    async def keep(r: Any) -> None:  # an httpx response (the client the openai package builds on)
        if r.request.url.path.endswith("/chat/completions"):
            await r.aread()
            wire.append(r.json())

    try:
        async with openai.DefaultAsyncHttpxClient(event_hooks={"response": [keep]}) as http:
            return await cs_sdk_agent.run(client.with_options(http_client=http), sample, hooks=rec)
    finally:
        out = _dir() / "record.json"
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"wire": wire, "responses": rec.responses, "tools": rec.tools}))
        tmp.replace(out)
