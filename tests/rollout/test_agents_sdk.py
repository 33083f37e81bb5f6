"""An OpenAI Agents SDK agent trains through the rollout worker's endpoint unchanged: the real ``openai-agents``
package (examples/agents/cs_sdk_agent.py, the customer-service task), real HTTP, a real tiny torch model taught the
scripted conversation (tests/support/scripted_model.py), so the SDK drives a multi-turn tool-use episode:
the lookup, the action, the reply.

Checked: the SDK's requests extend one conversation (no branch), the endpoint answers tool calls in OpenAI's
``tool_calls`` form and the SDK executes them, the reward is the task's goal check, every sampled turn is exactly one
run of ``loss_mask`` True (the client's answer, token for token) with its version and a finite ``logp_mu``, and
everything the SDK rendered (its prompt, the tool results) is forced with version -1. A weight update from inside
the SDK's run, after the first tool call, stamps the later turns with the new version.
"""

import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from agents import RunHooks
from agents.items import ModelResponse

from asyncrl.api.dataset import DatasetSpec
from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs.customer_service import SYSTEM, Scenario, call_text, draw_scenario
from asyncrl.rollout.tokenizer import HFTokenizer, Tokenizer
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker
from tests.support.helpers import ROOT
from tests.support.scripted_model import Taught, sampled_runs, teach_script

EXAMPLES = str(ROOT / "examples" / "agents")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
FINAL = "Done."


@dataclass
class Recorder(RunHooks[Any]):
    """What the SDK saw of one episode: each chat completion as it came over the wire, each model response as the SDK
    parsed it, each tool it ran (name, result); ``on_first_tool`` is called once, after the first tool ran."""

    wire: list[dict[str, Any]] = field(default_factory=list)
    responses: list[ModelResponse] = field(default_factory=list)
    tools: list[tuple[str, str]] = field(default_factory=list)
    on_first_tool: Callable[[], None] | None = None

    async def on_llm_end(self, context: Any, agent: Any, response: ModelResponse) -> None:
        self.responses.append(response)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: object) -> None:
        self.tools.append((tool.name, str(result)))
        if len(self.tools) == 1 and self.on_first_tool is not None:
            self.on_first_tool()


RECORD = Recorder()


async def recorded_run(client: Any, sample: dict[str, Any]) -> float:
    """The example's ``run`` with :data:`RECORD` as its hooks and the raw responses recorded (an HTTP client hook)."""
    import cs_sdk_agent  # on the path once the worker bound the task (spec.task.pythonPath)

    async def keep(r: Any) -> None:  # an httpx response (the client the openai package builds on)
        if r.request.url.path.endswith("/chat/completions"):
            await r.aread()
            RECORD.wire.append(r.json())

    async with openai.DefaultAsyncHttpxClient(event_hooks={"response": [keep]}) as http:
        return await cs_sdk_agent.run(client.with_options(http_client=http), sample, hooks=RECORD)


@dataclass
class Scripted:
    """A worker of the SDK agent over one scenario, the script of that scenario and the model taught it."""

    worker: RolloutWorker
    scenario: Scenario
    script: list[str]
    taught: Taught
    tail: str  # what the tokenizer forces for a tool message after a turn ({} the tool's result)


def _smollm2() -> Tokenizer:
    from transformers import AutoTokenizer

    from asyncrl.rollout.smollm import smollm2_gguf

    path = smollm2_gguf()
    return HFTokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), "smollm2")


@pytest.fixture(scope="module", params=[
    "char-text",  # the worker's own for a model without one: renders the user's request and the tools' content
    # a real chat template: the SDK's instructions and the tools' schemas in the prompt, the template's tails forced
    pytest.param("smollm2", marks=pytest.mark.slow),  # 15-30 s: a 49k vocabulary on two shared cores
])
def scripted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scripted]:
    """A worker whose agent is the SDK example over one scenario, and a tiny model taught its script."""
    s = draw_scenario(random.Random(7))
    data = Path(tmp_path_factory.mktemp("cs")) / "scenario.jsonl"
    data.write_text(json.dumps({"prompt": s.request, **s.to_sample()}) + "\n")
    spec = TaskSpec(agent=f"{__name__}:recorded_run", python_path=[EXAMPLES], group_size=1, max_new_tokens=300,
                    temperature=0.05, dataset=DatasetSpec(path=str(data), answer_field=None, heldout_fraction=0.0))
    tok = _smollm2() if request.param == "smollm2" else None
    tail = "\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n" if tok is not None else "{}"
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True), tokenizer=tok)
    assert w.tokenizer.name == request.param
    script = [call_text("orders", user=s.user), call_text(s.intent, order=s.target), FINAL]
    try:
        taught = teach_script(w, script, lambda: play(w))
        yield Scripted(w, s, script, taught, tail)
    finally:
        w.close()


def play(w: RolloutWorker, on_first_tool: Callable[[], None] | None = None) -> Trajectory:
    """One SDK episode through ``w`` (the dataset's one scenario), recorded afresh in :data:`RECORD`."""
    RECORD.wire.clear()
    RECORD.responses.clear()
    RECORD.tools.clear()
    RECORD.on_first_tool = on_first_tool
    (t,) = w.generate(1)
    return t


def test_the_sdk_agent_drives_a_tool_use_conversation_and_only_its_sampled_turns_are_trained(
        scripted: Scripted) -> None:
    w, s, script = scripted.worker, scripted.scenario, scripted.script
    w.load_weights(scripted.taught.state_dict, version=0)
    before = w.agent_counters()
    t = play(w)
    assert t.status is TrajectoryStatus.FINISHED and t.reward == 1.0 and t.success, t.info
    assert t.info["agent"] == {"requests": 3, "retries": 0, "branches": 0}
    assert w.agent_counters()["prefix_mismatch"] == before["prefix_mismatch"]  # every request extended the last

    # the endpoint answered the two calls in OpenAI's tool_calls form, the SDK parsed them and ran the tools
    calls = [("orders", {"user": s.user}), (s.intent, {"order": s.target})]
    for raw, (name, args) in zip(RECORD.wire[:2], calls, strict=True):
        choice = raw["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == name
        assert json.loads(call["function"]["arguments"]) == args
    assert RECORD.wire[2]["choices"][0]["finish_reason"] == "stop"
    assert RECORD.wire[2]["choices"][0]["message"]["content"] == FINAL
    assert RECORD.wire[2]["choices"][0]["message"]["tool_calls"] is None
    parsed = [[(i.type, getattr(i, "name", None), getattr(i, "arguments", None)) for i in r.output]
              for r in RECORD.responses]
    assert parsed[:2] == [[("function_call", n, json.dumps(a))] for n, a in calls]
    assert [i.type for i in RECORD.responses[2].output] == ["message"]
    orders = ";".join(" ".join(o) for o in s.orders)
    assert RECORD.tools == [("orders", orders), (s.intent, "ok")]

    # token labelling: the SDK's prompt, then per turn exactly the sampled ids, then what the SDK added, forced
    tok = w.tokenizer
    eos = tok.decode([tok.eos_id])
    prompt = tok.decode(t.tokens[: t.prompt_len])
    assert s.request in prompt and not any(t.loss_mask[: t.prompt_len])
    if isinstance(tok, HFTokenizer):  # the template renders the SDK's instructions and the task's tool schemas
        assert SYSTEM in prompt and all(f'"name":"{n}"' in prompt for n in ("orders", "cancel", "refund"))
    runs = sampled_runs(t)
    assert [tok.decode(t.tokens[a:b]) for a, b in runs] == [turn + eos for turn in script]
    assert sum(t.loss_mask) == sum(b - a for a, b in runs) and runs[-1][1] == len(t.tokens)
    forced = [tok.decode(t.tokens[b:a]) for (_, b), (a, _) in zip(runs, runs[1:], strict=False)]
    assert forced == [scripted.tail.format(result) for _, result in RECORD.tools]
    for i in range(len(t.tokens)):
        if t.loss_mask[i]:
            assert t.versions[i] == 0 and math.isfinite(t.logp_mu[i]) and t.logp_mu[i] <= 0.0
        else:
            assert t.versions[i] == NO_VERSION
    assert t.turn_ids[runs[2][0]] == 2 and not t.is_partial


def test_a_weight_update_from_inside_the_sdk_run_stamps_the_later_turns_with_the_new_version(
        scripted: Scripted) -> None:
    w, taught = scripted.worker, scripted.taught
    w.load_weights(taught.state_dict, version=0)
    t = play(w, on_first_tool=lambda: w.update_weights(taught.state_dict, version=1))
    assert t.status is TrajectoryStatus.FINISHED and t.reward == 1.0, t.info
    assert w.version == 1 and [name for name, _ in RECORD.tools] == ["orders", scripted.scenario.intent]
    runs = sampled_runs(t)
    assert len(runs) == 3
    stamps = [sorted(set(t.versions[a:b])) for a, b in runs]
    assert stamps == [[0], [1], [1]]  # sampled before the update: 0; after the first tool call: 1
    assert t.is_partial and all(math.isfinite(t.logp_mu[i]) for i, m in enumerate(t.loss_mask) if m)
    assert all(v == NO_VERSION for v, m in zip(t.versions, t.loss_mask, strict=True) if not m)


def test_the_example_uses_only_the_tasks_public_names() -> None:
    """The example is what a user writes: it reaches the task through its public functions (``new_db``, ``run_tool``,
    ``goal_reached``), never a private member of the environment class."""
    import ast

    tree = ast.parse((Path(EXAMPLES) / "cs_sdk_agent.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
        "asyncrl") for a in n.names]
    private = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
               and not n.attr.startswith("__")]
    assert {"new_db", "run_tool", "goal_reached"} <= set(imported) and "CustomerService" not in imported
    assert not [name for name in imported if name.startswith("_")] and private == []
