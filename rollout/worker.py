"""A rollout worker: draws prompts of the task, samples GRPO groups with its engine, counts.

Pure Python (no Ray): the driver wraps it in a threaded Ray actor, so ``update_weights`` and
``interrupt`` may arrive from another thread while ``generate`` runs. Reading order:
construction (spec pieces -> arch -> engine) -> ``generate`` -> weight sync / interrupt -> stats.

Interrupted episodes (``interrupt()`` during ``generate``) stay *suspended* in the worker with
their environment state; the next ``generate`` resumes them first, under whatever version is
loaded by then, so a GRPO group may complete across two ``generate`` calls (group members share
``group_id``; the trainer groups by it). ``abort_suspended()`` drops them for good (counted).
"""

import random
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import LlamaArch, resolve_arch
from asyncrl.api.pods import RolloutSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.engine import RolloutEngine, RolloutError
from asyncrl.rollout.engine_registry import make_engine
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.binding import TaskBinding, bind_task, context_length, task_tokenizer
from asyncrl.rollout.envs.interface import Sample
from asyncrl.rollout.envs.math_tasks import Problem, problem_sample
from asyncrl.rollout.envs.runner import ENV_ERROR_REASONS, EnvFault, last_line, shared_runner
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.tokenizer import Tokenizer
from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus

if TYPE_CHECKING:
    from asyncrl.rollout.agent.host import AgentHost


@dataclass(frozen=True)
class RolloutStats:
    """A snapshot of a worker's monotonic counters (export as ``*_total`` / ``*_seconds``)."""

    worker_index: int
    version: int
    tokens_sampled: int  # agent tokens (loss_mask True) of every returned trajectory
    tokens_forced: int  # environment tokens of every returned trajectory
    trajectories_finished: int
    trajectories_truncated: int
    trajectories_partial: int  # returned trajectories whose sampled tokens span > 1 version
    trajectories_interrupted: int  # snapshots handed out by interrupt()
    trajectories_aborted: int  # dropped for good (abort_suspended, or lost to an error)
    trajectories_suspended: int  # in flight between generate calls now (a gauge)
    groups_started: int
    weight_updates: int
    busy_seconds: float  # inside generate()
    idle_seconds: float  # between generate() calls (evaluate() included)
    eval_trajectories: int = 0  # held-out evaluation samples (evaluate()), never trained on
    eval_seconds: float = 0.0  # inside evaluate()
    env_errors: int = 0  # episodes user code aborted (exception, timeout, NaN reward, garbage messages)


def _rng(*parts: int) -> random.Random:
    # Tuples of ints hash deterministically (no PYTHONHASHSEED dependence).
    return random.Random(hash(parts))


class RolloutWorker:
    """Generates GRPO groups of one task with one engine.

    Args:
        task: ``spec.task`` (name, maxNewTokens, maxToolCalls, temperature, groupSize).
        model: ``spec.model`` (architecture and ``rolloutDtype``).
        async_: ``spec.async`` (``partialRollout``).
        worker_index: this worker's index among the job's rollout workers (decorrelates prompts).
        seed: the job seed (``spec.train.seed``).
        rollout: ``spec.rollout`` (``engine``, ``engineArgs``); default: the transformers engine.
        engine: a ready engine instead (tests, custom backends). Either way, load weights before
            the first ``generate``.
        tokenizer: the model's tokenizer; default ``task_tokenizer(model, task)`` (the actor uses the same).
        workers: the job's rollout workers (``spec.rollout.replicas``: a dataset spreads its rows over them).
        capture_routes: the engine records MoE expert routes per token (``correction.routingReplay: rollout``).

    Every task is a :class:`~asyncrl.rollout.envs.binding.TaskBinding` (built-in or by import path):
    each episode is its turn-level environment behind a :class:`~asyncrl.rollout.envs.adapter.TurnAdapter`.
    An episode whose environment fails (``EnvFault``) comes back ABORTED with ``info["env_error"]``;
    the other episodes and the job go on.
    """

    def __init__(
        self,
        task: TaskSpec,
        model: ModelSpec,
        async_: AsyncSpec,
        *,
        worker_index: int = 0,
        seed: int = 0,
        rollout: RolloutSpec | None = None,
        engine: RolloutEngine | None = None,
        tokenizer: Tokenizer | None = None,
        workers: int = 1,
        capture_routes: bool = False,
    ) -> None:
        self.task_spec = task
        self.binding: TaskBinding = bind_task(task, workers=workers, seed=seed)
        self.runner = None if self.binding.inline else shared_runner(task.env_timeout_seconds)
        self.partial_rollout = async_.partial_rollout
        self.worker_index = worker_index
        self.seed = seed
        self.tokenizer: Tokenizer = task_tokenizer(model, task) if tokenizer is None else tokenizer
        self.arch: LlamaArch = resolve_arch(
            model, self.tokenizer.vocab_size, context_length(task, self.tokenizer)
        )
        if engine is None:
            rollout = rollout or RolloutSpec()
            engine = make_engine(
                rollout.engine,
                self.arch,
                dtype=model.rollout_dtype,
                seed=_rng(seed, worker_index, 1).randrange(2**62),
                pad_id=self.tokenizer.pad_id,
                engine_args=rollout.engine_args,
                capture_routes=capture_routes,
            )
        self.engine = engine
        self.agent: AgentHost | None = None
        if self.binding.agent is not None:
            from asyncrl.rollout.agent import host

            self.agent = host.AgentHost.start(self.binding.agent, model_name=model.preset or "asyncrl-policy",
                                         worker_index=worker_index, timeout_s=task.env_timeout_seconds,
                                         temperature=task.temperature, agent_path=str(task.agent),
                                         python_path=task.python_path, context=self.arch.max_sequence_length)
        self._suspended: list[Episode] = []
        self._failed: list[Trajectory] = []  # episodes whose environment failed at reset (returned next)
        self._env_errors = dict.fromkeys(ENV_ERROR_REASONS, 0)
        self._cursor = 0  # index of the next group over the whole run: decides its prompts
        self._groups = 0  # groups this worker started (a counter of this process)
        self._lock = threading.Lock()
        self._c = dict.fromkeys(
            (
                "tokens_sampled",
                "tokens_forced",
                "finished",
                "truncated",
                "partial",
                "interrupted",
                "aborted",
                "updates",
                "eval_trajectories",
            ),
            0,
        )
        self._eval_seconds = 0.0  # inside evaluate() (not busy: no training trajectory came of it)
        self._busy = 0.0
        self._idle = 0.0
        self._last_end = time.perf_counter()
        self._busy_since: float | None = None

    # ----------------------------------------------------------------------------- weights
    @property
    def version(self) -> int:
        return self.engine.version

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load HF-named weights now (worker idle)."""
        self.engine.load_weights(state_dict, version)
        with self._lock:
            self._c["updates"] += 1

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Thread-safe: applied at the next token boundary (partialRollout) or after the batch."""
        self.engine.update_weights(state_dict, version)
        with self._lock:
            self._c["updates"] += 1

    def release(self) -> None:
        self.engine.release()

    def acquire(self) -> None:
        self.engine.acquire()

    # ----------------------------------------------------------------------------- prompts
    @property
    def prompt_cursor(self) -> int:
        """Groups started so far over the run (restored ones included): group ``k`` draws its problem
        from ``(seed, worker_index, k)``, so the cursor decides the next prompts. Checkpoint it."""
        return self._cursor

    def set_prompt_cursor(self, n: int) -> None:
        """Continue at group ``n`` (a resumed run: no prompt is replayed). Only between ``generate`` calls
        with nothing suspended, since suspended episodes belong to groups before the cursor."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"RolloutWorker.set_prompt_cursor: n must be an int >= 0, got {n!r}")
        if self._suspended:
            raise RuntimeError(
                f"RolloutWorker.set_prompt_cursor: {len(self._suspended)} episodes are suspended; "
                "call abort_suspended() first (or set the cursor before the first generate)"
            )
        self._cursor = n

    # ----------------------------------------------------------------------------- generation
    def _new_group(self) -> list[Episode]:
        k = self._cursor
        self._cursor += 1
        self._groups += 1
        gid = f"w{self.worker_index}-g{k}"
        rng = _rng(self.seed, self.worker_index, 0, k)
        sample = self.binding.samples.train(self.worker_index, k, rng)  # every member gets the same sample
        out = [self._start(f"{gid}-s{j}", gid, sample) for j in range(self.task_spec.group_size)]
        return [e for e in out if e is not None]

    def _start(self, tid: str, gid: str, sample: Sample) -> Episode | None:
        """A new episode of ``sample``; None when its environment failed to start (kept in ``_failed``)."""
        try:
            if self.agent is not None:  # starts once its first request is there (_agent_ready)
                self.agent.open(tid, gid, dict(sample), self.tokenizer, self.runner, self.binding.tool_call_format)
                return None
            try:
                env = self.binding.new_env()
            except Exception as exc:
                raise EnvFault("exception", f"{self.binding.name}: the factory raised {last_line(exc)}") from exc
            adapter = TurnAdapter(self.binding.name, env, dict(sample), self.tokenizer, runner=self.runner,
                                  tool_call_format=self.binding.tool_call_format)
            return Episode.start(tid, gid, adapter, random.Random(0))  # the sample decides, not the rng
        except EnvFault as fault:
            self._start_failed(tid, gid, fault)
            return None

    def _agent_generate(self, episodes: list[Episode]) -> list[Trajectory]:
        """``generate`` for agent sessions, in rounds: sessions start as their first requests arrive, a branch's next
        episode joins the next round, until every session this call opened has ended or an interrupt (or a hold)
        stopped the engine. ``episodes`` is left holding the unfinished ones (they stay suspended)."""
        assert self.agent is not None
        out: list[Trajectory] = []
        live = list(episodes)
        live += self._agent_ready(block=not live, prefix="w")  # training sessions only (evaluate() takes its own)
        while True:
            self.engine.generate(live, max_new_tokens=self.task_spec.max_new_tokens,
                                 temperature=self.task_spec.temperature, partial_rollout=self.partial_rollout)
            interrupted = any(not e.done for e in live)  # the engine returns with episodes in flight only then
            finished, branches = self.agent.settle([e for e in live if e.done])
            out += finished
            live = [e for e in live if not e.done] + branches
            if interrupted or getattr(self.engine, "held", False) or not (live or self.agent.pending_with("w")):
                break
            live += self._agent_ready(block=not live, prefix="w")
        episodes[:] = live
        return out

    def _agent_ready(self, *, block: bool, prefix: str = "") -> list[Episode]:
        """Episodes of agent sessions whose first request arrived; failed starts go to ``_failed`` (counted)."""
        assert self.agent is not None
        started, failed = self.agent.take_ready(block=block, prefix=prefix)
        for tid, gid, fault in failed:
            self._start_failed(tid, gid, fault)
        return started

    def _start_failed(self, tid: str, gid: str, fault: EnvFault) -> None:
        with self._lock:
            self._env_errors[fault.reason] += 1
        self._failed.append(Trajectory(
            traj_id=tid, group_id=gid, task=self.binding.name, tokens=[], prompt_len=0, loss_mask=[],
            versions=[], logp_mu=[], turn_ids=[], status=TrajectoryStatus.ABORTED,
            info={"env_error": fault.reason, "end_reason": str(fault)},
        ))

    def generate(self, n_groups: int) -> list[Trajectory]:
        """Resume suspended episodes, then sample ``n_groups`` new groups of ``task.groupSize``.

        Returns the trajectories that ended (FINISHED or TRUNCATED, or ABORTED by a failing
        environment: ``info["env_error"]``): ``n_groups * groupSize`` plus resumed ones, minus any
        interrupted (kept suspended for the next call).
        """
        if n_groups < 0:
            raise ValueError(f"RolloutWorker.generate: n_groups must be >= 0, got {n_groups}")
        start = time.perf_counter()
        with self._lock:
            self._idle += start - self._last_end
            self._busy_since = start
        episodes, self._suspended = self._suspended, []
        agent_done: list[Trajectory] = []
        try:
            for _ in range(n_groups):
                episodes.extend(self._new_group())
            if self.agent is not None:
                agent_done = self._agent_generate(episodes)
            else:
                self.engine.generate(
                    episodes,
                    max_new_tokens=self.task_spec.max_new_tokens,
                    temperature=self.task_spec.temperature,
                    partial_rollout=self.partial_rollout,
                )
        except RolloutError:
            with self._lock:
                self._c["aborted"] += len(episodes)
            raise
        except Exception as exc:
            with self._lock:
                self._c["aborted"] += len(episodes)
            raise RolloutError(
                f"rollout worker {self.worker_index} failed: {exc!r}",
                task=self.binding.name,
                traj_ids=[e.traj_id for e in episodes],
            ) from exc
        finally:
            end = time.perf_counter()
            with self._lock:
                self._busy += end - start
                self._last_end = end
                self._busy_since = None
        self._suspended = [e for e in episodes if not e.done]
        done = agent_done if self.agent is not None else [e.to_trajectory() for e in episodes if e.done]
        failed, self._failed = self._failed, []
        with self._lock:
            for e in episodes:
                if e.done and e.env_error:
                    self._env_errors[e.env_error] += 1
            for t in agent_done:  # an agent session's episodes left ``episodes`` as they ended
                if t.status is TrajectoryStatus.ABORTED and t.info.get("env_error") in self._env_errors:
                    self._env_errors[t.info["env_error"]] += 1
            self._c["aborted"] += len(failed) + sum(t.status is TrajectoryStatus.ABORTED for t in done)
            for t in done:
                if t.status is TrajectoryStatus.ABORTED:
                    continue
                n_sampled = sum(t.loss_mask)
                self._c["tokens_sampled"] += n_sampled
                self._c["tokens_forced"] += len(t.tokens) - t.prompt_len - n_sampled
                self._c["truncated" if t.status is TrajectoryStatus.TRUNCATED else "finished"] += 1
                self._c["partial"] += t.is_partial
        return failed + done

    def evaluate(self, problems: Sequence[Sample | Problem], *, version: int, temperature: float, seed: int,
                 first: int = 0) -> list[Trajectory]:
        """One sample of each of ``problems`` (held-out evaluation samples, ``samples.heldout``; a math
        :class:`Problem` is taken as its sample) under the loaded ``version``. An evaluation episode
        whose environment fails comes back ABORTED (not solved).

        Nothing of it touches training: no prompt cursor advances, no episode is suspended or
        resumed (suspended training episodes stay as they are), the training counters and the
        engine's own sampler are left alone (``seed`` seeds a sampler of this call: the same noise
        at every evaluation). Call it between ``generate`` calls; a weight update during it is an
        error (its trajectories must carry ``version`` only). Trajectory ids are
        ``eval-v<version>-p<first + k>``.
        """
        if self.version != version:
            raise RuntimeError(
                f"RolloutWorker.evaluate: worker {self.worker_index} holds version {self.version}, "
                f"the evaluation is of version {version}"
            )
        t0 = time.perf_counter()
        started: list[Episode | None] = []
        for k, problem in enumerate(problems):
            sample = problem_sample(problem) if isinstance(problem, Problem) else problem
            tid = f"eval-v{version}-p{first + k}"
            started.append(self._start(tid, tid, sample))
        failed = {t.traj_id: t for t in self._failed}
        self._failed = [t for t in self._failed if not t.traj_id.startswith("eval-")]
        episodes = [e for e in started if e is not None]
        if self.agent is None:
            self.engine.generate(episodes, max_new_tokens=self.task_spec.max_new_tokens, temperature=temperature,
                                 partial_rollout=False, seed=seed)
        else:  # sessions start as their first requests arrive: generate in rounds until every one has ended
            while self.agent.pending_with("eval-") or not all(e.done for e in episodes):
                ready = self._agent_ready(block=all(e.done for e in episodes), prefix="eval-")
                episodes.extend(ready)
                self.engine.generate([e for e in episodes if not e.done], max_new_tokens=self.task_spec.max_new_tokens,
                                     temperature=temperature, partial_rollout=False, seed=seed)
            self.agent.close_evaluation(episodes)
            by_id = {e.traj_id: e for e in episodes}
            failed |= {t.traj_id: t for t in self._failed if t.traj_id.startswith("eval-")}
            self._failed = [t for t in self._failed if not t.traj_id.startswith("eval-")]
            started = [by_id.get(f"eval-v{version}-p{first + k}") for k in range(len(problems))]
        out = [e.to_trajectory() if e is not None else failed[f"eval-v{version}-p{first + k}"]
               for k, e in enumerate(started)]
        undone = [e.traj_id for e in episodes if not e.done]
        if undone:
            raise RuntimeError(f"RolloutWorker.evaluate: {len(undone)} evaluation episodes were interrupted "
                               f"({', '.join(undone[:4])}); nothing may interrupt an evaluation")
        with self._lock:
            self._c["eval_trajectories"] += len(out)
            self._eval_seconds += time.perf_counter() - t0
        return out

    def interrupt(self, timeout_s: float = 30.0, *, hold: bool = False) -> list[Trajectory]:
        """Stop a running ``generate`` at a token boundary; snapshots (INTERRUPTED) of what was in flight.

        The episodes themselves stay suspended in this worker and resume on the next ``generate``.
        ``hold``: sample nothing more until :meth:`resume` (a ``generate`` arriving meanwhile returns at once:
        its episodes, new groups included, stay suspended here).
        """
        snaps = self.engine.interrupt(timeout_s, hold=hold)
        with self._lock:
            self._c["interrupted"] += len(snaps)
        return snaps

    def resume(self) -> None:
        """End a hold set by ``interrupt(hold=True)``."""
        self.engine.resume()

    def abort_suspended(self) -> list[Trajectory]:
        """Drop the suspended episodes for good; returns them with status ABORTED (counted)."""
        out = [e.to_trajectory(TrajectoryStatus.ABORTED) for e in self._suspended]
        if self.agent is not None:
            out = self.agent.abort(self._suspended, out)
        self._suspended = []
        with self._lock:
            self._c["aborted"] += len(out)
        return out

    @property
    def suspended(self) -> int:
        return len(self._suspended) + (self.agent.pending if self.agent is not None else 0)

    def suspended_episodes(self) -> list[Episode]:
        """The suspended episodes themselves (interrupt-sync scores their prefixes in place); only
        between ``generate`` calls, e.g. while held after ``interrupt(hold=True)``."""
        if self._busy_since is not None:
            raise RuntimeError("suspended_episodes: a generate() is running; interrupt it and let it return first")
        return list(self._suspended)

    def stats(self) -> RolloutStats:
        with self._lock:
            c = dict(self._c)
            now = time.perf_counter()
            busy = self._busy + (now - self._busy_since if self._busy_since is not None else 0.0)
            idle = self._idle + (now - self._last_end if self._busy_since is None else 0.0)
            return RolloutStats(
                worker_index=self.worker_index,
                version=self.version,
                tokens_sampled=c["tokens_sampled"],
                tokens_forced=c["tokens_forced"],
                trajectories_finished=c["finished"],
                trajectories_truncated=c["truncated"],
                trajectories_partial=c["partial"],
                trajectories_interrupted=c["interrupted"],
                trajectories_aborted=c["aborted"],
                trajectories_suspended=len(self._suspended),
                groups_started=self._groups,
                weight_updates=c["updates"],
                busy_seconds=busy,
                idle_seconds=idle,
                eval_trajectories=c["eval_trajectories"],
                eval_seconds=self._eval_seconds,
                env_errors=sum(self._env_errors.values()),
            )

    @property
    def endpoint_url(self) -> str | None:
        """The base URL of this worker's OpenAI-compatible endpoint (``.../v1``), None without ``task.agent``."""
        return None if self.agent is None else self.agent.endpoint.base_url

    def agent_counters(self) -> dict[str, int]:
        """The endpoint's counters (``asyncrl_agent_*_total``); {} without ``task.agent``."""
        return {} if self.agent is None else self.agent.endpoint.snapshot()

    def close(self) -> None:
        """Stop the endpoint and the agent loop (the worker's process is ending)."""
        if self.agent is not None:
            self.agent.close()

    def env_errors(self) -> dict[str, int]:
        """Episodes aborted by their environment so far, by reason (``asyncrl_env_errors_total``)."""
        with self._lock:
            return dict(self._env_errors)
