"""Reward functions by import path (``spec.task.reward``) and the single-turn dataset environment.

A dataset plus a reward function is the shortest way in: no environment class. The user writes::

    # my_reward.py (a folder of spec.task.pythonPath, or anywhere on PYTHONPATH)
    def score(completion: str, answer, sample: dict) -> float:
        return float(completion.strip() == str(answer))

and the job's ``spec.task.reward: "my_reward:score"``. :class:`DatasetEnv` is the environment the
job builds from it, on the turn-level interface (``rollout/envs/interface.py``): ``reset`` gives the
row's prompt messages, the first assistant turn ends the episode, and ``step`` returns the reward
of ``fn(completion, answer, sample)``: the assistant's text of that turn (what the model wrote,
end-of-turn token excluded), the row's ``answerField`` value, and a copy of the whole row.

Faults are the interface's (``rollout/envs/runner.py``): an exception or a call past
``spec.task.envTimeoutSeconds`` aborts the episode and is counted; a reward that is not a finite
number (NaN, inf, a string) is counted as ``nonfinite_reward``. A reward of 1 or more counts as a
success (the success metrics and the evaluation's success rate); the reward itself is what trains.
"""

import importlib
import inspect
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from asyncrl.rollout.envs.dataset import Dataset, row_id
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Sample, Turn

RewardFn = Callable[[str, Any, Sample], float]  # fn(completion, answer, sample) -> reward
SUCCESS_REWARD = 1.0  # a reward >= this counts as a success


class ImportPathError(ImportError):
    """An import path that does not lead to a usable object; the message names the field and the fix."""


def add_python_path(folders: Sequence[str]) -> list[str]:
    """Put ``folders`` (``spec.task.pythonPath``; relative: from the working directory) first on
    ``sys.path`` of this process, once each; returns them as absolute paths."""
    out = []
    for folder in folders:
        p = str(Path(folder).resolve())
        if p not in sys.path:
            sys.path.insert(0, p)
        out.append(p)
    importlib.invalidate_caches()
    return out


def import_object(path: str, *, python_path: Sequence[str] = (), what: str = "spec.task.reward") -> Any:
    """The object at ``"pkg.mod:attr"`` (``attr`` may be dotted), with ``python_path`` folders first on
    ``sys.path``. Raises :class:`ImportPathError` naming ``what``, the module search and the fix."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"{what}: {path!r} is not 'package.module:function', e.g. 'my_reward:score'")
    folders = add_python_path(python_path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if missing != module_name and not module_name.startswith(missing + "."):
            raise ImportPathError(f"{what}: importing {module_name!r} failed: it imports {missing!r}, which is "
                                  f"not installed; install it where the job runs") from exc
        searched = ", ".join(folders) if folders else "no spec.task.pythonPath folders"
        raise ImportPathError(
            f"{what}: no module {module_name!r} on the Python path (searched {searched} and PYTHONPATH); add its "
            f"folder to spec.task.pythonPath (e.g. [examples/tasks]) or to PYTHONPATH, or install it in the image"
        ) from exc
    except Exception as exc:  # the module itself raised while importing
        raise ImportPathError(f"{what}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    obj: Any = module
    for i, part in enumerate(attr.split(".")):
        if not hasattr(obj, part):
            here = module_name + "".join("." + p for p in attr.split(".")[:i])
            names = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))
            raise ImportPathError(f"{what}: {here} has no attribute {part!r}; callables there: "
                                  f"{', '.join(names) or 'none'}")
        obj = getattr(obj, part)
    return obj


def load_reward(path: str, *, python_path: Sequence[str] = ()) -> RewardFn:
    """The reward function at ``path``, checked to take ``(completion, answer, sample)``."""
    fn = import_object(path, python_path=python_path, what="spec.task.reward")
    if not callable(fn):
        raise ImportPathError(f"spec.task.reward: {path!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("", None, {})
    except TypeError as exc:
        raise ImportPathError(f"spec.task.reward: {path!r} cannot be called as fn(completion, answer, sample) "
                              f"({exc}); give it three parameters") from None
    except ValueError:
        pass  # a builtin without a signature: called as is
    return cast(RewardFn, fn)


def finite_reward(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (``bool`` included), else None."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


class DatasetEnv:
    """One single-turn episode of a dataset job: the row's prompt, one answer, its reward.

    ``scorer(completion, answer, sample) -> float``: the reward function (:func:`load_reward`) or a
    remote service's client (``rollout/envs/remote.py``); ``name``: what the episode reports as its
    scorer. A fresh instance per episode (the interface's rule); the dataset is shared.
    """

    truncated_reward = 0.0

    def __init__(self, dataset: Dataset, scorer: RewardFn, name: str = "reward") -> None:
        self.dataset = dataset
        self.scorer = scorer
        self.name = name
        self.sample: Sample | None = None
        self.reward: float | None = None

    def reset(self, sample: Sample) -> Reset:
        self.sample = sample
        return Reset(self.dataset.messages(sample))

    def step(self, msg: AssistantMessage) -> Turn:
        if self.sample is None:
            raise RuntimeError("DatasetEnv.step called before reset(sample)")
        value = self.scorer(msg.text, self.dataset.answer(self.sample), dict(self.sample))
        reward = finite_reward(value)
        self.reward = reward
        if reward is None:  # the interface counts it (nonfinite_reward) and aborts this episode only
            return Turn(done=True, reward=cast(float, value), reason=f"{self.name} gave {value!r}")
        return Turn(done=True, reward=reward, success=reward >= SUCCESS_REWARD, reason=self.name)

    def info(self) -> dict[str, Any]:
        if self.sample is None:
            return {}
        return {"id": row_id(self.sample, self.dataset.spec), "answer": _plain(self.dataset.answer(self.sample)),
                "reward": self.reward}


def _plain(value: Any) -> Any:
    """``value`` when it is plain JSON data, else its ``repr`` (``Trajectory.info`` travels as JSON)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)
