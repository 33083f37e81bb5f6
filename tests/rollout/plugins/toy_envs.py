"""Plug-in environments of the rollout tests, imported by path as a user's would be
(``spec.task.pythonPath: [tests/rollout/plugins]``, ``spec.task.environment: "toy_envs:Relay"``).

Every character is a stop string, so each assistant turn is exactly one sampled token and an
episode of ``turns`` turns has a known shape whatever the weights: prompt, then (one agent token,
the observation ``<res>k</res>``) repeated, the last agent token ending it.
"""

import asyncio
import math
import string
import threading
import time

from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn

EVERY_CHAR = tuple(string.printable[:94])  # digits, letters, punctuation: any sampled character ends a turn


class Relay:
    """``turns`` one-token turns, each answered with ``<res>k</res>``; reward 1 if the last token is a digit.

    ``fault`` makes step ``fail_at`` (1-based turn) misbehave: ``raise``, ``hang`` (sleeps ``hang_s``),
    ``nan`` (a NaN final reward), ``garbage`` (an observation that is not a chat message),
    ``unencodable`` (text the tokenizer cannot encode); ``reset`` raises in reset.

    ``stepped`` / ``hold`` (``threading.Event``, given in ``args`` by a test in the same process): ``stepped`` is
    set when a step is first answered; from the second step on, :class:`AsyncRelay` answers only once ``hold`` is
    set, so a test knows episodes are in flight and cannot finish until it lets them.
    """

    def __init__(self, turns: int = 3, fault: str = "", fail_at: int = 1, hang_s: float = 5.0, sleep_s: float = 0.0,
                 faulty_seeds: int = 0, stepped: threading.Event | None = None,
                 hold: threading.Event | None = None) -> None:
        self.stepped, self.hold = stepped, hold
        self.turns, self.fault, self.fail_at, self.hang_s, self.sleep_s = turns, fault, fail_at, hang_s, sleep_s
        self.faulty_seeds = faulty_seeds  # >0: only samples whose seed % faulty_seeds == 0 misbehave
        self.k = 0
        self.faulty = True

    def reset(self, sample: dict) -> Reset:
        seed = int(sample.get("seed", 0))
        self.faulty = bool(self.fault) and (self.faulty_seeds == 0 or (seed // 2) % self.faulty_seeds == 0)
        if self.faulty and self.fault == "reset":
            raise KeyError("no such customer")
        return Reset([{"role": "user", "content": f"Q:{seed % 10}"}], stop=EVERY_CHAR)

    def _turn(self, msg: AssistantMessage) -> Turn:
        self.k += 1
        if self.stepped is not None:
            self.stepped.set()
        if self.faulty and self.k == self.fail_at:
            if self.fault == "raise":
                raise ZeroDivisionError("the tool divided by zero")
            if self.fault == "nan":
                return Turn(done=True, reward=math.nan)
            if self.fault == "garbage":
                return Turn([{"role": 3, "text": None}])  # type: ignore[dict-item]
            if self.fault == "unencodable":
                return Turn([{"role": "tool", "content": "résumé ☃"}])
        if self.k >= self.turns:
            ok = msg.text[:1].isdigit()
            return Turn(done=True, reward=float(ok), success=ok, reason="relayed")
        return Turn([{"role": "tool", "content": f"<res>{self.k}</res>"}])

    def step(self, msg: AssistantMessage) -> Turn:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.faulty and self.fault == "hang" and self.k + 1 == self.fail_at:
            time.sleep(self.hang_s)
        return self._turn(msg)

    def info(self) -> dict:
        return {"turns": self.k}


class AsyncRelay(Relay):
    """The same episodes, ``async def step`` (an environment that calls services)."""

    async def step(self, msg: AssistantMessage) -> Turn:  # type: ignore[override]
        if self.sleep_s:
            await asyncio.sleep(self.sleep_s)
        if self.hold is not None and self.k >= 1:
            await asyncio.to_thread(self.hold.wait)
        if self.faulty and self.fault == "hang" and self.k + 1 == self.fail_at:
            await asyncio.sleep(self.hang_s)
        return self._turn(msg)


class Broken:
    """A factory that cannot be constructed (the job must fail at start, exit code 2)."""

    def __init__(self, level: int = 1) -> None:
        raise ValueError(f"level {level} needs a licence key")
