"""What a policy did in one customer-service episode, from the environment's call log (issue 39).

A success rate alone cannot tell the skill from a shortcut: a 3x gain at 5 % is as consistent with learning to
guess ids as with learning to read the product. Every evaluation therefore counts, over its episodes, these
flags of :func:`behaviour` (each a yes/no of one episode; the *action* is the first ``cancel``/``refund`` call,
the only one that counts, since a wrong one ends the episode):

- ``looked_up``: an ``orders`` call before the action;
- ``copied_user``: one of them named the request's user id exactly;
- ``acted``: an action was called;
- ``right_tool``: the action was the intent's tool;
- ``right_order``: the action named the target order;
- ``first_fit``: the action named the first listed order whose status fits (the status shortcut's choice);
- ``guessed``: the action named an id that no lookup answer before it had shown (typed, not copied).

``first_fit`` and ``right_order`` overlap when the target is listed first among the fitting orders (1 time in
the fitting count): a policy that only takes the shortcut has ``first_fit`` ~1 and ``right_order`` ~0.28, one
with the skill ``right_order`` ~1 and ``first_fit`` ~0.28.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

Call = tuple[str, str, str]  # (tool name, its argument: the user or order id, the tool's answer)
FLAGS = ("looked_up", "copied_user", "acted", "right_tool", "right_order", "first_fit", "guessed")
ACTIONS = ("cancel", "refund")  # the task's action tools (customer_service.INTENTS' keys; a test holds them equal)


class ScenarioView(Protocol):
    """What :func:`behaviour` reads of a scenario (``customer_service.Scenario``; a Protocol keeps this module free
    of the task's, which imports it)."""

    @property
    def user(self) -> str: ...
    @property
    def intent(self) -> str: ...
    @property
    def target(self) -> str: ...
    @property
    def fitting(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Behaviour:
    """The flags of one episode (the module docstring)."""

    looked_up: bool
    copied_user: bool
    acted: bool
    right_tool: bool
    right_order: bool
    first_fit: bool
    guessed: bool

    def flags(self) -> dict[str, bool]:
        return asdict(self)


def _listed(answer: str) -> set[str]:
    """The order ids an ``orders`` answer shows (``o318 lamp placed;o702 mug delivered``; none in an error)."""
    if answer.startswith("error"):
        return set()
    return {row.split(" ", 1)[0] for row in answer.split(";") if row}


def behaviour(s: ScenarioView, log: Sequence[Call]) -> Behaviour:
    """The flags of the episode of scenario ``s`` whose well-formed calls were ``log``, in order."""
    looked, copied, shown = False, False, set[str]()
    for name, arg, answer in log:
        if name == "orders":
            looked, copied = True, copied or arg == s.user
            shown |= _listed(answer)
        elif name in ACTIONS:
            return Behaviour(looked, copied, True, name == s.intent, arg == s.target, arg == s.fitting[0],
                             arg not in shown)
    return Behaviour(looked, copied, False, False, False, False, False)


def tally(flags: Iterable[Mapping[str, bool]]) -> dict[str, int]:
    """``{"episodes": n, flag: episodes with it}`` over the episodes' :meth:`Behaviour.flags` (an episode of
    another task, with no flags, is not counted)."""
    out = {"episodes": 0, **dict.fromkeys(FLAGS, 0)}
    for f in flags:
        if not f:
            continue
        out["episodes"] += 1
        for k in FLAGS:
            out[k] += bool(f.get(k, False))
    return out


def rates(counts: Mapping[str, int]) -> dict[str, float]:
    """Each flag's share of the counted episodes (0 with none)."""
    n = counts.get("episodes", 0)
    return {k: round(counts.get(k, 0) / n, 4) if n else 0.0 for k in FLAGS}
