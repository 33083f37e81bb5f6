"""A user's reward module, imported by path as a job would (spec.task.pythonPath: [tests/rollout/userland],
spec.task.reward: "dataset_reward:exact"); nothing of asyncrl is imported here."""

import math


def exact(completion: str, answer, sample: dict) -> float:
    """1.0 when the completion (stripped) is the answer, else 0.0."""
    return float(completion.strip() == str(answer))


def nan_reward(completion: str, answer, sample: dict) -> float:
    return math.nan


def raises(completion: str, answer, sample: dict) -> float:
    raise KeyError("the user's bug")


def two_args(completion: str, answer) -> float:
    return 0.0


class Scorer:
    @staticmethod
    def length(completion: str, answer, sample: dict) -> float:
        return float(len(completion) <= int(sample.get("max_len", 8)))


NOT_CALLABLE = 3
