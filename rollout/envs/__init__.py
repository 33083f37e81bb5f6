"""Agent environments: the :class:`Environment` protocol, built-in tasks and warm-start demos."""

from asyncrl.rollout.envs.base import Environment, EnvStep, ScriptedEpisode, replay, rescore
from asyncrl.rollout.envs.demos import DemoBatch, demonstrations, pad_batch
from asyncrl.rollout.envs.registry import TASKS, TaskDef, get_task, make_env

__all__ = [
    "TASKS",
    "DemoBatch",
    "EnvStep",
    "Environment",
    "ScriptedEpisode",
    "TaskDef",
    "demonstrations",
    "get_task",
    "make_env",
    "pad_batch",
    "replay",
    "rescore",
]
