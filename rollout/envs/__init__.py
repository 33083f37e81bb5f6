"""Agent environments: the turn-level interface users implement (:mod:`.interface`), the adapter that
turns it into the engines' token-level :class:`Environment` (:mod:`.adapter`), tool-call parsing,
the built-in tasks (math, customer-service) and their warm-start demos."""

from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import Environment, EnvStep, ScriptedEpisode, replay, rescore
from asyncrl.rollout.envs.demos import DemoBatch, demonstrations, pad_batch
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, ToolCall, Turn, TurnEnvironment
from asyncrl.rollout.envs.registry import TASKS, TaskDef, get_task, make_env

__all__ = [
    "TASKS",
    "AssistantMessage",
    "DemoBatch",
    "EnvStep",
    "Environment",
    "Reset",
    "ScriptedEpisode",
    "TaskDef",
    "ToolCall",
    "Turn",
    "TurnAdapter",
    "TurnEnvironment",
    "demonstrations",
    "get_task",
    "make_env",
    "pad_batch",
    "replay",
    "rescore",
]
