"""The built-in customer-service task: database transitions, the state-match reward, malformed calls, the
template-rendered episode with the task's tokenizer, and demonstrations that replay through the environment with
exactly the assistant tokens trained. The rules against shortcuts (one action, wide ids, several fitting orders)
are tests/rollout/test_cs_rules.py's."""

import random

from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import replay
from asyncrl.rollout.envs.binding import bind_task, task_tokenizer
from asyncrl.rollout.envs.cs_tokenizer import NAME, cs_tokenizer
from asyncrl.rollout.envs.customer_service import (
    DEMO_KINDS,
    FINAL,
    SYSTEM,
    CustomerService,
    Scenario,
    ScenarioSamples,
    agent_turns,
    call_text,
    call_tool,
    draw_scenario,
    goal_db,
    goal_reached,
    new_db,
    run_tool,
)
from asyncrl.rollout.envs.demos import demonstrations
from asyncrl.rollout.envs.interface import AssistantMessage, ToolCall
from asyncrl.rollout.envs.toolcalls import parse_hermes

T = cs_tokenizer()
S = Scenario("u42", (("o318", "lamp", "placed"), ("o702", "mug", "delivered"), ("o455", "pen", "placed"),
                    ("o561", "hat", "placed")), "cancel", "lamp")
LISTING = "o318 lamp placed;o702 mug delivered;o455 pen placed;o561 hat placed"


def _env(s: Scenario = S, calls: int = 8) -> CustomerService:
    env = CustomerService(max_tool_calls=calls)
    env.reset(s.to_sample())
    return env


def _call(name: str, **args: str) -> AssistantMessage:
    text = call_text(name, **args)
    content, calls, bad = parse_hermes(text)
    return AssistantMessage(text, content, calls, bad)


def _answer(env: CustomerService, msg: AssistantMessage) -> str:
    turn = env.step(msg)
    assert not turn.done
    (obs,) = turn.observation
    assert obs["role"] == "tool"
    return str(obs["content"])


def _play(s: Scenario, turns: list[str]) -> object:
    ad = TurnAdapter("customer-service", CustomerService(), s.to_sample(), T)
    return replay(ad, ad.reset(), [t + T.eos_token for t in turns])


# ---- the database -----------------------------------------------------------------------------------
def test_tools_change_the_database_only_as_their_rules_allow() -> None:
    db = new_db(S)  # the bare mechanics (run_tool); the task's rule on wrong actions is call_tool's (test_cs_rules.py)
    assert run_tool(db, "orders", {"user": "u42"}) == LISTING
    assert run_tool(db, "orders", {"user": "u19"}) == "error: no user u19"
    assert run_tool(db, "refund", {"order": "o318"}) == "error: o318 is placed"  # refund needs delivered
    assert run_tool(db, "cancel", {"order": "o702"}) == "error: o702 is delivered"  # cancel needs placed
    assert run_tool(db, "cancel", {"order": "o999"}) == "error: no order o999"
    assert {o: r[2] for o, r in db.items()} == {"o318": "placed", "o702": "delivered", "o455": "placed", "o561": "placed"}
    assert run_tool(db, "cancel", {"order": "o318"}) == "ok"
    assert run_tool(db, "cancel", {"order": "o318"}) == "error: o318 is cancelled"  # not twice
    assert run_tool(db, "refund", {"order": "o702"}) == "ok"
    assert {o: r[2] for o, r in db.items()} == {"o318": "cancelled", "o702": "refunded", "o455": "placed", "o561": "placed"}
    env = _env()  # through the environment: the lookup, then the goal's action
    assert _answer(env, _call("orders", user="u42")) == LISTING
    assert _answer(env, _call("cancel", order="o318")) == "ok"


def test_the_plain_functions_are_the_environment_without_its_class() -> None:
    db = new_db(S)  # what another harness (the Agents SDK example) calls
    assert call_tool(S, db, "orders", {"user": "u42"}) == (LISTING, False)
    assert not goal_reached(S, db) and call_tool(S, db, "cancel", {"order": "o318"}) == ("ok", False)
    assert goal_reached(S, db) and db == goal_db(S) and run_tool(db, "delete", {}) == "error: no tool delete"


def test_reward_is_the_final_state_matching_the_goal() -> None:
    env = _env()  # the goal: o318 (lamp) cancelled, nothing else changed
    _answer(env, _call("cancel", order="o318"))
    done = env.step(AssistantMessage("done", "done"))
    assert done.done and done.reward == 1.0 and done.success
    env = _env()  # nothing done
    done = env.step(AssistantMessage("", ""))
    assert done.done and done.reward == 0.0 and done.reason == "goal missed"
    env = _env()  # the goal's action twice: the second is an error that changes nothing, the goal stays reached
    _answer(env, _call("cancel", order="o318"))
    assert _answer(env, _call("cancel", order="o318")) == "error: o318 is cancelled"
    assert env.step(AssistantMessage("done", "done")).success


def test_a_question_gets_the_scripted_users_request_once() -> None:
    env = _env()
    turn = env.step(AssistantMessage("Which order?", "Which order?"))
    assert not turn.done and turn.observation == [{"role": "user", "content": "u42: cancel lamp"}]
    assert env.step(AssistantMessage("Which order?", "Which order?")).done  # only once


def test_malformed_calls_become_an_error_answer_and_use_up_calls() -> None:
    env = _env(calls=4)
    for text in ('<tool_call>{"name": "orders"</tool_call>', '<tool_call>{"arguments": {}}</tool_call>',
                 '<tool_call>{"name":"cancel","arguments":{"order":"o318"}}'):  # bad JSON, no name, unclosed
        content, calls, bad = parse_hermes(text)
        assert bad and not calls, text
        assert _answer(env, AssistantMessage(text, content, calls, bad)) == "error: malformed call"
    assert _answer(env, AssistantMessage("x", "", (ToolCall("delete", {"order": "o318"}),))) == "error: no tool delete"
    last = env.step(_call("cancel", order="o318"))  # the fifth call of at most 4
    assert last.done and last.reward == 0.0 and last.reason == "more than 4 tool calls"
    assert env.db["o318"][2] == "placed"


# ---- the template-rendered episode -----------------------------------------------------------------------
def test_the_task_binds_its_bpe_tokenizer_for_a_model_without_one() -> None:
    task = TaskSpec(name="customer-service")
    assert task_tokenizer(ModelSpec(), task) is T and T.name == NAME
    assert task_tokenizer(ModelSpec(), TaskSpec(name="calculator")) is not T
    assert bind_task(task).demonstrations and task.label == "customer-service"


def test_a_good_demonstration_renders_the_system_prompt_tools_and_tool_turns_and_trains_only_the_agent() -> None:
    turns = agent_turns(S, "good", random.Random(0))
    assert turns == [call_text("orders", user="u42"), call_text("cancel", order="o318"), FINAL]
    ep = _play(S, turns)
    assert ep.done and ep.success and ep.reward == 1.0  # type: ignore[attr-defined]
    runs: list[tuple[bool, str]] = []
    for tok, m in zip(ep.tokens, ep.loss_mask, strict=True):  # type: ignore[attr-defined]
        piece = T.decode([tok])
        runs[-1:] = [(m, runs[-1][1] + piece)] if runs and runs[-1][0] == m else [*runs[-1:], (m, piece)]
    prompt = (f"<|im_start|>system\n{SYSTEM}\nTools:\norders(user): List a user's orders (id product status).\n"
              "cancel(order): Cancel a placed order.\nrefund(order): Refund a delivered order.<|im_end|>\n"
              "<|im_start|>user\nu42: cancel lamp<|im_end|>\n<|im_start|>assistant\n")
    assert runs == [
        (False, prompt),
        (True, '<tool_call>{"name":"orders","arguments":{"user":"u42"}}</tool_call><|im_end|>'),
        (False, f"\n<|im_start|>tool\n{LISTING}<|im_end|>\n<|im_start|>assistant\n"),
        (True, '<tool_call>{"name":"cancel","arguments":{"order":"o318"}}</tool_call><|im_end|>'),
        (False, "\n<|im_start|>tool\nok<|im_end|>\n<|im_start|>assistant\n"),
        (True, "done<|im_end|>"),
    ]
    # compact: the prompt is ~80 tokens, a call 16 (the JSON pieces and names single tokens, an id's letter and
    # its 3 digits 4: 12 + 4)
    assert 70 <= ep.prompt_len <= 95 and len(T.encode(turns[1])) == 16, (ep.prompt_len, T.encode(turns[1]))  # type: ignore[attr-defined]


def test_demonstrations_of_every_kind_end_and_only_good_ones_and_lucky_draws_succeed() -> None:
    rng = random.Random(3)
    samples = ScenarioSamples()
    wins = dict.fromkeys(DEMO_KINDS, 0)
    for kind in DEMO_KINDS:
        for i in range(40):
            s = Scenario.from_sample(samples.train(0, i, rng))
            ep = _play(s, agent_turns(s, kind, rng))
            assert ep.done, (kind, T.decode(ep.tokens))  # type: ignore[attr-defined]
            wins[kind] += ep.success  # type: ignore[attr-defined]
    # any_fit is right 1 time in the fitting count (3-5: ~0.28, 11 of 40 expected); a guess 1 in 900
    assert wins["good"] == 40 and wins["wrong_order"] == wins["wrong_tool"] == wins["miscopy"] == 0
    assert 3 <= wins["any_fit"] <= 22 and wins["guess"] <= 1, wins
    demos = demonstrations("customer-service", 64, random.Random(0), tokenizer=T)
    assert all(len(t) == len(m) and not m[0] and m[-1] for t, m in demos)
    assert max(len(t) for t, _ in demos) <= 190  # prompt ~85, two calls, the lookup's answer, the reply


def test_draws_are_fixed_by_the_seed_and_the_split_is_kept() -> None:
    assert draw_scenario(random.Random(5)) == draw_scenario(random.Random(5))
    held = ScenarioSamples().heldout(40, seed=2)
    assert held == ScenarioSamples().heldout(40, seed=2)
    rng = random.Random(0)
    train = [ScenarioSamples().train(0, i, rng) for i in range(200)]
    assert not {str(s) for s in held} & {str(s) for s in train}


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
