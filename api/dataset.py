"""``spec.task.dataset`` and ``spec.task.rewardService``: prompts from a file, rewards from a service.

A dataset job is the shortest way to train on one's own prompts: a JSONL or Parquet file whose rows
hold a prompt (a string, or a list of chat messages) and an answer, plus a reward function by import
path (``spec.task.reward: "pkg.mod:fn"``) or an HTTP reward service (``spec.task.rewardService``).
The rows are read and checked at job start (and by ``asyncrl validate`` when the file is readable
where it runs) by ``asyncrl.rollout.envs.dataset``; this module holds only the typed settings.
"""

import re
from enum import StrEnum

from pydantic import Field, field_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule
from asyncrl.api.dataset_limits import (
    CEILING_DECODED_BYTES,
    CEILING_DEPTH,
    CEILING_FILE_BYTES,
    CEILING_ROW_BYTES,
    CEILING_ROWS,
    DEFAULT_MAX_DECODED_BYTES,
    DEFAULT_MAX_DEPTH,
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_ROW_BYTES,
    DEFAULT_MAX_ROWS,
    ReadLimits,
)
from asyncrl.api.service import HeaderFromSecret, duplicate_headers

# "package.module:function" (dotted attribute after the colon allowed: "pkg.mod:Class.method")
IMPORT_PATH_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
IMPORT_PATH_MESSAGE = (
    "an import path is 'package.module:function' (a module on the Python path, a colon, an attribute of it), "
    "e.g. 'my_reward:score'"
)
_IMPORT_PATH = re.compile(IMPORT_PATH_PATTERN)
URL_PATTERN = r"^https?://[^\s/@]+(/\S*)?$"  # no userinfo: credentials go in headersFrom
_URL = re.compile(URL_PATTERN)


class DatasetFormat(StrEnum):
    """How the dataset file is read."""

    AUTO = "auto"  # from the file name: *.jsonl / *.ndjson -> jsonl, *.parquet / *.pq -> parquet
    JSONL = "jsonl"  # one JSON object per line
    PARQUET = "parquet"  # a Parquet table, one row per sample


class DatasetSpec(SpecModel):
    """``spec.task.dataset``: the prompts of the job, one row per sample."""

    path: str = Field(
        min_length=1,
        description="The dataset file: JSONL (one JSON object per line) or Parquet. A relative path is taken "
        "from the working directory (locally: where asyncrl run starts); in a cluster give an absolute path "
        "readable in the rollout pods (the image, or a mounted volume).",
    )
    format: DatasetFormat = Field(
        default=DatasetFormat.AUTO,
        description="auto: from the file name (.jsonl/.ndjson, .parquet/.pq); jsonl; parquet.",
    )
    prompt_field: str = Field(
        default="prompt",
        min_length=1,
        description="Column holding the prompt: a string (one user message) or a list of chat messages "
        "({role, content}).",
    )
    answer_field: str | None = Field(
        default="answer",
        min_length=1,
        description="Column handed to the environment and the reward function as the sample's answer "
        "(any JSON value); null = none (the reward then reads the whole sample).",
    )
    system_prompt: str | None = Field(
        default=None,
        description="A system message put before every prompt that does not start with one.",
    )
    id_field: str | None = Field(
        default=None,
        min_length=1,
        description="Column with a stable row id that decides the held-out split; null = the prompt's "
        "content (rows with the same prompt then always fall on the same side).",
    )
    heldout_fraction: float = Field(
        default=0.1,
        ge=0.0,
        lt=1.0,
        description="Share of rows held out for spec.eval (never trained on), chosen by a keyed hash of each "
        "row's id: the same rows in every run, resume and reordering of the file. 0 = train on every row "
        "(then spec.eval cannot run on this dataset).",
    )
    shuffle: bool = Field(
        default=True,
        description="Visit the training rows in a seeded random order, a new order every epoch; false = file "
        "order.",
    )
    seed: int | None = Field(
        default=None, ge=0, le=2**32 - 1, description="Seed of the shuffle, 0 .. 2^32-1; null = spec.train.seed."
    )
    # The caps of the file (api/dataset_limits.py says why these defaults); each refusal names the file, the
    # line or row, the cap and this field.
    max_row_bytes: int = Field(
        default=DEFAULT_MAX_ROW_BYTES,
        ge=1,
        le=CEILING_ROW_BYTES,
        description="Most bytes of one row: a JSONL line (its UTF-8 text, without the newline) or a Parquet row "
        "decoded (default 1 MiB, at most 256 MiB).",
    )
    max_rows: int = Field(
        default=DEFAULT_MAX_ROWS, ge=1, le=CEILING_ROWS,
        description="Most rows the file may hold (default 1,000,000, at most 1e9).",
    )
    max_file_bytes: int = Field(
        default=DEFAULT_MAX_FILE_BYTES,
        ge=1,
        le=CEILING_FILE_BYTES,
        description="Largest dataset file, in bytes (default 1 GiB, at most 1 TiB); every process that reads it "
        "holds all its rows.",
    )
    max_decoded_bytes: int = Field(
        default=DEFAULT_MAX_DECODED_BYTES,
        ge=1,
        le=CEILING_DECODED_BYTES,
        description="Most bytes a Parquet file's rows may take decoded (dictionaries expanded, pages "
        "decompressed; default 2 GiB, at most 1 TiB), checked on the file's metadata and on the rows read, "
        "before any row becomes a Python value: a small file that decodes to more is refused.",
    )
    max_depth: int = Field(
        default=DEFAULT_MAX_DEPTH,
        ge=1,
        le=CEILING_DEPTH,
        description="Deepest nesting of a row: levels of JSON arrays and objects (or Parquet lists, structs and "
        "maps), the row itself being level 1 (default 64, at most 256).",
    )

    @property
    def limits(self) -> ReadLimits:
        """The caps of one read of :attr:`path`."""
        return ReadLimits(row_bytes=self.max_row_bytes, rows=self.max_rows, file_bytes=self.max_file_bytes,
                          decoded_bytes=self.max_decoded_bytes, depth=self.max_depth)


class RewardServiceSpec(SpecModel):
    """``spec.task.rewardService``: an HTTP service that scores completions (see docs/tasks.md)."""

    url: str = Field(
        description="Endpoint that receives POST {completion, answer, sample} and answers {reward}, e.g. "
        "http://reward.my-namespace.svc:8000/score.",
        json_schema_extra={"pattern": URL_PATTERN},
    )
    timeout_seconds: float = Field(
        default=5.0,
        gt=0.0,
        le=600.0,
        description="Deadline of one call, every attempt and backoff included: to connect, send, and read the "
        "whole answer. No retry starts past it; keep it below task.envTimeoutSeconds (the shorter one applies).",
    )
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Further attempts after a connection error, a timeout or a 5xx answer (never after a 4xx "
        "or a malformed answer); the episode is aborted and counted when all fail.",
    )
    backoff_seconds: float = Field(
        default=0.5,
        ge=0.0,
        le=60.0,
        description="Wait before the first retry; doubled before each next one.",
    )
    max_concurrency: int = Field(
        default=8, ge=1, le=1024, description="Most requests in flight at once from one rollout worker."
    )
    max_response_bytes: int = Field(
        default=4 * 2**20,
        ge=1024,
        le=256 * 2**20,
        description="Largest answer body read, in bytes (default 4 MiB); a longer one is refused unread past the "
        "limit (remote_bad_response).",
    )
    headers_from: list[HeaderFromSecret] = Field(
        default_factory=list,
        max_length=16,
        description="Headers sent with every request, each value from a Secret (e.g. Authorization: Bearer ...), "
        "never written in the job; see docs/security.md. Redirects are never followed.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("headers_from")
    @classmethod
    def _one_value_per_header(cls, v: list[HeaderFromSecret]) -> list[HeaderFromSecret]:
        if twice := duplicate_headers(v):
            raise ValueError(f"header {twice[0]!r} is given twice (HTTP names are case-insensitive); keep one")
        return v

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if "@" in v.split("://", 1)[-1].split("/", 1)[0]:
            raise ValueError("task.rewardService.url holds credentials (user:password@): they would be stored in the "
                             "job and its ConfigMap, readable by every viewer of the namespace; put them in a Secret "
                             "and send them with headersFrom (docs/security.md)")
        if not _URL.match(v):
            raise ValueError(f"task.rewardService.url {v!r} is not an http(s) URL; write e.g. "
                             "'http://reward.my-namespace.svc:8000/score'")
        return v


REWARD_EXCLUSIVE_MESSAGE = (
    "task.reward and task.rewardService are two ways to score the same completion; keep one of them"
)
REWARD_NEEDS_DATASET_MESSAGE = (
    "task.reward and task.rewardService score the rows of task.dataset; add task.dataset (path, promptField, "
    "answerField) or remove the reward"
)
DATASET_NEEDS_SCORER_MESSAGE = (
    "task.dataset needs something that scores a completion: task.reward ('pkg.mod:fn'), task.rewardService "
    "(an HTTP service), task.environment (an environment that reads the rows) or task.agent (an agent that "
    "returns the reward); see docs/tasks.md"
)
REWARD_WITH_ENVIRONMENT_MESSAGE = (
    "task.reward and task.rewardService score the single-turn dataset environment, but task.environment is set "
    "and gives its own reward in step(); remove the reward, or remove the environment"
)

TASK_SOURCE_RULES: tuple[CelRule, ...] = (
    CelRule("!has(self.reward) || !has(self.rewardService)", REWARD_EXCLUSIVE_MESSAGE, ".rewardService"),
    CelRule("(!has(self.reward) && !has(self.rewardService)) || has(self.dataset)", REWARD_NEEDS_DATASET_MESSAGE),
    CelRule("!has(self.dataset) || has(self.reward) || has(self.rewardService) || has(self.environment) "
            "|| has(self.agent)",
            DATASET_NEEDS_SCORER_MESSAGE, ".dataset"),
    CelRule("!has(self.environment) || (!has(self.reward) && !has(self.rewardService))",
            REWARD_WITH_ENVIRONMENT_MESSAGE, ".environment"),
)


def check_import_path(value: object, what: str) -> object:
    """``value`` when it is an import path (or not a string: the type check reports it); else a
    ``ValueError`` with the rule and an example."""
    if isinstance(value, str) and not _IMPORT_PATH.match(value):
        raise ValueError(f"{what} {value!r} is not an import path: {IMPORT_PATH_MESSAGE}")
    return value


def task_source_problems(
    dataset: DatasetSpec | None, reward: str | None, reward_service: RewardServiceSpec | None,
    environment: str | None = None, agent: str | None = None,
) -> list[tuple[str, str]]:
    """The ``(path below spec.task, message)`` of every rule of :data:`TASK_SOURCE_RULES` that fails."""
    problems = []
    if reward is not None and reward_service is not None:
        problems.append(("rewardService", f"{REWARD_EXCLUSIVE_MESSAGE} (reward is {reward!r})"))
    if (reward is not None or reward_service is not None) and dataset is None:
        problems.append(("", REWARD_NEEDS_DATASET_MESSAGE))
    if dataset is not None and reward is None and reward_service is None and environment is None and agent is None:
        problems.append(("dataset", f"{DATASET_NEEDS_SCORER_MESSAGE} (dataset.path is {dataset.path!r})"))
    if environment is not None and (reward is not None or reward_service is not None):
        problems.append(("environment", f"{REWARD_WITH_ENVIRONMENT_MESSAGE} (environment is {environment!r})"))
    return problems
