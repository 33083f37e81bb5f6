"""The built-in ``customer-service`` task: tool use against a tiny order database (τ-bench-like).

Each sample is a scenario: a user (``u3``), their 3-4 orders (id, product, status) in an in-memory
database, and the user's goal, stated by a scripted user in the first message (``u3: cancel lamp``:
cancel the order of that product; ``refund``: refund a delivered one). The assistant sees the shop's
instructions (:data:`SYSTEM`) and three tools (JSON schemas in :data:`TOOLS`) through the chat template:

- ``orders(user)`` -> the user's orders, ``o3 lamp placed;o7 mug delivered;o5 pen placed``;
- ``cancel(order)`` -> ``ok`` (a placed order becomes cancelled) or an error;
- ``refund(order)`` -> ``ok`` (a delivered order becomes refunded) or an error.

**No status shortcut.** Two or three of the user's orders have the status the intent needs (two or three
placed orders for a cancel), so acting on the first order whose status fits succeeds about half the time
or less (:func:`first_fit_turns`, measured in ``tests/rollout/test_customer_service.py``); only reading the
product in the request and finding it in the lookup's answer always succeeds.

Calls are Hermes blocks, ``<tool_call>{"name":"orders","arguments":{"user":"u3"}}</tool_call>``, and the
turn ends at the end-of-turn token (the model writes ``...</tool_call><|im_end|>``); the tool's answer is a
``tool`` message the chat template renders. A turn without a call ends the episode (a question, one ending
in ``?``, gets the scripted user's one reply: the request again). As τ-bench scores, the reward is 1 when
the database's final state equals the goal's (the target order changed as asked, nothing else changed),
else 0; a malformed call gets an error answer and uses up a call.

The parts another harness reuses without the environment class (the OpenAI Agents SDK example,
``examples/agents/cs_sdk_agent.py``): :data:`SYSTEM`, :data:`TOOLS`, :func:`draw_scenario` /
:class:`ScenarioSamples`, the database :func:`new_db`, the tools :func:`run_tool` and the goal check
:func:`goal_db` / :func:`goal_reached`. A model without its own tokenizer (the tiny presets) reads and
writes this task through the task's byte-level BPE with a ChatML template (``envs/cs_tokenizer.py``).
"""

import json
import random
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.split import is_heldout
from asyncrl.rollout.envs.toolcalls import CLOSE, OPEN

PRODUCTS = ("lamp", "mug", "desk", "sofa", "pen", "hat", "bag", "cup", "rug", "fan")
STATUSES = ("placed", "shipped", "delivered")
INTENTS = {"cancel": ("placed", "cancelled"), "refund": ("delivered", "refunded")}  # needs, becomes
ORDERS_PER_USER = (3, 4)  # a user's orders
FITTING = (2, 3)  # of them, orders whose status fits the intent (the target and 1-2 decoys)
CS_MAX_PROMPT_TOKENS = 1024  # a real model's template with the tool schemas; the task's BPE: ~60 (cs_tokenizer.py)
SYSTEM = "You are a shop's agent. Look up the user's orders, then cancel or refund the one of the product they name."

Db = dict[str, list[str]]  # order id -> [user, product, status]


def _tool(name: str, doc: str, arg: str, arg_doc: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": doc,
        "parameters": {"type": "object", "properties": {arg: {"type": "string", "description": arg_doc}},
                       "required": [arg]}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("orders", "List a user's orders (id product status).", "user", "user id, e.g. u3"),
    _tool("cancel", "Cancel a placed order.", "order", "order id, e.g. o3"),
    _tool("refund", "Refund a delivered order.", "order", "order id, e.g. o7"),
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
    """A user with 3-4 orders of distinct products, 2-3 of them (the target and decoys) in the status the
    intent needs, the others in another status; listed in random order."""
    intent = rng.choice(tuple(INTENTS))
    needs = INTENTS[intent][0]
    n = rng.choice(ORDERS_PER_USER)
    m = rng.choice([f for f in FITTING if f < n])
    products = rng.sample(PRODUCTS, n)
    ids = rng.sample(range(1, 10), n)  # o1-o9
    others = [s for s in STATUSES if s != needs]
    statuses = [needs] * m + [rng.choice(others) for _ in range(n - m)]
    rng.shuffle(statuses)
    k = rng.choice([i for i in range(n) if statuses[i] == needs])
    orders = tuple((f"o{ids[i]}", products[i], statuses[i]) for i in range(n))
    return Scenario(f"u{rng.randint(1, 9)}", orders, intent, products[k])


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
    """Run tool ``name`` with ``args`` against ``db`` (changed in place); the tool's answer text."""
    if name == "orders":
        user = args.get("user")
        mine = [f"{o} {p} {st}" for o, (u, p, st) in db.items() if u == user]
        return ";".join(mine) if mine else f"error: no user {user}"
    if name in INTENTS:
        order = args.get("order")
        row = db.get(str(order))
        if row is None:
            return f"error: no order {order}"
        needs, becomes = INTENTS[name]
        if row[2] != needs:
            return f"error: {order} is {row[2]}"
        row[2] = becomes
        return "ok"
    return f"error: no tool {name}"


def goal_db(s: Scenario) -> Db:
    """The database the user's goal asks for: the target changed as asked, nothing else."""
    goal = new_db(s)
    goal[s.target][2] = INTENTS[s.intent][1]
    return goal


def goal_reached(s: Scenario, db: Db) -> bool:
    """τ-bench's check: the final database equals the goal's."""
    return db == goal_db(s)


class CustomerService:
    """One customer-service episode (a turn-level environment, ``envs/interface.py``)."""

    truncated_reward = 0.0

    def __init__(self, max_tool_calls: int = 4) -> None:
        self.max_tool_calls = max_tool_calls
        self.scenario: Scenario | None = None
        self.db: Db = {}
        self.calls = 0
        self.nudged = False

    def reset(self, sample: dict[str, Any]) -> Reset:
        s = self.scenario = Scenario.from_sample(sample)
        self.db = new_db(s)
        self.calls, self.nudged = 0, False
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
                return Turn(done=True, reason=f"more than {self.max_tool_calls} tool calls")
            if msg.malformed or not msg.tool_calls:  # short: the details (msg.malformed) would echo the bad text
                return Turn([{"role": "tool", "content": "error: malformed call"}])
            call = msg.tool_calls[0]
            return Turn([{"role": "tool", "content": run_tool(self.db, call.name, dict(call.arguments))}])
        if msg.content.rstrip().endswith("?") and not self.nudged:  # the scripted user answers once
            self.nudged = True
            return Turn([{"role": "user", "content": s.request}])
        ok = goal_reached(s, self.db)
        return Turn(done=True, reward=float(ok), success=ok, reason="goal reached" if ok else "goal missed")

    def info(self) -> dict[str, Any]:
        s = self._need()
        return {"request": s.request, "target": s.target, "tool_calls": self.calls,
                "db": json.dumps({o: r[2] for o, r in self.db.items()}, sort_keys=True)}


# ---- warm-start demonstrations (envs/demos.py plays them through the environment) -------------------
# Kinds, in the spirit of the math tasks' mix: the right calls; another order whose status fits (the
# status shortcut's mistake); the other intent's tool; an order id guessed without the lookup; the
# target's id miscopied (a neighbour id). Every id a demonstration writes after the lookup is copied from
# the context except a miscopy's, so the warm start learns to copy ids; which fitting order is the one the
# user named is what RL has to find.
DEMO_MIX = {"good": 0.5, "wrong_order": 0.2, "wrong_tool": 0.1, "guess": 0.15, "miscopy": 0.05}
FINAL = "done"  # the assistant's last turn: a short message, no call


def call_text(name: str, **arguments: str) -> str:
    """A Hermes tool-call block as the demonstrations write it (compact JSON)."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}"


def agent_turns(s: Scenario, kind: str, rng: random.Random) -> list[str]:
    """The assistant turns (each ends at the end-of-turn token, not included) of one demonstration of
    ``kind`` for scenario ``s``; the last one ends the episode."""
    lookup = call_text("orders", user=s.user)
    tool, target = s.intent, s.target
    if kind == "good":
        return [lookup, call_text(tool, order=target), FINAL]
    if kind == "wrong_order":  # a decoy: status fits, product does not
        other = rng.choice([o for o in s.fitting if o != target])
        return [lookup, call_text(tool, order=other), FINAL]
    if kind == "wrong_tool":
        return [lookup, call_text("refund" if tool == "cancel" else "cancel", order=target), FINAL]
    if kind == "guess":
        return [call_text(tool, order=f"o{rng.randint(1, 9)}"), FINAL]
    if kind == "miscopy":  # a neighbour of the target's id (o1-o9)
        k = int(target[1:])
        bad = f"o{rng.choice([d for d in (k - 1, k + 1) if d >= 1])}"
        return [lookup, call_text(tool, order=bad), FINAL]
    raise ValueError(f"unknown customer-service demo kind {kind!r}; valid: {', '.join(DEMO_MIX)}")


def first_fit_turns(s: Scenario) -> list[str]:
    """The status shortcut as a scripted policy: look up, act on the first listed order whose status fits."""
    return [call_text("orders", user=s.user), call_text(s.intent, order=s.fitting[0]), FINAL]
