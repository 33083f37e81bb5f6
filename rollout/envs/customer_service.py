"""The built-in ``customer-service`` task: tool use against a tiny order database (τ-bench-like).

Each sample is a scenario: a user (``u3``), their orders (id, product, status) in an in-memory
database, and the user's goal, stated by a scripted user in the first message (``u3: cancel lamp``:
cancel the order of that product; or ``refund``: refund a delivered one). The assistant has three
tools (JSON schemas in :data:`TOOLS`, rendered by a real model's chat template):

- ``orders(user)`` -> the user's orders, ``o31 lamp placed;o47 mug delivered``;
- ``cancel(order)`` -> ``ok`` (a placed order becomes cancelled) or an error;
- ``refund(order)`` -> ``ok`` (a delivered order becomes refunded) or an error.

Calls are Hermes blocks, ``<tool_call>{"name":"orders","arguments":{"user":"u3"}}</tool_call>``; the
turn ends at ``</tool_call>`` (a stop string) and the tool's answer is forced inline as
``<tool_response>...</tool_response>``. A turn without a call ends the episode (a question, one
ending in ``?``, gets the scripted user's one reply: the request again). As τ-bench scores, the
reward is 1 when the database's final state equals the goal's (the target order changed as asked,
nothing else changed), else 0; a malformed call gets an error response and uses up a call.

A model without its own tokenizer (the tiny presets) reads and writes this task through
``envs/cs_vocab.py``: the text alphabet plus the task's words and ids as single tokens, as a real
vocabulary has them (with ids spelled in digits the tiny model's warm start never got a call right).
"""

import json
import random
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.split import is_heldout
from asyncrl.rollout.envs.toolcalls import OPEN

PRODUCTS = ("lamp", "mug", "desk", "sofa", "pen", "hat", "bag", "cup", "rug", "fan")
STATUSES = ("placed", "shipped", "delivered")
INTENTS = {"cancel": ("placed", "cancelled"), "refund": ("delivered", "refunded")}  # needs, becomes
STOP = ("</tool_call>",)
CS_MAX_PROMPT_TOKENS = 1024  # a chat template's system prompt and tool schemas (the char alphabet: ~20)
SYSTEM = (
    "You are a customer-service agent for a shop. Look up the user's orders with the orders tool, then "
    "cancel (placed orders) or refund (delivered orders) exactly the order the user asks about. Reply "
    "with a short message and no tool call when you are done."
)


def _tool(name: str, doc: str, arg: str, arg_doc: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": doc,
        "parameters": {"type": "object", "properties": {arg: {"type": "string", "description": arg_doc}},
                       "required": [arg]}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("orders", "List a user's orders as 'id product status' separated by ';'.", "user", "user id, e.g. u3"),
    _tool("cancel", "Cancel a placed order.", "order", "order id, e.g. o31"),
    _tool("refund", "Refund a delivered order.", "order", "order id, e.g. o47"),
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

    def to_sample(self) -> dict[str, Any]:
        return {"user": self.user, "orders": [list(o) for o in self.orders], "intent": self.intent,
                "product": self.product}

    @classmethod
    def from_sample(cls, s: dict[str, Any]) -> "Scenario":
        return cls(str(s["user"]), tuple((str(a), str(b), str(c)) for a, b, c in s["orders"]), str(s["intent"]),
                   str(s["product"]))


def draw_scenario(rng: random.Random) -> Scenario:
    """A user with 2-3 orders of distinct products; the target's status allows the intent."""
    intent = rng.choice(tuple(INTENTS))
    n = rng.randint(2, 3)
    products = rng.sample(PRODUCTS, n)
    ids = rng.sample(range(1, 10), n)  # o1-o9: one token each with the task's vocabulary (envs/cs_vocab.py)
    k = rng.randrange(n)
    orders = tuple(
        (f"o{ids[i]}", products[i], INTENTS[intent][0] if i == k else rng.choice(STATUSES)) for i in range(n)
    )
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


def _response(text: str) -> list[dict[str, Any]]:
    return [{"role": "tool", "content": f"<tool_response>{text}</tool_response>"}]


class CustomerService:
    """One customer-service episode (a turn-level environment, ``envs/interface.py``)."""

    truncated_reward = 0.0

    def __init__(self, max_tool_calls: int = 4) -> None:
        self.max_tool_calls = max_tool_calls
        self.scenario: Scenario | None = None
        self.db: dict[str, list[str]] = {}  # order id -> [user, product, status]
        self.calls = 0
        self.nudged = False

    def reset(self, sample: dict[str, Any]) -> Reset:
        s = self.scenario = Scenario.from_sample(sample)
        self.db = {o: [s.user, p, st] for o, p, st in s.orders}
        self.calls, self.nudged = 0, False
        msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": s.request}]
        return Reset(msgs, tools=TOOLS, stop=STOP)

    def goal_state(self) -> dict[str, list[str]]:
        s = self._need()
        goal = {o: [s.user, p, st] for o, p, st in s.orders}
        goal[s.target][2] = INTENTS[s.intent][1]
        return goal

    def _need(self) -> Scenario:
        if self.scenario is None:
            raise RuntimeError("CustomerService: step() before reset()")
        return self.scenario

    def _run(self, name: str, args: dict[str, Any]) -> str:
        if name == "orders":
            user = args.get("user")
            mine = [f"{o} {p} {st}" for o, (u, p, st) in self.db.items() if u == user]
            return ";".join(mine) if mine else f"error: no user {user}"
        if name in INTENTS:
            order = args.get("order")
            row = self.db.get(str(order))
            if row is None:
                return f"error: no order {order}"
            needs, becomes = INTENTS[name]
            if row[2] != needs:
                return f"error: {order} is {row[2]}"
            row[2] = becomes
            return "ok"
        return f"error: no tool {name}"

    def step(self, msg: AssistantMessage) -> Turn:
        s = self._need()
        if msg.tool_calls or msg.malformed or OPEN in msg.text:
            self.calls += 1
            if self.calls > self.max_tool_calls:
                return Turn(done=True, reason=f"more than {self.max_tool_calls} tool calls")
            if msg.malformed or not msg.tool_calls:  # short: the details (msg.malformed) would echo the bad text
                return Turn(_response("error: malformed call"))
            call = msg.tool_calls[0]
            return Turn(_response(self._run(call.name, dict(call.arguments))))
        if msg.content.rstrip().endswith("?") and not self.nudged:  # the scripted user answers once
            self.nudged = True
            return Turn([{"role": "user", "content": s.request}])
        ok = self.db == self.goal_state()
        return Turn(done=True, reward=float(ok), success=ok, reason="goal reached" if ok else "goal missed")

    def info(self) -> dict[str, Any]:
        s = self._need()
        return {"request": s.request, "target": s.target, "tool_calls": self.calls,
                "db": json.dumps({o: r[2] for o, r in self.db.items()}, sort_keys=True)}


# ---- warm-start demonstrations (envs/demos.py plays them through the environment) -------------------
# Kinds, in the spirit of the math tasks' mix: the right calls; a wrong but listed order; the other
# intent's tool; an order id guessed without the lookup; the target's id miscopied (a neighbour id).
# Every id a demonstration writes after the lookup is copied from the context except a miscopy's (a
# near id), so the warm start learns to copy ids before RL teaches which listed order is the one.
DEMO_MIX = {"good": 0.5, "wrong_order": 0.2, "wrong_tool": 0.1, "guess": 0.15, "miscopy": 0.05}


def call_text(name: str, **arguments: str) -> str:
    """A Hermes tool-call block as the demonstrations write it (compact JSON)."""
    body = json.dumps({"name": name, "arguments": arguments}, separators=(",", ":"))
    return f"{OPEN}{body}</tool_call>"


def agent_turns(s: Scenario, kind: str, rng: random.Random) -> list[str]:
    """The assistant turns of one demonstration of ``kind`` for scenario ``s`` (the last ends the episode)."""
    lookup = call_text("orders", user=s.user)
    tool, target = s.intent, s.target
    if kind == "good":
        return [lookup, call_text(tool, order=target), "<eos>"]
    if kind == "wrong_order":
        other = rng.choice([o for o, _, _ in s.orders if o != target])
        return [lookup, call_text(tool, order=other), "<eos>"]
    if kind == "wrong_tool":
        return [lookup, call_text("refund" if tool == "cancel" else "cancel", order=target), "<eos>"]
    if kind == "guess":
        return [call_text(tool, order=f"o{rng.randint(1, 9)}"), "<eos>"]
    if kind == "miscopy":  # a neighbour of the target's id (o1-o9)
        k = int(target[1:])
        bad = f"o{rng.choice([d for d in (k - 1, k + 1) if d >= 1])}"
        return [lookup, call_text(tool, order=bad), "<eos>"]
    raise ValueError(f"unknown customer-service demo kind {kind!r}; valid: {', '.join(DEMO_MIX)}")
