"""The built-in ``customer-service`` task: tool use against a tiny order database (τ-bench-like).

Each sample is a scenario: a user (``u42``), their 4-5 orders (id, product, status) in an in-memory
database, and the user's goal, stated by a scripted user in the first message (``u42: cancel lamp``:
cancel the order of that product; ``refund``: refund a delivered one). The assistant sees the shop's
instructions (:data:`SYSTEM`) and three tools (JSON schemas in :data:`TOOLS`) through the chat template:

- ``orders(user)`` -> the user's orders, ``o318 lamp placed;o702 mug delivered;o455 pen placed``;
- ``cancel(order)`` -> ``ok`` (a placed order becomes cancelled) or an error;
- ``refund(order)`` -> ``ok`` (a delivered order becomes refunded) or an error.

**No shortcut cheaper than the skill** (issue 39; ``bench/customer_service_baselines.py`` simulates the trivial
policies on 40,000 scenarios, ``tests/rollout/test_cs_rules.py`` holds each rule):

- *one action*: an action (``cancel``/``refund``) that is not the goal's (the intent's tool on the target order)
  ends the episode as a failure (:func:`call_tool`), so guessing ids one after another, or trying both tools, is
  never a second chance;
- *wide ids*: order ids are ``o100``-``o999`` and user ids ``u10``-``u99``, drawn independently, so a guessed
  order id names the target 1 time in 900 and a guessed user 1 time in 90;
- *several orders fit*: 3 to all of the user's 4-5 orders have the status the intent needs, so acting on a
  fitting order without reading the product succeeds 1/(fitting orders), about 0.28 on average; only the product
  in the request, found in the lookup's answer, names the order.

Calls are Hermes blocks, ``<tool_call>{"name":"orders","arguments":{"user":"u42"}}</tool_call>``, and the
turn ends at the end-of-turn token; the tool's answer is a ``tool`` message the chat template renders. A turn
without a call ends the episode (a question, one ending in ``?``, gets the scripted user's one reply: the request
again). As τ-bench scores, the reward is 1 when the database's final state equals the goal's (the target order
changed as asked, nothing else changed), else 0; a malformed call gets an error answer and uses up a call.

The parts another harness reuses without the environment class (the OpenAI Agents SDK example,
``examples/agents/cs_sdk_agent.py``): :data:`SYSTEM`, :data:`TOOLS`, :func:`draw_scenario` /
:class:`ScenarioSamples`, the database :func:`new_db`, the tools with the task's rules :func:`call_tool` (over
the bare database mechanics :func:`run_tool`) and the goal check :func:`goal_db` / :func:`goal_reached`. A model
without its own tokenizer (the tiny presets) reads and writes this task through the task's byte-level BPE with a
ChatML template (``envs/cs_tokenizer.py``). What a policy did in an episode (looked the user up, copied the id,
acted on the first fitting order, guessed...) is :func:`asyncrl.rollout.envs.cs_behaviour.behaviour` of the
environment's call log, in :meth:`CustomerService.info`.
"""

import json
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar

from asyncrl.rollout.envs.cs_behaviour import behaviour
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.split import is_heldout
from asyncrl.rollout.envs.toolcalls import CLOSE, OPEN

PRODUCTS = ("lamp", "mug", "desk", "sofa", "pen", "hat", "bag", "cup", "rug", "fan")
STATUSES = ("placed", "shipped", "delivered")
INTENTS = {"cancel": ("placed", "cancelled"), "refund": ("delivered", "refunded")}  # needs, becomes
ORDERS_PER_USER = (4, 5)  # a user's orders
MIN_FITTING = 3  # of them, at least this many (up to all) have the status the intent needs: the target and decoys
ORDER_IDS = range(100, 1000)  # o100-o999: a guessed id names the target 1 time in 900
USER_IDS = range(10, 100)  # u10-u99
WRONG = "!wrong"  # the database key a wrong action leaves (never an order id): the goal can no longer be reached
CS_MAX_PROMPT_TOKENS = 1024  # a real model's template with the tool schemas; the task's BPE: ~60 (cs_tokenizer.py)
SYSTEM = "You are a shop's agent. Look up the user's orders, then cancel or refund the one of the product they name."

Db = dict[str, list[str]]  # order id -> [user, product, status]


def _tool(name: str, doc: str, arg: str, arg_doc: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": doc,
        "parameters": {"type": "object", "properties": {arg: {"type": "string", "description": arg_doc}},
                       "required": [arg]}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("orders", "List a user's orders (id product status).", "user", "user id, e.g. u42"),
    _tool("cancel", "Cancel a placed order.", "order", "order id, e.g. o318"),
    _tool("refund", "Refund a delivered order.", "order", "order id, e.g. o702"),
)


@dataclass(frozen=True)
class Scenario:
    """One sample: the user, their orders ``((id, product, status), ...)`` and the goal."""

    user: str
    orders: tuple[tuple[str, str, str], ...]
    intent: str  # cancel | refund
    product: str  # the product of the target order (unique among the user's orders)

    @property
    def request(self) -> str:
        return f"{self.user}: {self.intent} {self.product}"

    @property
    def target(self) -> str:
        return next(o for o, p, _ in self.orders if p == self.product)

    @property
    def fitting(self) -> tuple[str, ...]:
        """The ids of the orders whose status the intent needs, in listing order (the target among them)."""
        needs = INTENTS[self.intent][0]
        return tuple(o for o, _, st in self.orders if st == needs)

    def to_sample(self) -> dict[str, Any]:
        return {"user": self.user, "orders": [list(o) for o in self.orders], "intent": self.intent,
                "product": self.product}

    @classmethod
    def from_sample(cls, s: dict[str, Any]) -> "Scenario":
        return cls(str(s["user"]), tuple((str(a), str(b), str(c)) for a, b, c in s["orders"]), str(s["intent"]),
                   str(s["product"]))


def draw_scenario(rng: random.Random) -> Scenario:
    """A user with 4-5 orders of distinct products, 3 to all of them (the target and decoys) in the status the
    intent needs, the others in another status; listed in random order; ids drawn independently (the user's from
    :data:`USER_IDS`, the orders' distinct from :data:`ORDER_IDS`)."""
    intent = rng.choice(tuple(INTENTS))
    needs = INTENTS[intent][0]
    n = rng.choice(ORDERS_PER_USER)
    m = rng.randint(MIN_FITTING, n)
    products = rng.sample(PRODUCTS, n)
    ids = rng.sample(ORDER_IDS, n)
    others = [s for s in STATUSES if s != needs]
    statuses = [needs] * m + [rng.choice(others) for _ in range(n - m)]
    rng.shuffle(statuses)
    k = rng.choice([i for i in range(n) if statuses[i] == needs])
    orders = tuple((f"o{ids[i]}", products[i], statuses[i]) for i in range(n))
    return Scenario(f"u{rng.choice(USER_IDS)}", orders, intent, products[k])


def _key(s: Scenario) -> str:
    return f"cs:{s.request}:" + ";".join(" ".join(o) for o in s.orders)


@dataclass(frozen=True)
class ScenarioSamples:
    """Training scenarios from the group's rng (train side of the keyed split), held-out ones by seed."""

    def train(self, worker: int, index: int, rng: random.Random) -> dict[str, Any]:
        while True:
            s = draw_scenario(rng)
            if not is_heldout(_key(s)):
                return s.to_sample()

    def heldout(self, n: int, seed: int) -> list[dict[str, Any]]:
        rng, out = random.Random(seed), list[dict[str, Any]]()
        while len(out) < n:
            s = draw_scenario(rng)
            if is_heldout(_key(s)):
                out.append(s.to_sample())
        return out


# ---- the database, the tools and the goal: plain functions any harness can call -------------------------
def new_db(s: Scenario) -> Db:
    """The scenario's order database (a fresh copy: the tools change it in place)."""
    return {o: [s.user, p, st] for o, p, st in s.orders}


def run_tool(db: Db, name: str, args: dict[str, Any]) -> str:
    """Run tool ``name`` with ``args`` against ``db`` (changed in place): the database's mechanics only; the
    task's rule on wrong actions is :func:`call_tool`'s. The tool's answer text."""
    if name == "orders":
        user = args.get("user")
        mine = [f"{o} {p} {st}" for o, (u, p, st) in db.items() if o != WRONG and u == user]
        return ";".join(mine) if mine else f"error: no user {user}"
    if name in INTENTS:
        order = args.get("order")
        row = db.get(str(order)) if order != WRONG else None
        if row is None:
            return f"error: no order {order}"
        needs, becomes = INTENTS[name]
        if row[2] != needs:
            return f"error: {order} is {row[2]}"
        row[2] = becomes
        return "ok"
    return f"error: no tool {name}"


def wrong_action(s: Scenario, name: str, args: dict[str, Any]) -> bool:
    """An action (``cancel``/``refund``) other than the goal's: another order, or the other intent's tool."""
    return name in INTENTS and (name != s.intent or str(args.get("order")) != s.target)


def call_tool(s: Scenario, db: Db, name: str, args: dict[str, Any]) -> tuple[str, bool]:
    """One tool call under the task's rules: ``(answer, over)``. A wrong action (:func:`wrong_action`) is run (a
    decoy may really be cancelled), then recorded in ``db`` under :data:`WRONG`, so the goal can never be reached
    after it, and ``over`` is True: the environment ends the episode there as a failure; a harness that cannot stop
    its agent (the Agents SDK example) gets the same reward, 0, whatever the agent does next. After a wrong action
    every call answers that the episode is over."""
    if WRONG in db:
        return "error: the episode is over", True
    answer = run_tool(db, name, args)
    if wrong_action(s, name, args):
        db[WRONG] = [name, str(args.get("order")), answer]
        return answer, True
    return answer, False


def goal_db(s: Scenario) -> Db:
    """The database the user's goal asks for: the target changed as asked, nothing else."""
    goal = new_db(s)
    goal[s.target][2] = INTENTS[s.intent][1]
    return goal


def goal_reached(s: Scenario, db: Db) -> bool:
    """τ-bench's check: the final database equals the goal's (a wrong action's :data:`WRONG` entry never does)."""
    return db == goal_db(s)


class CustomerService:
    """One customer-service episode (a turn-level environment, ``envs/interface.py``).

    ``shuffle_rewards`` (``spec.task.args``; 0 = off) is the shuffled-reward control of ``bench/customer_service.py``
    (issue 39): the reward an episode trains on is the real outcome of an episode drawn at random among the last
    ``shuffle_rewards`` ones this process finished (itself included), so the rewards keep their rate but lose their
    link to what the episode did; ``success`` stays the episode's own (the metrics and evaluations report it)."""

    truncated_reward = 0.0
    _recent: ClassVar[deque[bool]] = deque()  # the process's last real outcomes (shuffle_rewards only)
    _shuffle_rng: ClassVar[random.Random] = random.Random(39)

    def __init__(self, max_tool_calls: int = 4, shuffle_rewards: int = 0) -> None:
        if not 0 <= int(shuffle_rewards) <= 100_000:
            raise ValueError(f"customer-service: task.args.shuffle_rewards = {shuffle_rewards!r}, must be 0 (off) or "
                             "a window of 1-100000 episodes")
        self.max_tool_calls = max_tool_calls
        self.shuffle_rewards = int(shuffle_rewards)
        self.scenario: Scenario | None = None
        self.db: Db = {}
        self.calls = 0
        self.nudged = False
        self.log: list[tuple[str, str, str]] = []  # (tool name, its argument, the answer) per well-formed call

    def reset(self, sample: dict[str, Any]) -> Reset:
        s = self.scenario = Scenario.from_sample(sample)
        self.db = new_db(s)
        self.calls, self.nudged, self.log = 0, False, []
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": s.request}]
        return Reset(msgs, tools=TOOLS)  # a turn ends at the end-of-turn token only

    def _need(self) -> Scenario:
        if self.scenario is None:
            raise RuntimeError("CustomerService: step() before reset()")
        return self.scenario

    def step(self, msg: AssistantMessage) -> Turn:
        s = self._need()
        if msg.tool_calls or msg.malformed or OPEN in msg.text:
            self.calls += 1
            if self.calls > self.max_tool_calls:
                return Turn(done=True, reward=self._reward(False), reason=f"more than {self.max_tool_calls} tool calls")
            if msg.malformed or not msg.tool_calls:  # short: the details (msg.malformed) would echo the bad text
                return Turn([{"role": "tool", "content": "error: malformed call"}])
            call = msg.tool_calls[0]
            args = dict(call.arguments)
            answer, over = call_tool(s, self.db, call.name, args)
            self.log.append((call.name, str(args.get("user", args.get("order", ""))), answer))
            if over:  # a wrong action: no second chance (the module docstring)
                return Turn(done=True, reward=self._reward(False), success=False, reason=f"wrong action: {call.name}")
            return Turn([{"role": "tool", "content": answer}])
        if msg.content.rstrip().endswith("?") and not self.nudged:  # the scripted user answers once
            self.nudged = True
            return Turn([{"role": "user", "content": s.request}])
        ok = goal_reached(s, self.db)
        return Turn(done=True, reward=self._reward(ok), success=ok, reason="goal reached" if ok else "goal missed")

    def _reward(self, ok: bool) -> float:
        """The reward the episode trains on: its outcome, or under ``shuffle_rewards`` a recent episode's."""
        if not self.shuffle_rewards:
            return float(ok)
        recent = CustomerService._recent
        recent.append(ok)
        while len(recent) > self.shuffle_rewards:
            recent.popleft()
        return float(CustomerService._shuffle_rng.choice(recent))

    def info(self) -> dict[str, Any]:
        s = self._need()
        return {"request": s.request, "target": s.target, "tool_calls": self.calls,
                "db": json.dumps({o: r[2] for o, r in self.db.items()}, sort_keys=True),
                "behaviour": behaviour(s, self.log).flags()}


# ---- warm-start demonstrations (envs/demos.py plays them through the environment) -------------------
# Kinds: the right calls (``good``); an order drawn among those whose status fits, the product unread
# (``any_fit``: right 1 time in the fitting count, by chance); a decoy, fitting but not the target
# (``wrong_order``); the other intent's tool (``wrong_tool``); an order id guessed without the lookup
# (``guess``); the target's id with one digit changed (``miscopy``). The warm start's mix teaches the skill's
# prerequisites and not the skill (issue 39): every kind but ``guess`` looks the user up with the id copied
# from the request, and every id written after the lookup is copied from its answer (except a miscopy's), but
# which fitting order the user named is left to RL -- a perfect imitator of :data:`DEMO_MIX` succeeds
# 0.8 x E[1/fitting] ~ 0.22, below the status shortcut (~0.28). :data:`SUCCESS_MIX` is the supervised
# control's: successful demonstrations only.
DEMO_KINDS = ("good", "any_fit", "wrong_order", "wrong_tool", "guess", "miscopy")
DEMO_MIX = {"any_fit": 0.8, "wrong_tool": 0.1, "miscopy": 0.05, "guess": 0.05}
# The share of the warm start's demonstrations that are *copy demonstrations* (``demos.first_turn``): the prompt and
# the lookup call only, so copying the request's user id is a larger share of the loss. Without them the warm start
# stayed on the plateau where no id is copied; with 0.3 it copies (``bench/cs_warmstart_pilots.py``, docs/tasks.md
# (Warm start)). They change no episode a policy imitates whole: the imitation ceiling is still DEMO_MIX's.
COPY_SHARE = 0.3
# The warm start's loss weight of the agent's digit tokens (the ids it copies) against its other tokens
# (``demos.loss_weights``): with copy demonstrations alone the copy was not learned in 400 steps either; with both it
# was by step 100 (the same pilots).
DIGIT_WEIGHT = 5.0
SUCCESS_MIX = {"good": 1.0}
FINAL = "done"  # the assistant's last turn: a short message, no call


def call_text(name: str, **arguments: str) -> str:
    """A Hermes tool-call block as the demonstrations write it (compact JSON)."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}"


def agent_turns(s: Scenario, kind: str, rng: random.Random) -> list[str]:
    """The assistant turns (each ends at the end-of-turn token, not included) of one demonstration of
    ``kind`` (:data:`DEMO_KINDS`) for scenario ``s``; the last one ends the episode (a wrong action ends it
    itself: no closing turn follows one)."""
    lookup = call_text("orders", user=s.user)
    tool, target = s.intent, s.target
    if kind == "good":
        return [lookup, call_text(tool, order=target), FINAL]
    if kind == "any_fit":  # the product unread: right only when the draw is the target
        pick = rng.choice(s.fitting)
        return [lookup, call_text(tool, order=pick)] + ([FINAL] if pick == target else [])
    if kind == "wrong_order":  # a decoy: status fits, product does not
        return [lookup, call_text(tool, order=rng.choice([o for o in s.fitting if o != target]))]
    if kind == "wrong_tool":
        return [lookup, call_text("refund" if tool == "cancel" else "cancel", order=target)]
    if kind == "guess":
        guess = f"o{rng.choice(ORDER_IDS)}"
        return [call_text(tool, order=guess)] + ([FINAL] if guess == target else [])
    if kind == "miscopy":  # one digit of the target's id changed
        digits = list(target[1:])
        i = rng.randrange(len(digits))
        digits[i] = rng.choice([d for d in "0123456789" if d != digits[i] and (i or d != "0")])
        return [lookup, call_text(tool, order="o" + "".join(digits))]
    raise ValueError(f"unknown customer-service demo kind {kind!r}; valid: {', '.join(DEMO_KINDS)}")
