"""``spec.eval``: periodic evaluation of the current policy on a fixed held-out prompt set.

Training success is measured on the batch being trained: sampled by versions ``v-W .. v`` at the
sampling temperature, so it lags the policy by up to W versions and cannot compare runs at equal
version. The evaluation answers "how good is version v": the rollout engine, holding exactly
version ``v``, answers ``prompts`` problems of the task's held-out split (never drawn for training),
the same problems every time (drawn from ``seed``), between two steps; nothing of it is trained on.
"""

from enum import StrEnum
from typing import ClassVar

from pydantic import Field, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, RuleError, at_defaults_cel


class EvalMode(StrEnum):
    """How the evaluation samples."""

    GREEDY = "greedy"  # the most likely token at every step (the policy's own answer)
    TEMPERATURE = "temperature"  # sampled at task.temperature, like training (seeded: the same noise every time)


EVAL_UNUSED_MESSAGE = (
    "eval.prompts, eval.mode and eval.seed are only used when eval.everySteps > 0 (0 turns the evaluation off); "
    "set everySteps, or remove them"
)


class EvalSpec(SpecModel):
    """``spec.eval``: evaluate the current policy every ``everySteps`` versions (0 = never)."""

    every_steps: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Evaluate the current policy after every this many policy versions, once at the start "
        "(version 0) and once at the end; 0 = no evaluation. The evaluation runs between two steps on the "
        "rollout workers at the current version and is never trained on.",
    )
    prompts: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Held-out prompts per evaluation, one sample each: the same problems every time, drawn "
        "from the task's held-out split (disjoint from every training prompt), split across rollout workers.",
    )
    mode: EvalMode = Field(
        default=EvalMode.GREEDY,
        description="greedy: the most likely token at every step; temperature: sampled at task.temperature "
        "with a fixed seed (the same sampling noise at every evaluation).",
    )
    seed: int = Field(
        default=0, ge=0, le=2**32 - 1,
        description="Seed of the held-out prompt draw (and of the sampler in temperature mode), 0 .. 2^32-1.",
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @model_validator(mode="after")
    def _settings_need_every_steps(self) -> "EvalSpec":
        if self.every_steps == 0:
            # (changed_from_defaults would build an EvalSpec() and recurse into this validator)
            changed = [f.alias or name for name, f in type(self).model_fields.items()
                       if name != "every_steps" and getattr(self, name) != f.default]
            if changed:
                raise RuleError([("", f"{EVAL_UNUSED_MESSAGE} (set here: {', '.join(changed)})")])
        return self

    @property
    def enabled(self) -> bool:
        return self.every_steps > 0


def _settings_rule() -> CelRule:
    # everySteps is compared with its default 0 by at_defaults_cel: any value > 0 passes the first term.
    return CelRule(f"(has(self.everySteps) && self.everySteps > 0) || ({at_defaults_cel(EvalSpec)})",
                   EVAL_UNUSED_MESSAGE)


# The CRD rule mirroring ``_settings_need_every_steps`` (its bad input: tests/support/bad_inputs.py).
EVAL_SETTINGS_RULE = _settings_rule()
EvalSpec.cel_rules = (EVAL_SETTINGS_RULE,)
