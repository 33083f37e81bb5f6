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
import multiprocessing.connection
import os
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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
PLUGINS = str(Path(__file__).parent / "plugins")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
FINAL = "Done."


@dataclass(frozen=True)
class Record:
    """What the SDK saw of one episode (written by tests/rollout/plugins/sdk_recorded.py in the runner process): each
    chat completion as it came over the wire, each model response as the SDK parsed it (its output items as
    ``(type, name, arguments)``), each tool it ran (name, result)."""

    wire: list[dict[str, Any]]
    responses: list[list[tuple[str, str | None, str | None]]]
    tools: list[tuple[str, str]]

    @classmethod
    def read(cls, folder: Path) -> "Record | None":
        """The record of the episode that just ended; None while the agent has not ended (an episode the worker
        ended first, at ``maxNewTokens``: the agent's run is then cancelled in the runner, and may write later)."""
        path = folder / "record.json"
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return cls(raw["wire"], [[tuple(i) for i in r] for r in raw["responses"]], [tuple(t) for t in raw["tools"]])


@dataclass
class Scripted:
    """A worker of the SDK agent over one scenario, the script of that scenario and the model taught it."""

    worker: RolloutWorker
    scenario: Scenario
    script: list[str]
    taught: Taught
    tail: str  # what the tokenizer forces for a tool message after a turn ({} the tool's result)
    folder: Path  # $SDK_RECORD_DIR: where the runner's agent writes its record


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
    folder = Path(tmp_path_factory.mktemp("sdk-record"))
    spec = TaskSpec(agent="sdk_recorded:recorded_run", python_path=[EXAMPLES, PLUGINS], group_size=1, max_new_tokens=300,
                    temperature=0.05, dataset=DatasetSpec(path=str(data), answer_field=None, heldout_fraction=0.0))
    tok = _smollm2() if request.param == "smollm2" else None
    tail = "\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n" if tok is not None else "{}"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SDK_RECORD_DIR", str(folder))  # inherited by the worker's agent runner, started with the worker
        w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True), tokenizer=tok)
        try:
            assert w.tokenizer.name == request.param
            script = [call_text("orders", user=s.user), call_text(s.intent, order=s.target), FINAL]
            taught = teach_script(w, script, lambda: play(w, folder)[0])
            yield Scripted(w, s, script, taught, tail, folder)
        finally:
            w.close()


def play(w: RolloutWorker, folder: Path,
         on_first_tool: Callable[[], None] | None = None) -> tuple[Trajectory, Record | None]:
    """One SDK episode through ``w`` (the dataset's one scenario) and what the SDK saw of it. ``on_first_tool`` runs
    here, in the test's process, after the SDK ran its first tool and before its next request leaves (the agent in
    the runner process waits on a connection for it to return)."""
    (folder / "record.json").unlink(missing_ok=True)
    if on_first_tool is None:
        (t,) = w.generate(1)
        return t, Record.read(folder)
    key = os.urandom(16)
    with multiprocessing.connection.Listener(("127.0.0.1", 0), authkey=key) as listener:
        (folder / "pause.json").write_text(json.dumps({"address": list(listener.address), "authkey": key.hex()}))
        reached = threading.Event()
        failed: list[BaseException] = []

        def serve() -> None:
            try:
                with listener.accept() as c:
                    reached.set()
                    assert c.recv() == "tool"
                    on_first_tool()
                    c.send("done")
            except BaseException as exc:  # noqa: BLE001 (reported below)
                failed.append(exc)

        helper = threading.Thread(target=serve, name="sdk-first-tool", daemon=True)
        helper.start()
        try:
            (t,) = w.generate(1)
        finally:
            (folder / "pause.json").unlink()
            if not reached.is_set():  # the agent never got there: end the helper's accept() (its recv() then fails)
                multiprocessing.connection.Client(listener.address, authkey=key).close()
            helper.join()
    assert not failed, failed
    return t, Record.read(folder)


def test_the_sdk_agent_drives_a_tool_use_conversation_and_only_its_sampled_turns_are_trained(
        scripted: Scripted) -> None:
    w, s, script = scripted.worker, scripted.scenario, scripted.script
    w.load_weights(scripted.taught.state_dict, version=0)
    before = w.agent_counters()
    t, rec = play(w, scripted.folder)
    assert t.status is TrajectoryStatus.FINISHED and t.reward == 1.0 and t.success, t.info
    assert rec is not None  # the agent returned the reward, so it wrote its record first
    assert t.info["agent"] == {"requests": 3, "retries": 0, "branches": 0}
    assert w.agent_counters()["prefix_mismatch"] == before["prefix_mismatch"]  # every request extended the last

    # the endpoint answered the two calls in OpenAI's tool_calls form, the SDK parsed them and ran the tools
    calls = [("orders", {"user": s.user}), (s.intent, {"order": s.target})]
    for raw, (name, args) in zip(rec.wire[:2], calls, strict=True):
        choice = raw["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["function"]["name"] == name
        assert json.loads(call["function"]["arguments"]) == args
    assert rec.wire[2]["choices"][0]["finish_reason"] == "stop"
    assert rec.wire[2]["choices"][0]["message"]["content"] == FINAL
    assert rec.wire[2]["choices"][0]["message"]["tool_calls"] is None
    assert rec.responses[:2] == [[("function_call", n, json.dumps(a))] for n, a in calls]
    assert [i[0] for i in rec.responses[2]] == ["message"]
    orders = ";".join(" ".join(o) for o in s.orders)
    assert rec.tools == [("orders", orders), (s.intent, "ok")]

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
    assert forced == [scripted.tail.format(result) for _, result in rec.tools]
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
    t, rec = play(w, scripted.folder, on_first_tool=lambda: w.update_weights(taught.state_dict, version=1))
    assert t.status is TrajectoryStatus.FINISHED and t.reward == 1.0, t.info
    assert rec is not None
    assert w.version == 1 and [name for name, _ in rec.tools] == ["orders", scripted.scenario.intent]
    runs = sampled_runs(t)
    assert len(runs) == 3
    stamps = [sorted(set(t.versions[a:b])) for a, b in runs]
    assert stamps == [[0], [1], [1]]  # sampled before the update: 0; after the first tool call: 1
    assert t.is_partial and all(math.isfinite(t.logp_mu[i]) for i, m in enumerate(t.loss_mask) if m)
    assert all(v == NO_VERSION for v, m in zip(t.versions, t.loss_mask, strict=True) if not m)


def test_the_example_uses_only_the_tasks_public_names() -> None:
    """The example is what a user writes: it reaches the task through its public functions (``new_db``, ``call_tool``,
    ``goal_reached``), never a private member of the environment class."""
    import ast

    tree = ast.parse((Path(EXAMPLES) / "cs_sdk_agent.py").read_text())
    imported = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith(
        "asyncrl") for a in n.names]
    private = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("_")
               and not n.attr.startswith("__")]
    assert {"new_db", "call_tool", "goal_reached"} <= set(imported) and "CustomerService" not in imported
    assert not [name for name in imported if name.startswith("_")] and private == []
