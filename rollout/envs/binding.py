"""A job's task, bound: where its samples come from and how one episode's environment is made.

Every task takes this one path (``rollout/worker.py`` builds episodes from a :class:`TaskBinding`):

- ``spec.task.environment: "pkg.mod:Factory"``: a user's turn-level environment, ``Factory(**args)``
  per episode; its samples are the dataset's rows (``spec.task.dataset``) or seeded samples;
- ``spec.task.dataset`` with ``reward``/``rewardService``: the single-turn dataset environment
  (``rollout/envs/reward.py``);
- a built-in ``spec.task.name``: the math tasks (``math_tasks.py``) and ``customer-service``.

:func:`bind_task` imports and constructs the factory once, so a job whose environment cannot be
imported or built fails at start (:class:`EnvLoadError`, exit code 2), not in a rollout worker. The
driver never calls it for a user's task: it checks the task in a child process without credentials
(:mod:`asyncrl.rollout.envs.task_check`) and draws its held-out samples from :func:`task_samples`.
"""

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs.interface import SampleSource, SeededSamples, TurnEnvironment
from asyncrl.rollout.envs.runner import last_line

USER_PROMPT_TOKENS = 2048


class EnvLoadError(RuntimeError):
    """The task's environment (or reward) cannot be imported or constructed: a permanent job failure."""

    exit_code = 2


@dataclass(frozen=True)
class AgentTask:
    """``spec.task.agent``, loaded: the agent function (None: ``external``, a harness takes the sessions) and the
    scorer of an agent that returns None (``task.reward``/``rewardService`` over the final assistant text; None:
    such an episode is aborted, ``agent_no_reward``). The rollout worker serves the endpoint these episodes use."""

    fn: Callable[..., Any] | None
    scorer: Callable[[str, dict[str, Any]], float] | None = None
    endpoint: Any = None  # spec.task.endpoint (api/agent.py AgentEndpointSpec)
    hidden_fields: tuple[str, ...] = ()
    """Fields of a sample never handed to an external harness (``POST /v1/sessions``): the dataset's
    ``answerField``, which only the worker's scorer reads."""


@dataclass(frozen=True)
class TaskBinding:
    """What a rollout worker needs of a task.

    ``name``: ``Trajectory.task``; ``new_env()``: a fresh turn-level environment (one per episode);
    ``max_prompt_tokens``: a bound on prompt length when the task knows one (None: unknown, see
    :func:`context_length`); ``demonstrations``: the task has a warm start; ``inline``: a
    built-in environment (pure, microseconds per call) whose steps run on the decode thread, so a
    seed reproduces the same tokens; every other environment runs off the decode loop, under
    ``spec.task.envTimeoutSeconds``.
    """

    name: str
    samples: SampleSource
    new_env: Callable[[], TurnEnvironment]
    tool_call_format: str = "hermes"
    max_prompt_tokens: int | None = None
    demonstrations: bool = False
    inline: bool = False
    agent: AgentTask | None = None  # an OpenAI-API agent's task: new_env is not used, the worker builds its episodes


def _user_factory(task: TaskSpec) -> Callable[[], TurnEnvironment]:
    from asyncrl.rollout.envs.reward import ImportPathError, import_object

    path = str(task.environment)
    try:
        factory = import_object(path, python_path=task.python_path, what="spec.task.environment")
    except ImportPathError as exc:
        raise EnvLoadError(str(exc)) from exc
    if not callable(factory):
        raise EnvLoadError(f"spec.task.environment: {path!r} is a {type(factory).__name__}, not a class or function")
    args = dict(task.args)

    def new_env() -> TurnEnvironment:
        return factory(**args)  # type: ignore[no-any-return]

    try:
        probe = new_env()
    except Exception as exc:
        tb = traceback.extract_tb(exc.__traceback__)
        where = f" ({tb[-1].filename}:{tb[-1].lineno})" if tb else ""
        raise EnvLoadError(f"spec.task.environment: {path}(**{args!r}) raised {last_line(exc)}{where}") from exc
    missing = [m for m in ("reset", "step") if not callable(getattr(probe, m, None))]
    if missing:
        raise EnvLoadError(f"spec.task.environment: {path} makes a {type(probe).__name__} without "
                           f"{' and '.join(missing)}(); see asyncrl.rollout.envs.interface")
    return new_env


def _dataset_parts(task: TaskSpec, workers: int, seed: int) -> tuple[Any, SampleSource]:
    from asyncrl.rollout.envs.dataset import DatasetError, DatasetSamples, load_dataset

    assert task.dataset is not None
    try:
        data = load_dataset(task.dataset)
    except (DatasetError, OSError) as exc:
        raise EnvLoadError(str(exc)) from exc
    shuffle_seed = getattr(task.dataset, "seed", None)
    return data, DatasetSamples(data, workers, seed if shuffle_seed is None else shuffle_seed)


def task_samples(task: TaskSpec, *, workers: int = 1, seed: int = 0) -> SampleSource:
    """The samples of ``spec.task`` (those of :func:`bind_task`), without importing or constructing any of
    the user's code: the driver draws its held-out problems (``spec.eval``, the start-up probe) from these,
    and only the rollout workers and the credential-free check of :mod:`.task_check` run the user's code."""
    if task.dataset is not None:
        return _dataset_parts(task, workers, seed)[1]
    if task.environment is not None or task.agent is not None:
        return SeededSamples()
    return bind_task(task, workers=workers, seed=seed).samples  # a built-in task: asyncrl's own code


def _scorer(task: TaskSpec, data: Any) -> tuple[Callable[..., float], str]:
    from asyncrl.rollout.envs.reward import ImportPathError, load_reward

    try:
        if task.reward is not None:
            return load_reward(task.reward, python_path=task.python_path), "reward"
        from asyncrl.rollout.envs.remote import RemoteReward

        assert task.reward_service is not None  # the spec requires reward or rewardService
        return RemoteReward(task.reward_service, budget_s=task.env_timeout_seconds), "rewardService"
    except (ImportPathError, ValueError) as exc:  # ValueError: a headersFrom variable is missing
        raise EnvLoadError(str(exc)) from exc


def _bind_agent(task: TaskSpec, workers: int, seed: int) -> TaskBinding:
    import inspect

    from asyncrl.api.agent import EXTERNAL
    from asyncrl.rollout.envs.reward import ImportPathError, import_object

    path = str(task.agent)
    fn = None
    if path != EXTERNAL:
        try:
            fn = import_object(path, python_path=task.python_path, what="spec.task.agent")
        except ImportPathError as exc:
            raise EnvLoadError(str(exc)) from exc
        if not inspect.iscoroutinefunction(fn):
            raise EnvLoadError(f"spec.task.agent: {path} is a {type(fn).__name__}, not an async function; write it as "
                               "'async def fn(client, sample) -> float | None' (docs/agents.md)")
    samples: SampleSource = SeededSamples()
    scorer = None
    if task.dataset is not None:
        data, samples = _dataset_parts(task, workers, seed)
        if task.reward is not None or task.reward_service is not None:
            score, _ = _scorer(task, data)
            scorer = (lambda s: lambda text, sample: s(text, data.answer(sample), dict(sample)))(score)

    def no_env() -> TurnEnvironment:
        raise RuntimeError("an agent task's episodes are built by the rollout worker (rollout/agent/)")

    answer = task.dataset.answer_field if task.dataset is not None else None
    return TaskBinding(task.label, samples, no_env, task.tool_call_format,
                       agent=AgentTask(fn, scorer, task.endpoint, hidden_fields=(answer,) if answer else ()))


def bind_task(task: TaskSpec, *, workers: int = 1, seed: int = 0) -> TaskBinding:
    """The :class:`TaskBinding` of ``spec.task`` (``workers``: ``spec.rollout.replicas``, ``seed``:
    ``spec.train.seed``). Raises :class:`EnvLoadError` when user code cannot be loaded."""
    fmt = task.tool_call_format
    if task.agent is not None:
        return _bind_agent(task, workers, seed)
    if task.environment is not None:
        new_env = _user_factory(task)
        samples: SampleSource = SeededSamples()
        if task.dataset is not None:
            samples = _dataset_parts(task, workers, seed)[1]
        return TaskBinding(task.environment, samples, new_env, fmt)
    if task.dataset is not None:
        from asyncrl.rollout.envs.reward import DatasetEnv

        data, samples = _dataset_parts(task, workers, seed)
        scorer, label = _scorer(task, data)
        return TaskBinding("dataset", samples, lambda: DatasetEnv(data, scorer, label), fmt)
    if task.name == "customer-service":
        from asyncrl.rollout.envs.customer_service import (
            CS_MAX_PROMPT_TOKENS,
            CustomerService,
            ScenarioSamples,
        )

        calls, args = task.max_tool_calls, dict(task.args)  # args: the controls' knobs (CustomerService's)
        CustomerService(calls, **args)  # bad args fail the job here, at start
        return TaskBinding(task.name, ScenarioSamples(), lambda: CustomerService(calls, **args), fmt,
                           CS_MAX_PROMPT_TOKENS, True, True)
    from asyncrl.rollout.envs.math_tasks import MathSamples, MathTurn
    from asyncrl.rollout.envs.registry import get_task

    math = get_task(task.name)
    calls = task.max_tool_calls if math.uses_tool else 0
    return TaskBinding(math.name, MathSamples(math.problem_fn), lambda: MathTurn(math.name, calls), fmt,
                       None, True, True)


def context_length(task: TaskSpec, tokenizer: Any) -> int:
    """Longest trajectory of ``spec.task`` (prompt bound + ``maxNewTokens``): the context the actor, the
    scorers and the rollout workers build the model for. A user's environment or dataset has no known
    prompt bound: 2048 tokens (rotary positions cost nothing until used)."""
    from asyncrl.rollout.envs.registry import TASKS, max_sequence_length

    if task.environment is None and task.dataset is None and task.agent is None:
        if task.name in TASKS:
            return max_sequence_length(task.name, task.max_new_tokens, tokenizer)
        if task.name == "customer-service":
            from asyncrl.rollout.envs.customer_service import CS_MAX_PROMPT_TOKENS

            return CS_MAX_PROMPT_TOKENS + task.max_new_tokens
    return USER_PROMPT_TOKENS + task.max_new_tokens


def task_tokenizer(model: Any, task: TaskSpec) -> Any:
    """The job's tokenizer (the actor and every rollout worker resolve the same one): the model's own
    (``tokenizer_for``), or for a model without one the math alphabet for the math tasks and the text
    alphabet (``envs/charset.py``) for every other task, except customer-service: the task's own byte-level
    BPE with a ChatML template (``envs/cs_tokenizer.py``), so that its system prompt and tools are in the prompt."""
    from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
    from asyncrl.rollout.envs.registry import TASKS
    from asyncrl.rollout.tokenizer import TOKENIZER, tokenizer_for

    tok = tokenizer_for(model)
    if tok is TOKENIZER and (task.environment is not None or task.dataset is not None or task.agent is not None
                            or task.name not in TASKS):
        if task.environment is None and task.dataset is None and task.agent is None and task.name == "customer-service":
            from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer

            return cs_tokenizer()  # one per process, the same ids everywhere
        return TEXT_TOKENIZER
    return tok


def has_demonstrations(task: TaskSpec) -> bool:
    """True when ``spec.task`` has a demonstration warm start (the built-in tasks); a user's environment
    or a dataset starts RL from the model as it is (``train.warmStartSteps`` is then not used)."""
    return task.environment is None and task.dataset is None and task.agent is None
