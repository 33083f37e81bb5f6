"""What a policy did in a customer-service episode (rollout/envs/cs_behaviour.py): the flags of hand-written call
logs, the environment's info, and the counts and rates over episodes."""

from asyncrl.rollout.envs.cs_behaviour import ACTIONS, FLAGS, Behaviour, behaviour, rates, tally
from asyncrl.rollout.envs.customer_service import INTENTS, CustomerService, Scenario, call_text
from asyncrl.rollout.envs.interface import AssistantMessage
from asyncrl.rollout.envs.toolcalls import parse_hermes

S = Scenario("u42", (("o318", "lamp", "placed"), ("o702", "mug", "delivered"), ("o455", "pen", "placed"),
                    ("o561", "hat", "placed")), "cancel", "pen")  # fitting: o318, o455, o561; target o455
LISTING = "o318 lamp placed;o702 mug delivered;o455 pen placed;o561 hat placed"


def test_the_flags_of_hand_written_logs() -> None:
    skill = [("orders", "u42", LISTING), ("cancel", "o455", "ok")]
    assert behaviour(S, skill) == Behaviour(True, True, True, True, True, False, False)
    shortcut = [("orders", "u42", LISTING), ("cancel", "o318", "ok")]  # the first fitting order
    assert behaviour(S, shortcut) == Behaviour(True, True, True, True, False, True, False)
    guess = [("cancel", "o455", "ok")]  # right by luck, but typed without any lookup: a guess
    assert behaviour(S, guess) == Behaviour(False, False, True, True, True, False, True)
    wrong_user = [("orders", "u24", "error: no user u24"), ("refund", "o318", "error: o318 is placed")]
    assert behaviour(S, wrong_user) == Behaviour(True, False, True, False, False, True, True)
    # only the first action counts (a wrong one ended the episode; after the goal's, a second changes nothing)
    assert behaviour(S, [*skill, ("cancel", "o318", "ok")]) == behaviour(S, skill)
    assert behaviour(S, [("orders", "u42", LISTING)]) == Behaviour(True, True, False, False, False, False, False)
    assert behaviour(S, []).flags() == dict.fromkeys(FLAGS, False)
    assert set(ACTIONS) == set(INTENTS)


def test_the_environment_reports_its_episodes_flags() -> None:
    env = CustomerService()
    env.reset(S.to_sample())
    for text in (call_text("orders", user="u42"), call_text("cancel", order="o318")):
        content, calls, bad = parse_hermes(text)
        turn = env.step(AssistantMessage(text, content, calls, bad))
    assert turn.done and not turn.success and turn.reason == "wrong action: cancel"
    assert env.info()["behaviour"] == Behaviour(True, True, True, True, False, True, False).flags()
    assert env.log == [("orders", "u42", LISTING), ("cancel", "o318", "ok")]


def test_counts_and_rates_over_episodes() -> None:
    eps = [Behaviour(True, True, True, True, True, False, False).flags(),
           Behaviour(True, False, True, True, False, True, True).flags(),
           Behaviour(False, False, True, False, False, False, True).flags(),
           {}]  # an episode of another task: not counted
    counts = tally(eps)
    assert counts == {"episodes": 3, "looked_up": 2, "copied_user": 1, "acted": 3, "right_tool": 2, "right_order": 1,
                      "first_fit": 1, "guessed": 2}
    assert rates(counts) == {"looked_up": 0.6667, "copied_user": 0.3333, "acted": 1.0, "right_tool": 0.6667,
                             "right_order": 0.3333, "first_fit": 0.3333, "guessed": 0.6667}
    assert rates(tally([])) == dict.fromkeys(FLAGS, 0.0)


def test_the_loops_evaluation_record_carries_the_counts_for_this_task_only() -> None:
    from asyncrl.trainer.driver.loop.evaluation import EvalResult
    from asyncrl.trainer.driver.run.metrics_log import EvalLine, parse_line

    counts = tally([Behaviour(True, True, True, True, True, False, False).flags()])
    rec = EvalResult(2, 1, 1, 1.0, 30, 0.5, 0.0, counts).record(3.0)
    assert rec["eval_behaviour"] == counts and isinstance(parse_line(rec), EvalLine)  # readers still parse it
    assert "eval_behaviour" not in EvalResult(2, 1, 1, 1.0, 30, 0.5, 0.0).record(3.0)  # another task: no key
