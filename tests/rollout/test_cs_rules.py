"""The customer-service task's rules against shortcuts (issue 39), each against the policy that would exploit it:
one action (a wrong one ends the episode), wide ids (a guess names the target 1 time in 900), several orders that
fit the intent (only reading the product always succeeds); and the trivial-policy table's policies
(``bench/customer_service_baselines.py``, whose 40,000-scenario table docs/tasks.md shows), scored through the
environment itself."""

import random
import statistics

import pytest

from asyncrl.rollout.envs.customer_service import (
    DEMO_MIX,
    ORDER_IDS,
    USER_IDS,
    WRONG,
    CustomerService,
    Scenario,
    call_text,
    call_tool,
    draw_scenario,
    goal_reached,
    new_db,
)
from asyncrl.rollout.envs.interface import AssistantMessage
from asyncrl.rollout.envs.toolcalls import parse_hermes
from tests.support.helpers import bench_module

B = bench_module("customer_service_baselines")
POLICIES, play, first_fit, random_fit, guess_once = B.POLICIES, B.play, B.first_fit, B.random_fit, B.guess_once

S = Scenario("u42", (("o318", "lamp", "placed"), ("o702", "mug", "delivered"), ("o455", "pen", "placed"),
                    ("o561", "hat", "placed")), "cancel", "lamp")
# E[1 / fitting orders] under draw_scenario: 4 orders with 3 or 4 fitting, or 5 with 3, 4 or 5, each equally likely:
# (1/2)(1/3 + 1/4)/2 + (1/2)(1/3 + 1/4 + 1/5)/3 = 7/48 + 47/360 = 0.276389
E_INV_FIT = 7 / 48 + 47 / 360


def _scenarios(n: int, seed: int) -> list[Scenario]:
    rng = random.Random(seed)
    return [draw_scenario(rng) for _ in range(n)]


def _step(env: CustomerService, name: str, **args: str):  # type: ignore[no-untyped-def]
    text = call_text(name, **args)
    content, calls, bad = parse_hermes(text)
    return env.step(AssistantMessage(text, content, calls, bad))


# ---- one action ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "order", "why"), [
    ("cancel", "o455", "a decoy: placed, as the intent needs, but not the lamp"),
    ("refund", "o318", "the target with the other intent's tool"),
    ("cancel", "o999", "an id that is nobody's (a guess)"),
    ("cancel", "o702", "an order whose status does not fit"),
])
def test_a_wrong_action_ends_the_episode_as_a_failure(name: str, order: str, why: str) -> None:
    env = CustomerService(max_tool_calls=8)
    env.reset(S.to_sample())
    assert not _step(env, "orders", user="u42").done
    turn = _step(env, name, order=order)
    assert turn.done and turn.reward == 0.0 and not turn.success and turn.reason == f"wrong action: {name}", why
    assert WRONG in env.db and not goal_reached(S, env.db)


def test_after_a_wrong_action_nothing_can_reach_the_goal_in_a_harness_without_the_environment() -> None:
    db = new_db(S)  # the Agents SDK form: the agent may go on, the reward stays 0
    assert call_tool(S, db, "cancel", {"order": "o455"}) == ("ok", True)  # the decoy really is cancelled
    assert db["o455"][2] == "cancelled" and db[WRONG] == ["cancel", "o455", "ok"]
    assert call_tool(S, db, "cancel", {"order": "o318"}) == ("error: the episode is over", True)
    assert db["o318"][2] == "placed" and not goal_reached(S, db)
    assert call_tool(S, db, "orders", {"user": "u42"}) == ("error: the episode is over", True)


def test_the_goals_action_and_lookups_go_on_and_a_second_try_never_comes() -> None:
    env = CustomerService(max_tool_calls=8)
    env.reset(S.to_sample())
    for user in ("u41", "u42", "u42"):  # lookups, even of a wrong user, are free (they change nothing)
        assert not _step(env, "orders", user=user).done
    assert not _step(env, "cancel", order="o318").done
    assert env.step(AssistantMessage("done", "done")).success
    # four guesses: the first wrong one ends the episode, so the other three never run
    turns = [call_text("cancel", order=o) for o in ("o100", "o101", "o318", "o102")]
    assert play(S, turns).reason == "wrong action: cancel"


# ---- wide ids ------------------------------------------------------------------------------------------
def test_ids_are_wide_distinct_and_independent_of_each_other() -> None:
    scenarios = _scenarios(2000, 5)
    assert all(int(s.user[1:]) in USER_IDS and len(s.user) == 3 for s in scenarios)
    for s in scenarios:
        ids = [o for o, _, _ in s.orders]
        assert len(set(ids)) == len(ids) and all(o[0] == "o" and int(o[1:]) in ORDER_IDS for o in ids)
    assert len(ORDER_IDS) == 900 and len(USER_IDS) == 90
    # every one of the 900 ids is someone's target: no id is favoured (seen ids: all but a handful)
    targets = {s.target for s in _scenarios(20000, 6)}
    assert len(targets) > 880, len(targets)
    # no id's digits carry the user's: the target's last two digits equal the user's 1 time in 100 (+- 3 sigma)
    same = statistics.fmean(s.target[-2:] == s.user[1:] for s in scenarios)
    assert same < 0.01 + 3 * (0.01 * 0.99 / 2000) ** 0.5, same


def test_one_guessed_id_names_the_target_exactly_1_time_in_900() -> None:
    wins = 0
    for i in ORDER_IDS:  # every id a blind guess could write, on one scenario: exactly one wins
        wins += play(S, [call_text("cancel", order=f"o{i}")]).success
    assert wins == 1
    scenarios = _scenarios(3000, 7)
    rng = random.Random(0)
    rate = statistics.fmean(play(s, guess_once(s, rng)).success for s in scenarios)
    assert rate <= 1 / 900 + 4 * (1 / 900 / 3000) ** 0.5, rate  # 0.0011 expected; 0.0035 is 4 sigma above


# ---- several orders fit ------------------------------------------------------------------------------------
def test_three_to_all_orders_fit_the_intent_and_the_product_names_one() -> None:
    for s in _scenarios(3000, 8):
        n, m = len(s.orders), len(s.fitting)
        assert n in (4, 5) and 3 <= m <= n and s.target in s.fitting
        assert len({p for _, p, _ in s.orders}) == n  # the product names one order


def test_the_status_shortcut_wins_1_over_the_fitting_count() -> None:
    scenarios = _scenarios(4000, 9)
    assert abs(statistics.fmean(1 / len(s.fitting) for s in scenarios) - E_INV_FIT) < 0.01
    rng = random.Random(1)
    # first fit: it wins exactly when the target is listed first among the fitting orders
    assert all(play(s, first_fit(s, rng)).success == (s.fitting[0] == s.target) for s in scenarios[:500])
    for policy in (first_fit, random_fit):
        rate = statistics.fmean(play(s, policy(s, rng)).success for s in scenarios)
        sigma = (E_INV_FIT * (1 - E_INV_FIT) / len(scenarios)) ** 0.5  # 0.0071
        assert abs(rate - E_INV_FIT) < 4 * sigma, (policy.__name__, rate)


def test_every_trivial_policy_is_far_below_the_skill() -> None:
    scenarios = _scenarios(1500, 10)
    rates = {}
    for name, (_, policy) in POLICIES.items():
        rng = random.Random(2)
        rates[name] = statistics.fmean(play(s, policy(s, rng)).success for s in scenarios)
    assert rates.pop("skill") == 1.0
    # the best shortcut is the status one (E[1/m] = 0.276; 4 sigma over 1500 scenarios: 0.046); the warm start's
    # imitator 0.8 x 0.276 = 0.221
    assert max(rates.values()) < E_INV_FIT + 0.046, rates
    assert abs(rates["imitate_warm_start"] - 0.8 * E_INV_FIT) < 0.046 and DEMO_MIX["any_fit"] == 0.8
    assert rates["guess_four"] < 0.005 and rates["random_user"] < 0.01 and rates["lookup_only"] == 0.0


def test_the_baselines_record_and_table() -> None:
    record = B.simulate(300, seed=3)
    assert record["scenarios"] == 300 and [r["policy"] for r in record["rows"]] == list(POLICIES)
    rows = {r["policy"]: r for r in record["rows"]}
    assert rows["skill"]["success"] == 1.0 and rows["skill"]["behaviour"]["right_order"] == 1.0
    assert rows["first_fit"]["behaviour"]["first_fit"] == 1.0 and rows["guess_once"]["behaviour"]["guessed"] == 1.0
    lo, hi = rows["skill"]["ci95"]
    assert hi == 1.0 and 0.985 < lo < 1.0  # Wilson at 300/300: 300 / (300 + 1.96^2) = 0.9873
    assert B.wilson(0, 100)[0] == 0.0 and abs(B.wilson(50, 100)[0] - 0.4038) < 1e-4  # hand: (0.5+.0192-.0999)/1.0384
    assert B.table(record).count("\n") == len(POLICIES) + 1


# ---- the shuffled-reward control's knob ------------------------------------------------------------------------
def test_shuffled_rewards_keep_the_rate_and_lose_the_link_to_the_episode() -> None:
    from asyncrl.api.task import TaskSpec
    from asyncrl.rollout.envs.binding import bind_task

    CustomerService._recent.clear()
    scenarios = _scenarios(3000, 11)
    rng = random.Random(4)
    outcomes, rewards = [], []
    for s in scenarios:  # the status shortcut: real success ~0.276
        env = CustomerService(shuffle_rewards=64)
        env.reset(s.to_sample())
        turn = None
        for text in [*first_fit(s, rng), "done"]:
            content, calls, bad = parse_hermes(text)
            turn = env.step(AssistantMessage(text, content, calls, bad))
            if turn.done:
                break
        assert turn is not None and turn.done
        outcomes.append(turn.success)
        rewards.append(turn.reward)
    rate, paid = statistics.fmean(outcomes), statistics.fmean(rewards)
    assert abs(paid - rate) < 0.03, (paid, rate)  # the same rate (a window of 64 recent outcomes)
    # no link: reward given success ~ reward given failure (each ~0.276; 4 sigma of the difference ~0.08)
    won = statistics.fmean(r for r, o in zip(rewards, outcomes, strict=True) if o)
    lost = statistics.fmean(r for r, o in zip(rewards, outcomes, strict=True) if not o)
    assert abs(won - lost) < 0.08, (won, lost)
    assert CustomerService().shuffle_rewards == 0  # off by default: the reward is the episode's own
    with pytest.raises(ValueError, match="shuffle_rewards = -1"):
        CustomerService(shuffle_rewards=-1)
    assert bind_task(TaskSpec(name="customer-service", args={"shuffle_rewards": 64})).new_env().shuffle_rewards == 64
    CustomerService._recent.clear()
