"""The optional environment methods are declared protocols, and dispatch goes by them (rollout/envs/base.py
TurnLevelEnvironment, rollout/envs/interface.py WithInfo / WithTruncatedReward): an environment without
them works exactly as one that never heard of them."""

import concurrent.futures
import random
from typing import Any

from asyncrl.rollout.engine import add_sampled_token
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import CONTINUE, EnvStep, TurnLevelEnvironment, turn_level
from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
from asyncrl.rollout.envs.interface import (
    AssistantMessage,
    Reset,
    Sample,
    Turn,
    WithInfo,
    WithTruncatedReward,
)
from asyncrl.rollout.episode import Episode

T = TEXT_TOKENIZER


class Bare:
    """A user environment with the two required methods only."""

    def __init__(self) -> None:
        self.steps: list[str] = []

    def reset(self, sample: Sample) -> Reset:
        return Reset([{"role": "user", "content": "Say ok."}])

    def step(self, msg: AssistantMessage) -> Turn:
        self.steps.append(msg.content)
        return Turn(done=True, reward=1.0, success=True)


class Described(Bare):
    truncated_reward = -0.5

    def info(self) -> dict[str, Any]:
        return {"level": 3}


class BrokenInfo(Bare):
    def info(self) -> dict[str, Any]:
        raise KeyError("level")


class Blocked(Bare):
    info = None  # None blocks an optional method (as the getattr(env, "info", None) it replaces read it)


def test_optional_user_members_are_protocols_and_their_absence_keeps_the_defaults() -> None:
    assert not isinstance(Bare(), WithInfo) and not isinstance(Bare(), WithTruncatedReward)
    assert isinstance(Described(), WithInfo) and isinstance(Described(), WithTruncatedReward)
    assert not isinstance(Blocked(), WithInfo)
    got = {cls.__name__: TurnAdapter("t", cls(), {}, T) for cls in (Bare, Described, BrokenInfo, Blocked)}
    assert {k: a.info() for k, a in got.items()} == {
        "Bare": {}, "Described": {"level": 3}, "BrokenInfo": {"info_error": "KeyError: 'level'"}, "Blocked": {},
    }
    assert {k: a.truncated_reward for k, a in got.items()} == {
        "Bare": 0.0, "Described": -0.5, "BrokenInfo": 0.0, "Blocked": 0.0,
    }


class TokenLevel:
    """A token-level environment (``Environment``): answers every token, ends at the 3rd."""

    task = "tokens"
    truncated_reward = 0.0
    tokenizer = T

    def __init__(self) -> None:
        self.texts: list[str] = []

    def reset(self, rng: random.Random) -> list[int]:
        return T.encode("Q", bos=True)

    def step(self, turn_text: str) -> EnvStep:
        self.texts.append(turn_text)
        return EnvStep(done=True, reward=1.0) if len(self.texts) == 3 else CONTINUE

    def info(self) -> dict[str, Any]:
        return {}


class HalfTurnLevel(TokenLevel):
    def end_of_turn(self, turn_text: str) -> AssistantMessage | None:  # without submit/finish_turn
        raise AssertionError("not a TurnLevelEnvironment: never asked")


class Submits(TurnAdapter):
    """The adapter, recording what the engine submits off the decode loop."""

    def __init__(self) -> None:
        super().__init__("t", Bare(), {}, T)
        self.submitted: list[str] = []

    def submit(self, msg: AssistantMessage) -> "concurrent.futures.Future[Any]":
        self.submitted.append(msg.content)
        return super().submit(msg)


def test_the_engine_dispatches_on_the_turn_level_protocol() -> None:
    adapter = Submits()
    assert isinstance(adapter, TurnLevelEnvironment) and turn_level(adapter) is adapter
    assert turn_level(TokenLevel()) is None and turn_level(HalfTurnLevel()) is None  # all three, or none

    # token level: step() after every sampled token, with the turn's text so far
    for env in (TokenLevel(), HalfTurnLevel()):
        e = Episode.start("a", "g", env, random.Random(0))
        assert e.turn_level is None
        for ch in "okx":
            add_sampled_token(e, T.encode(ch)[0], 0, -0.1, 16)
        assert env.texts == ["o", "ok", "okx"] and e.done and e.reward == 1.0

    # turn level: submitted once, when the turn ends (the end-of-turn token); the user's step() runs once
    e = Episode.start("b", "g", adapter, random.Random(0))
    assert e.turn_level is adapter
    for tok in [*T.encode("ok"), T.eos_id]:
        add_sampled_token(e, tok, 0, -0.1, 16)
    assert adapter.submitted == ["ok"] and adapter.env.steps == ["ok"]  # type: ignore[attr-defined]
    assert e.done and e.reward == 1.0
