"""The built-in customer-service task: database transitions, the state-match reward, malformed calls,
its tokenizer, and demonstrations that replay through the environment with exactly the assistant
tokens trained."""

import random

import pytest

from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import replay
from asyncrl.rollout.envs.binding import bind_task, task_tokenizer
from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
from asyncrl.rollout.envs.cs_vocab import CS_PIECES, CS_TOKENIZER
from asyncrl.rollout.envs.customer_service import (
    DEMO_MIX,
    CustomerService,
    Scenario,
    ScenarioSamples,
    agent_turns,
    call_text,
)
from asyncrl.rollout.envs.demos import demonstrations
from asyncrl.rollout.envs.interface import AssistantMessage, ToolCall
from asyncrl.rollout.envs.toolcalls import parse_hermes

T = CS_TOKENIZER
S = Scenario("u3", (("o3", "lamp", "placed"), ("o4", "mug", "delivered"), ("o5", "pen", "placed")),
             "cancel", "lamp")


def _env(s: Scenario = S, calls: int = 8) -> CustomerService:
    env = CustomerService(max_tool_calls=calls)
    env.reset(s.to_sample())
    return env


def _call(name: str, **args: str) -> AssistantMessage:
    text = call_text(name, **args)
    content, calls, bad = parse_hermes(text)
    return AssistantMessage(text, content, calls, bad, "</tool_call>", eos=False)


def _end(text: str = "") -> AssistantMessage:
    return AssistantMessage(text, text)


def _answer(env: CustomerService, msg: AssistantMessage) -> str:
    turn = env.step(msg)
    assert not turn.done
    (obs,) = turn.observation
    assert obs["role"] == "tool"
    return str(obs["content"]).removeprefix("<tool_response>").removesuffix("</tool_response>")


# ---- the database -----------------------------------------------------------------------------------
def test_tools_change_the_database_only_as_their_rules_allow() -> None:
    env = _env()
    assert _answer(env, _call("orders", user="u3")) == "o3 lamp placed;o4 mug delivered;o5 pen placed"
    assert _answer(env, _call("orders", user="u9")) == "error: no user u9"
    env = _env()
    assert _answer(env, _call("refund", order="o3")) == "error: o3 is placed"  # refund needs delivered
    assert _answer(env, _call("cancel", order="o4")) == "error: o4 is delivered"  # cancel needs placed
    assert _answer(env, _call("cancel", order="o9")) == "error: no order o9"
    assert {o: r[2] for o, r in env.db.items()} == {"o3": "placed", "o4": "delivered", "o5": "placed"}
    assert _answer(env, _call("cancel", order="o3")) == "ok"
    assert _answer(env, _call("cancel", order="o3")) == "error: o3 is cancelled"  # not twice
    assert _answer(env, _call("refund", order="o4")) == "ok"
    assert {o: r[2] for o, r in env.db.items()} == {"o3": "cancelled", "o4": "refunded", "o5": "placed"}


def test_reward_is_the_final_state_matching_the_goal() -> None:
    env = _env()  # the goal: o3 (lamp) cancelled, nothing else changed
    _answer(env, _call("cancel", order="o3"))
    done = env.step(_end("Done."))
    assert done.done and done.reward == 1.0 and done.success
    env = _env()  # the goal's change and one more: the state differs from the goal's
    _answer(env, _call("cancel", order="o3"))
    _answer(env, _call("cancel", order="o5"))
    done = env.step(_end())
    assert done.done and done.reward == 0.0 and not done.success
    env = _env()  # nothing done
    done = env.step(_end())
    assert done.done and done.reward == 0.0 and done.reason == "goal missed"


def test_a_question_gets_the_scripted_users_request_once() -> None:
    env = _env()
    turn = env.step(_end("Which order?"))
    assert not turn.done and turn.observation == [{"role": "user", "content": "u3: cancel lamp"}]
    assert env.step(_end("Which order?")).done  # only once


def test_malformed_calls_become_an_error_observation_and_use_up_calls() -> None:
    env = _env(calls=4)
    for text in ('<tool_call>{"name": "orders"</tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
                 '<tool_call>{"name":"cancel","arguments":{"order":"o3"}}'):  # bad JSON, no name, unclosed
        content, calls, bad = parse_hermes(text)
        assert bad and not calls, text
        assert _answer(env, AssistantMessage(text, content, calls, bad, "</tool_call>", eos=False)) == (
            "error: malformed call")
    assert _answer(env, AssistantMessage("x", "", (ToolCall("delete", {"order": "o3"}),))) == "error: no tool delete"
    last = env.step(_call("cancel", order="o3"))  # the fifth call of at most 4
    assert last.done and last.reward == 0.0 and last.reason == "more than 4 tool calls"
    assert env.db["o3"][2] == "placed"


# ---- the tokenizer -------------------------------------------------------------------------------------
def test_cs_tokenizer_appends_to_the_text_alphabet_and_round_trips() -> None:
    n = TEXT_TOKENIZER.vocab_size
    assert T.pieces[:n] == TEXT_TOKENIZER.pieces and T.vocab_size == n + len(CS_PIECES)  # old ids unchanged
    call = call_text("cancel", order="o3")
    ids = T.encode(call)
    # <tool_call> {"name":" cancel ","arguments":{" order ":" o3 "}} </tool_call>
    assert [T.decode([i]) for i in ids] == ["<tool_call>", '{"name":"', "cancel", '","arguments":{"', "order",
                                           '":"', "o3", '"}}', "</tool_call>"]
    # a model that spells the skeleton out char by char writes the same text: the same parsed call
    spelled = [TEXT_TOKENIZER.token_id(c) if c in TEXT_TOKENIZER.pieces else T.token_id(c) for c in call[11:-12]]
    assert T.decode([T.token_id("<tool_call>"), *spelled, T.token_id("</tool_call>")]) == call
    for text in ("u7: refund sofa", "o12 fan shipped;o98 rug refunded", "error: no order o5", 'x<y {"a":"b"}'):
        assert T.decode(T.encode(text)) == text
    with pytest.raises(ValueError, match="not printable ASCII"):
        T.encode("caf\u00e9")


def test_the_task_binds_its_tokenizer_for_a_model_without_one() -> None:
    task = TaskSpec(name="customer-service")
    assert task_tokenizer(ModelSpec(), task) is CS_TOKENIZER
    assert task_tokenizer(ModelSpec(), TaskSpec(name="calculator")) is not CS_TOKENIZER
    assert bind_task(task).demonstrations and task.label == "customer-service"


# ---- demonstrations ------------------------------------------------------------------------------------
def test_a_good_demonstration_replays_with_reward_1_and_trains_exactly_the_assistant_tokens() -> None:
    rng = random.Random(0)
    turns = agent_turns(S, "good", rng)
    assert turns == [call_text("orders", user="u3"), call_text("cancel", order="o3"), "<eos>"]
    ad = TurnAdapter("customer-service", CustomerService(), S.to_sample(), T)
    prompt = ad.reset()
    ep = replay(ad, prompt, [T.eos_token if t == "<eos>" else t for t in turns])
    assert ep.done and ep.success and ep.reward == 1.0
    # expected: prompt, turn 1, its forced response, turn 2, its forced response, the end of turn
    resp1 = T.encode("<tool_response>o3 lamp placed;o4 mug delivered;o5 pen placed</tool_response>")
    resp2 = T.encode("<tool_response>ok</tool_response>")
    parts = [(prompt, False), (T.encode(turns[0]), True), (resp1, False), (T.encode(turns[1]), True),
             (resp2, False), ([T.eos_id], True)]
    assert ep.tokens == [i for ids, _ in parts for i in ids]
    assert ep.loss_mask == [m for ids, m in parts for _ in ids]
    assert T.decode(prompt) == "<bos>u3: cancel lamp"


def test_demonstrations_of_every_kind_end_and_only_good_ones_succeed() -> None:
    rng = random.Random(3)
    samples = ScenarioSamples()
    wins = dict.fromkeys(DEMO_MIX, 0)
    for kind in DEMO_MIX:
        for i in range(60):
            s = Scenario.from_sample(samples.train(0, i, rng))
            ad = TurnAdapter("customer-service", CustomerService(), s.to_sample(), T)
            ep = replay(ad, ad.reset(), [T.eos_token if t == "<eos>" else t for t in agent_turns(s, kind, rng)])
            assert ep.done, (kind, T.decode(ep.tokens))
            wins[kind] += ep.success
    # a guess without the lookup names the target by chance (1 of 9 ids); every other mistake never wins
    assert wins["good"] == 60 and wins["wrong_order"] == wins["wrong_tool"] == wins["miscopy"] == 0
    assert 1 <= wins["guess"] <= 15, wins
    demos = demonstrations("customer-service", 200, random.Random(0), tokenizer=T)
    assert all(len(t) == len(m) and not m[0] and m[-1] for t, m in demos)
    assert max(len(t) for t, _ in demos) <= 80  # the task's words as single ids keep episodes short


# ---- the dataset file is read once per process (shared fix of issue 16) ---------------------------------
def test_a_dataset_file_is_read_once_per_process_until_it_changes(tmp_path, monkeypatch) -> None:
    import json
    import os

    from asyncrl.api.dataset import DatasetSpec
    from asyncrl.rollout.envs import dataset as ds

    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": i}) + "\n" for i in range(20)))
    reads: list[str] = []
    real = ds.read_rows
    monkeypatch.setattr(ds, "read_rows", lambda p, f, *caps: (reads.append(str(p)), real(p, f, *caps))[1])
    spec = DatasetSpec(path=str(path), heldout_fraction=0.2)
    a, b = ds.load_dataset(spec), ds.load_dataset(DatasetSpec(path=str(path), heldoutFraction=0.2))
    assert a is b and len(reads) == 1  # the worker, the evaluator and the startup probe share one read
    assert ds.load_dataset(DatasetSpec(path=str(path), heldout_fraction=0.5)) is not a and len(reads) == 2
    path.write_text(path.read_text() + json.dumps({"prompt": "q20", "answer": 20}) + "\n")
    os.utime(path, ns=(1, 1))  # changed file (size and mtime): read again
    assert len(ds.load_dataset(spec).rows) == 21 and len(reads) == 3


def test_job_info_names_what_runs() -> None:
    from asyncrl.api.dataset import DatasetSpec

    assert TaskSpec(name="calculator").label == "calculator"
    env = TaskSpec(environment="mypkg.guess:Guess")
    assert env.label == "mypkg.guess:Guess"  # not the ignored default name
    data = TaskSpec(dataset=DatasetSpec(path="d.jsonl"), reward="my_reward:score")
    assert data.label == "dataset:d.jsonl+my_reward:score"
