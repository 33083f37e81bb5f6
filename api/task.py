"""``spec.task``: the environment (agent task) and how it is sampled.

Its data-source settings (``dataset``, ``rewardService``, import paths) and their rules are in
:mod:`asyncrl.api.dataset`.
"""

from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from asyncrl.api.agent import (
    AGENT_MESSAGE,
    AGENT_PATTERN,
    AGENT_WITH_ENVIRONMENT_MESSAGE,
    IN_PROCESS_ENDPOINT_RULES,
    AgentEndpointSpec,
    in_process_endpoint_problems,
)
from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, raise_all
from asyncrl.api.dataset import (
    IMPORT_PATH_PATTERN,
    TASK_SOURCE_RULES,
    DatasetSpec,
    RewardServiceSpec,
    check_import_path,
    task_source_problems,
)
from asyncrl.api.service import redact_url


class TaskSpec(SpecModel):
    """``spec.task``: the environment (agent task) and how it is sampled."""

    name: str = Field(
        default="chain-calculator",
        pattern=r"^(calculator|chain-calculator|arithmetic|customer-service)$",
        description="Built-in task: calculator (one tool call), chain-calculator (two or more chained "
        "tool calls), arithmetic (single-turn, verifiable answer), customer-service (tool use against a "
        "small order database, a scripted user, reward = the database ends as the user's goal says). "
        "Ignored when environment is set.",
    )
    environment: str | None = Field(
        default=None,
        pattern=IMPORT_PATH_PATTERN,
        description="A turn-level environment by import path, 'pkg.mod:Factory' (docs/tasks.md): Factory(**args) "
        "makes one episode, with reset(sample) -> messages and step(assistant_message) -> observation or final "
        "reward (either may be async def). Imported inside the job (locally: the current Python path and "
        "pythonPath); a factory that fails to import or construct fails the job at start.",
    )
    agent: str | None = Field(
        default=None,
        pattern=AGENT_PATTERN,
        description="An OpenAI-API agent (docs/agents.md): 'pkg.mod:fn', an async function (client, sample) -> "
        "reward or None, called once per episode with an openai.AsyncOpenAI client pointed at the rollout "
        "worker's endpoint (None: score with reward); or 'external': a harness outside the job opens sessions "
        "(POST /v1/sessions) and posts each reward. Excludes environment.",
    )
    endpoint: AgentEndpointSpec = Field(
        default_factory=AgentEndpointSpec,
        description="The rollout workers' OpenAI-compatible endpoint (used when agent is set).",
    )
    args: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of the environment factory (free-form)."
    )
    tool_call_format: Literal["hermes", "json"] = Field(
        default="hermes",
        description="How the assistant writes tool calls: hermes (<tool_call>{\"name\": ..., \"arguments\": {...}}"
        "</tool_call>, Hermes/Qwen/SmolLM2) or json (the whole turn is one JSON call or a list of them).",
    )
    env_timeout_seconds: float = Field(
        default=30.0,
        gt=0.0,
        le=3600.0,
        description="Longest one environment call (reset, step) may take; a slower one aborts its episode "
        "(counted in asyncrl_env_errors_total{reason=\"timeout\"}), the job goes on.",
    )
    max_new_tokens: int = Field(
        default=48, ge=1, le=32768, description="Most tokens one trajectory may hold after the prompt (at most 32768)."
    )
    max_tool_calls: int = Field(
        default=4, ge=0, le=64, description="Most tool calls the environment answers per episode."
    )
    temperature: float = Field(
        default=1.0, gt=0.0, le=10.0, description="Sampling temperature of the rollout engine, in (0, 10]."
    )
    group_size: int = Field(
        default=8, ge=1, le=256, description="Samples per prompt (the GRPO group used for the advantage baseline)."
    )
    dataset: DatasetSpec | None = Field(
        default=None,
        description="Prompts from a JSONL or Parquet file, one row per sample, scored by reward or "
        "rewardService (docs/tasks.md); null = the task's own generated problems.",
    )
    reward: str | None = Field(
        default=None,
        description="Reward function of a dataset job by import path, 'pkg.mod:fn', called as "
        "fn(completion: str, answer, sample: dict) -> float (the final assistant text, the row's answerField, "
        "the whole row); a reward >= 1 counts as a success.",
        pattern=IMPORT_PATH_PATTERN,
    )
    reward_service: RewardServiceSpec | None = Field(
        default=None, description="An HTTP service scoring the completions of a dataset job (instead of reward)."
    )
    python_path: list[str] = Field(
        default_factory=list,
        description="Folders put first on the Python path of the job's processes before reward (or an "
        "environment) is imported; relative ones are taken from the working directory, e.g. [examples/tasks].",
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        *TASK_SOURCE_RULES,
        CelRule("!has(self.agent) || !has(self.environment)", AGENT_WITH_ENVIRONMENT_MESSAGE, ".agent"),
        *IN_PROCESS_ENDPOINT_RULES,
    )

    # before the pattern check, so the error says the rule in words rather than the regular expression
    _reward_is_an_import_path = field_validator("reward", mode="before")(
        lambda v: check_import_path(v, "task.reward")
    )
    _environment_is_an_import_path = field_validator("environment", mode="before")(
        lambda v: check_import_path(v, "task.environment")
    )

    @field_validator("agent", mode="before")
    @classmethod
    def _agent_is_an_import_path(cls, v: object) -> object:
        import re

        if isinstance(v, str) and not re.match(AGENT_PATTERN, v):
            raise ValueError(f"task.agent {v!r}: {AGENT_MESSAGE}")
        return v

    @model_validator(mode="after")
    def _dataset_and_reward_go_together(self) -> "TaskSpec":
        problems = task_source_problems(self.dataset, self.reward, self.reward_service,
                                        self.environment, self.agent)
        if self.agent is not None and self.environment is not None:
            problems.append(("agent", f"{AGENT_WITH_ENVIRONMENT_MESSAGE} (agent is {self.agent!r})"))
        problems += in_process_endpoint_problems(self.agent, self.endpoint)
        raise_all(problems)
        return self

    @property
    def label(self) -> str:
        """What actually runs, for labels and logs: the environment's import path (``name`` is ignored
        then), ``dataset:<path>+<reward import path or service url>`` (the URL without its query or userinfo),
        or the built-in ``name``."""
        if self.environment is not None:
            return self.environment
        if self.agent is not None:
            return f"agent:{self.agent}"
        if self.dataset is not None:
            scorer = self.reward if self.reward is not None else redact_url(getattr(self.reward_service, "url", ""))
            return f"dataset:{self.dataset.path}+{scorer}"
        return self.name
