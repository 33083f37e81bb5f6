"""``conforms`` (rollout/envs/conforms.py) answers exactly as ``isinstance`` for the rollout's protocols: the
members present as class or instance attributes, missing, a method set to None, a subclass of the protocol."""

from typing import Any

import pytest

from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import TurnLevelEnvironment
from asyncrl.rollout.envs.conforms import conforms
from asyncrl.rollout.envs.interface import WithInfo, WithTruncatedReward


class Nothing:
    pass


class HasInfo:
    def info(self) -> dict[str, Any]:
        return {}


class InfoNone:
    info = None


class RewardInInit:
    def __init__(self) -> None:
        self.truncated_reward = -1.0


class RewardOnClass:
    truncated_reward = 0.5


class Turns:
    def end_of_turn(self, turn_text: str) -> None:
        return None

    def submit(self, msg: Any) -> None:
        return None

    def finish_turn(self, msg: Any, turn: Any) -> None:
        return None


class TwoOfThree:
    def end_of_turn(self, turn_text: str) -> None:
        return None

    def submit(self, msg: Any) -> None:
        return None


class Explicit(WithInfo):
    pass


def _info_blocked() -> HasInfo:
    obj = HasInfo()
    obj.info = None  # type: ignore[method-assign,assignment]
    return obj


def _info_in_instance() -> Nothing:
    obj = Nothing()
    obj.info = lambda: {}  # type: ignore[attr-defined]
    return obj


CASES = [  # (object, protocol, the answer derived by hand from the protocol's members)
    (HasInfo(), WithInfo, True),
    (Nothing(), WithInfo, False),
    (InfoNone(), WithInfo, False),  # a method member set to None on the class blocks it
    (_info_blocked(), WithInfo, True),  # the class has info(): isinstance's class check answers first
    (_info_in_instance(), WithInfo, True),
    (Explicit(), WithInfo, True),
    (RewardInInit(), WithTruncatedReward, True),
    (RewardOnClass(), WithTruncatedReward, True),
    (HasInfo(), WithTruncatedReward, False),
    (Turns(), TurnLevelEnvironment, True),
    (TwoOfThree(), TurnLevelEnvironment, False),
    (Nothing(), TurnLevelEnvironment, False),
]


@pytest.mark.parametrize(("obj", "proto", "expected"), CASES)
def test_conforms_is_isinstance(obj: object, proto: type, expected: bool) -> None:
    assert isinstance(obj, proto) is expected
    assert conforms(obj, proto) is expected
    assert conforms(obj, proto) is expected  # the second call reads the cached members


def test_the_adapter_is_turn_level_by_its_members() -> None:
    members = {"end_of_turn", "submit", "finish_turn"}
    assert all(callable(getattr(TurnAdapter, m)) for m in members)
    assert conforms(TurnAdapter.__new__(TurnAdapter), TurnLevelEnvironment) is True
