"""The customer-service task's trivial policies, simulated: what a shortcut scores, beside the skill (issue 39).

Each policy maps a scenario (and an rng) to the assistant turns it would write; :func:`play` runs them through
:class:`~asyncrl.rollout.envs.customer_service.CustomerService` itself (the messages parsed as the engine parses
them, no tokenizer, no model), so a policy scores exactly what the environment's rules give it. The script draws
``--scenarios`` (40,000) scenarios from a fixed seed, scores every policy of :data:`POLICIES` on all of them, prints
the table (success with its 95 % Wilson interval, and the behaviour flags of ``rollout/envs/cs_behaviour.py``) and
writes it as a JSON record, ``docs/results/data/customer_service/baselines.json`` (``docs/tasks.md`` shows it).
``tests/rollout/test_cs_rules.py`` holds each rule of the task against the policy that would exploit it.

    nice -n 10 .venv/bin/python bench/customer_service_baselines.py     # 264 s on a shared, loaded core

A policy sees what a model would see: the request, and every tool answer of its episode (:class:`Seen`); the
scripted ones here only read the lookup's answer (its ids and statuses, never its products: reading the product
is the skill).
"""

import argparse
import json
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.rollout.envs.cs_behaviour import FLAGS, behaviour, rates, tally
from asyncrl.rollout.envs.customer_service import (
    DEMO_MIX,
    FINAL,
    INTENTS,
    ORDER_IDS,
    USER_IDS,
    CustomerService,
    Scenario,
    agent_turns,
    call_text,
    draw_scenario,
)
from asyncrl.rollout.envs.interface import AssistantMessage, Turn
from asyncrl.rollout.envs.toolcalls import parse_hermes


@dataclass(frozen=True)
class Seen:
    """What a policy knows when it writes its next turn: the request's parts and the last tool answer."""

    user: str
    intent: str
    answer: str  # the last tool answer ("" before any call)


Policy = Callable[[Scenario, random.Random], list[str]]


ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "results" / "data" / "customer_service" / "baselines.json"
SEED = 39  # the scenarios' draw (issue 39)


def episode(s: Scenario, turns: list[str], max_tool_calls: int = 4) -> tuple[Turn, CustomerService]:
    """The last :class:`Turn` of ``turns`` played through a fresh environment, and the environment (its call log
    and ``info()``); a turn list that runs out before the episode ends gets a closing message with no call."""
    env = CustomerService(max_tool_calls)
    env.reset(s.to_sample())
    for text in [*turns, FINAL]:
        content, calls, bad = parse_hermes(text)
        turn = env.step(AssistantMessage(text, content, calls, bad))
        if turn.done:
            return turn, env
    raise RuntimeError(f"customer-service: the episode of {turns} did not end")  # FINAL always ends it


def play(s: Scenario, turns: list[str], max_tool_calls: int = 4) -> Turn:
    """The last :class:`Turn` of ``turns`` played through a fresh environment."""
    return episode(s, turns, max_tool_calls)[0]


def _fitting_listed(s: Scenario, user: str) -> list[str]:
    """The ids the lookup of ``user`` lists with the status ``s``'s intent needs, in listing order (none when the
    lookup names another user: the database holds only the scenario's)."""
    if user != s.user:
        return []
    needs = INTENTS[s.intent][0]
    return [o for o, _, st in s.orders if st == needs]


def _guess(rng: random.Random) -> str:
    return f"o{rng.choice(ORDER_IDS)}"


def _act_on(s: Scenario, user: str, pick: Callable[[list[str]], str], rng: random.Random) -> list[str]:
    """Look ``user`` up, then act with the intent's tool on ``pick`` of the fitting ids listed (a guess if none)."""
    fit = _fitting_listed(s, user)
    return [call_text("orders", user=user), call_text(s.intent, order=pick(fit) if fit else _guess(rng))]


def skill(s: Scenario, rng: random.Random) -> list[str]:
    return agent_turns(s, "good", rng)


def first_fit(s: Scenario, rng: random.Random) -> list[str]:
    return _act_on(s, s.user, lambda fit: fit[0], rng)


def last_fit(s: Scenario, rng: random.Random) -> list[str]:
    return _act_on(s, s.user, lambda fit: fit[-1], rng)


def random_fit(s: Scenario, rng: random.Random) -> list[str]:
    return _act_on(s, s.user, rng.choice, rng)


def first_listed(s: Scenario, rng: random.Random) -> list[str]:
    return [call_text("orders", user=s.user), call_text(s.intent, order=s.orders[0][0])]


def guess_once(s: Scenario, rng: random.Random) -> list[str]:
    return [call_text(s.intent, order=_guess(rng))]


def guess_four(s: Scenario, rng: random.Random) -> list[str]:
    return [call_text(s.intent, order=o) for o in (f"o{i}" for i in rng.sample(ORDER_IDS, 4))]


def random_user(s: Scenario, rng: random.Random) -> list[str]:
    return _act_on(s, f"u{rng.choice(USER_IDS)}", lambda fit: fit[0], rng)


def schema_example(s: Scenario, rng: random.Random) -> list[str]:
    """The order id the tool schema's description gives as an example (``o318`` for cancel, ``o702`` refund)."""
    return [call_text("orders", user=s.user), call_text(s.intent, order="o318" if s.intent == "cancel" else "o702")]


def both_tools_first_fit(s: Scenario, rng: random.Random) -> list[str]:
    """The first fitting order with a tool drawn at random and, when that was the wrong one, the other tool (the
    second chance that the one-action rule takes away)."""
    other = "refund" if s.intent == "cancel" else "cancel"
    o = _fitting_listed(s, s.user)[0]
    tools = [s.intent] if rng.random() < 0.5 else [other, s.intent]
    return [call_text("orders", user=s.user), *(call_text(t, order=o) for t in tools)]


def lookup_only(s: Scenario, rng: random.Random) -> list[str]:
    return [call_text("orders", user=s.user)]


def imitate_warm_start(s: Scenario, rng: random.Random, mix: Mapping[str, float] = DEMO_MIX) -> list[str]:
    """A perfect imitator of the warm start's demonstrations: a kind drawn from the mix, its turns."""
    return agent_turns(s, rng.choices(list(mix), list(mix.values()))[0], rng)


POLICIES: dict[str, tuple[str, Policy]] = {  # name -> (what it does, the policy); the skill first, as the ceiling
    "skill": ("look the user up, act on the order of the named product (the skill)", skill),
    "first_fit": ("look the user up, act on the first order whose status fits", first_fit),
    "random_fit": ("look the user up, act on a random order whose status fits", random_fit),
    "last_fit": ("look the user up, act on the last order whose status fits", last_fit),
    "first_listed": ("look the user up, act on the first order listed, whatever its status", first_listed),
    "guess_once": ("guess an order id blindly, one call with the intent's tool", guess_once),
    "guess_four": ("guess 4 distinct ids (a wrong action ends the episode)", guess_four),
    "random_user": ("a random user id, then the first fitting order (a guess when the lookup fails)", random_user),
    "schema_example": ("look the user up, act on the example id of the tool's schema", schema_example),
    "both_tools": ("the first fitting order with a random tool; after the wrong one, the other", both_tools_first_fit),
    "lookup_only": ("look the user up and stop", lookup_only),
    "imitate_warm_start": ("a perfect imitator of the warm start's demonstration mix", imitate_warm_start),
}


# --- the table ------------------------------------------------------------------------------------------
def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of ``k`` successes in ``n`` trials (sound at 0 and near it)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def simulate(n: int, seed: int = SEED) -> dict[str, Any]:
    """Every policy on the same ``n`` scenarios (drawn from ``seed``; each policy's own rng seeded the same)."""
    draw = random.Random(seed)
    scenarios = [draw_scenario(draw) for _ in range(n)]
    rows = []
    for name, (what, policy) in POLICIES.items():
        rng, wins, flags = random.Random(seed + 1), 0, []
        for s in scenarios:
            turn, env = episode(s, policy(s, rng))
            wins += turn.success
            flags.append(behaviour(s, env.log).flags())
        lo, hi = wilson(wins, n)
        rows.append({"policy": name, "what": what, "success": round(wins / n, 5), "successes": wins,
                     "ci95": [round(lo, 5), round(hi, 5)], "behaviour": rates(tally(flags))})
    fit = sum(1 / len(s.fitting) for s in scenarios) / n
    return {"kind": "baselines", "scenarios": n, "seed": seed, "expected_first_fit": round(fit, 5), "rows": rows}


def table(record: Mapping[str, Any]) -> str:
    """The markdown table of a :func:`simulate` record."""
    head = "| policy | success (95 % CI) | " + " | ".join(FLAGS) + " |"
    lines = [head, "|---|---|" + "---|" * len(FLAGS)]
    for r in record["rows"]:
        lo, hi = r["ci95"]
        cells = " | ".join(f"{r['behaviour'][f]:.2f}" for f in FLAGS)
        lines.append(f"| {r['what']} (`{r['policy']}`) | {r['success']:.4f} [{lo:.4f}, {hi:.4f}] | {cells} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenarios", type=int, default=40_000)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--record", type=Path, default=RECORD, help="where the JSON record goes ('-': nowhere)")
    args = p.parse_args()
    t0 = time.monotonic()
    record = simulate(args.scenarios, args.seed)
    print(table(record))
    print(f"\n{args.scenarios} scenarios (seed {args.seed}); E[1/fitting orders] = {record['expected_first_fit']:.4f}; "
          f"{time.monotonic() - t0:.0f} s")
    if str(args.record) != "-":
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.record.relative_to(ROOT) if args.record.is_relative_to(ROOT) else args.record}")


if __name__ == "__main__":
    main()
