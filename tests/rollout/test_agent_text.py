"""Non-ASCII text through the agent endpoint, end to end: the real ``openai`` client, real HTTP, a real tiny torch
model taught (tests/support/scripted_model.py) to answer ``Café naïve → 東京 🎉`` and a tool call whose arguments hold
multibyte text, over SmolLM2's byte-level BPE, which spells 東, 京 and 🎉 in several tokens each.

Before the turn text was decoded incrementally (rollout/detokenize.py) the client got ``Café naïve → ����� ���``
(``decode([token])`` appended per token) and arguments that were no longer the model's."""

import json
from pathlib import Path

import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.tokenizer import HFTokenizer
from asyncrl.rollout.trajectory import TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker
from tests.support.scripted_model import sampled_runs, teach_script

PLUGINS = str(Path(__file__).parent / "plugins")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
CONTENT = "Café naïve → 東京 🎉"
ARGS = {"q": "ünï → 東京 🎉"}
TURN = CONTENT + '<tool_call>{"name": "lookup", "arguments": ' + json.dumps(ARGS, ensure_ascii=False) + "}</tool_call>"


@pytest.mark.slow  # ~20 s: teaching a 49k-vocabulary model its turn on two shared cores
def test_non_ascii_content_and_tool_call_arguments_reach_the_openai_client_intact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    from asyncrl.rollout.smollm import smollm2_gguf

    path = smollm2_gguf()
    tok = HFTokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), "smollm2")
    ids = tok.encode(TURN)
    garbled = "".join(tok.decode([i]) for i in ids)  # the old per-token text: multibyte characters break
    assert garbled != TURN and "\ufffd" in garbled
    monkeypatch.setenv("UNICODE_AGENT_DIR", str(tmp_path))  # inherited by the worker's agent runner
    spec = TaskSpec(agent="unicode_agents:one_call", python_path=[PLUGINS], group_size=1, max_new_tokens=200,
                    temperature=0.05)
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True), tokenizer=tok)
    try:
        taught = teach_script(w, [TURN], lambda: w.generate(1)[0])
    finally:
        w.close()
    t = taught.trajectory
    assert t.status is TrajectoryStatus.FINISHED and t.reward == 1.0, t.info
    ((a, b),) = sampled_runs(t)
    assert t.tokens[a:b] == ids + [tok.eos_id]  # the model sampled exactly the turn's ids

    answer = json.loads((tmp_path / "answer.json").read_text(encoding="utf-8"))
    (choice,) = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == CONTENT
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == ARGS
    assert "東京 🎉" in call["function"]["arguments"]  # the model's characters, as OpenAI's API returns them
