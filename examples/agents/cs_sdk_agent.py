"""The customer-service task as an OpenAI Agents SDK agent: SDK code that asyncrl trains unchanged.

asyncrl calls ``run(client, sample)`` once per episode (``spec.task.agent: cs_sdk_agent:run``). ``client`` is an
``openai.AsyncOpenAI`` pointed at the rollout worker's OpenAI-compatible endpoint with a key of this episode only;
every chat completion the SDK asks for is one assistant turn sampled by the policy being trained, and everything the
SDK adds between turns (its rendering of the tool results) is shown to the model but never trained on.

The agent is what a user of the ``openai-agents`` package writes: three function tools (``orders``, ``cancel``,
``refund``) over this episode's order database, an ``Agent`` with the shop's instructions on the Chat Completions
API (``OpenAIChatCompletionsModel``), run by ``Runner.run`` under a bound on its turns. The only asyncrl import is the
task's own module, for what defines the task: the scenario of the sample, the tools' JSON schemas and what they do to
the database, and the goal check (the reward: 1.0 when the database's final state is the goal's, else 0.0).
"""

import json
import random
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    OpenAIChatCompletionsModel,
    RunHooks,
    Runner,
    Tool,
    set_tracing_disabled,
)
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from agents.tool_context import ToolContext

from asyncrl.rollout.envs.customer_service import (
    SYSTEM,
    TOOLS,
    Db,
    Scenario,
    ScenarioSamples,
    call_tool,
    goal_reached,
    new_db,
)

set_tracing_disabled(True)  # the SDK's traces go to OpenAI's servers by default; a training job has no network
MAX_TURNS = 6  # model calls per episode: the lookup, the action and the reply, with room for one mistake or two


def scenario(sample: dict[str, Any]) -> Scenario:
    """The episode's scenario: a dataset row that holds one, else one drawn from the sample's seed on the side of
    the task's own train / held-out split that the sample names (``{"seed": int, "split": "train" | "heldout"}``)."""
    if "user" in sample:
        return Scenario.from_sample(sample)
    draw = ScenarioSamples()
    if sample.get("split") == "heldout":
        return Scenario.from_sample(draw.heldout(1, sample["seed"])[0])
    return Scenario.from_sample(draw.train(0, 0, random.Random(sample["seed"])))


def shop_tools(s: Scenario, db: Db) -> list[Tool]:
    """``orders``, ``cancel`` and ``refund`` over the episode's order database ``db`` (changed in place), with the
    task's own schemas and rules: the model sees the same tools as in the built-in task (a model warm-started there
    knows them), and a wrong action (another order, the other tool) leaves the goal out of reach for good, as it
    ends the built-in task's episode (the SDK's run goes on until the model stops, its reward is 0)."""

    def tool(schema: dict[str, Any]) -> FunctionTool:
        name = schema["function"]["name"]

        async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
            args = json.loads(arguments) if arguments.strip() else {}
            return call_tool(s, db, name, args)[0]  # the task's tool and rules, on this episode's database

        return FunctionTool(name=name, description=schema["function"]["description"],
                            params_json_schema=schema["function"]["parameters"], on_invoke_tool=invoke,
                            strict_json_schema=False)

    return [tool(dict(t)) for t in TOOLS]


async def run(client: Any, sample: dict[str, Any], hooks: RunHooks[Any] | None = None) -> float:
    """One episode: the user's request, the agent's turns, the reward of the database's final state.

    ``hooks``: the SDK's run hooks (e.g. to log each tool call); asyncrl calls ``run(client, sample)``."""
    s = scenario(sample)
    db = new_db(s)  # this episode's order database
    agent = Agent(name="shop", instructions=SYSTEM, tools=shop_tools(s, db),
                  model=OpenAIChatCompletionsModel(model="policy", openai_client=client))
    try:
        await Runner.run(agent, s.request, max_turns=MAX_TURNS, hooks=hooks)
    except (MaxTurnsExceeded, ModelBehaviorError):  # too many calls, or a call of a tool that does not exist
        return 0.0
    return float(goal_reached(s, db))
