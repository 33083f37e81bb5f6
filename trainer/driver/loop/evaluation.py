"""Evaluation of the current policy between steps (``spec.eval``).

When is it due: at every version divisible by ``eval.everySteps`` (version 0 included: once before
training), and at the last version of the run; never twice for one version (a resumed run skips
the versions its log already evaluated). It runs inside the loop right after the step that made
the version has synced its weights and written its record, so no version can advance meanwhile.

What it does, in order:

1. *pause*: no new training generate call is admitted (the loop's ``paused``); nothing is reserved
   in the staleness buffer, so the evaluation never takes admission capacity;
2. *drain*: a worker whose training call is still in flight finishes it (its groups go to the
   buffer as usual); an idle worker starts its evaluation share at once. The transformers and vLLM
   engines run one ``generate`` at a time, and letting in-flight calls finish keeps the training
   stream exactly what it would be (no extra interruption, no partial groups). With
   ``interruptSync`` nothing is in flight here (the sync interrupted it) and episodes suspended in
   the workers stay suspended through the evaluation;
3. *evaluate*: every worker answers its contiguous share of the fixed held-out problems
   (``RolloutWorker.evaluate``) under the current version; every sampled token's version stamp is
   checked to be that version;
4. *resume*: admission opens again.

Time: the wall time of 1-4 is ``eval_s`` (``asyncrl_eval_seconds_total``); the drain part of it is
``eval_drain_s``. Rollout workers waiting during the pause are not counted as rollout idle, and the
loop's trainer and rollout-worker seconds (the idle ratios' denominators) leave the evaluation out.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asyncrl.api.evaluation import EvalMode
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.envs.binding import task_samples
from asyncrl.rollout.envs.cs_behaviour import tally
from asyncrl.rollout.envs.interface import Sample
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.driver.run.metrics_log import EvalLine, Line, parse_lines

if TYPE_CHECKING:
    from ray import ObjectRef

    from asyncrl.trainer.driver.loop.view import LoopView

# The engines sample (temperature > 0 is their contract): greedy is sampling at this temperature. A
# logit gap of 0.01 then makes the runner-up exp(-10) ~ 5e-5 as likely, so only exact ties (possible in
# bfloat16 logits) are broken, by the call's seeded sampler.
GREEDY_TEMPERATURE = 1e-3


def eval_temperature(spec: AsyncRLJobSpec) -> float:
    """The sampling temperature of ``spec.eval.mode``."""
    return GREEDY_TEMPERATURE if spec.eval.mode is EvalMode.GREEDY else float(spec.task.temperature)


def shares(n_problems: int, n_workers: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, stop)`` index ranges of the problems, one per worker, sizes differing by <= 1."""
    base, extra = divmod(n_problems, n_workers)
    out, start = [], 0
    for i in range(n_workers):
        stop = start + base + (i < extra)
        out.append((start, stop))
        start = stop
    return out


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: of ``version``, over ``prompts`` held-out problems (one sample each)."""

    version: int
    prompts: int
    succeeded: int
    reward_sum: float
    sampled_tokens: int
    seconds: float
    drain_seconds: float
    behaviour: Mapping[str, int] = field(default_factory=dict)  # customer-service: episodes per flag (cs_behaviour)

    @property
    def success(self) -> float:
        return self.succeeded / max(1, self.prompts)

    @property
    def reward(self) -> float:
        return self.reward_sum / max(1, self.prompts)

    def record(self, wall_s: float) -> dict[str, Any]:
        """The ``metrics.jsonl`` line: ``step`` is the evaluated version (the step record that made it has
        the same ``step``); no ``version`` key, so step-record readers skip it (read back: ``metrics_log.EvalLine``)."""
        return {
            "step": self.version, "wall_s": round(wall_s, 3), "eval_version": self.version,
            "eval_success": self.success, "eval_reward": self.reward, "eval_prompts": self.prompts,
            "eval_sampled_tokens": self.sampled_tokens, "eval_s": round(self.seconds, 4),
            "eval_drain_s": round(self.drain_seconds, 4),
            **({"eval_behaviour": dict(self.behaviour)} if self.behaviour else {}),
        }


def evaluated_versions(records: Sequence[Line]) -> set[int]:
    """The versions a run's ``metrics.jsonl`` lines already evaluated (a resumed run skips them)."""
    return {line.version for line in parse_lines(records) if isinstance(line, EvalLine)}


def check_versions(trajs: list[Trajectory], version: int) -> None:
    """Every sampled token of an evaluation carries ``version`` (the evaluation sees exactly one version)."""
    bad = [(t.traj_id, sorted(set(t.sampled_versions))) for t in trajs if set(t.sampled_versions) - {version}]
    if bad:
        raise RuntimeError(f"evaluation of version {version}: {len(bad)} trajectories hold tokens of other "
                           f"versions, e.g. {bad[:3]}; the evaluation must see exactly one version")


class Evaluator:
    """``spec.eval`` for one run: the fixed problems, when an evaluation is due, and how it runs."""

    def __init__(self, spec: AsyncRLJobSpec) -> None:
        self.every = int(spec.eval.every_steps)
        self.problems: list[Sample] = (  # the task's held-out samples (disjoint from training; no user code runs)
            task_samples(spec.task, workers=spec.rollout.replicas, seed=spec.train.seed).heldout(
                spec.eval.prompts, spec.eval.seed) if self.every else []
        )
        self.temperature = eval_temperature(spec)
        self.seed = int(spec.eval.seed)
        self.seconds = 0.0  # wall time of every evaluation of this session

    def share_seed(self, first: int) -> int:
        """The sampler seed of the share starting at problem ``first``: the same at every evaluation."""
        return self.seed * 1_000_003 + first

    def due(self, version: int, last_version: int, evaluated: set[int]) -> bool:
        """An evaluation of ``version`` is due (``last_version``: the run's final version)."""
        if not self.every or version in evaluated:
            return False
        return version % self.every == 0 or version == last_version

    def run(self, loop: "LoopView") -> EvalResult:
        """Pause admission, drain, evaluate on every worker, resume (see the module docstring)."""
        import ray

        version, n = loop.version, len(loop.hosts.rollout)
        t0 = time.monotonic()
        for seconds in loop.workers.hold_idle(t0):  # idle until now; from here the wait is the evaluation's
            loop.m.rollout_idle.inc(seconds)
        todo = {i: r for i, r in enumerate(shares(len(self.problems), n)) if r[1] > r[0]}
        calls: dict[ObjectRef, int] = {}  # evaluate ref -> worker index
        trajs: list[Trajectory] = []
        drained = t0
        loop.paused = True
        try:
            while todo or calls:
                busy = loop.workers.generating()
                for i in [i for i in todo if i not in busy]:
                    start, stop = todo.pop(i)
                    ref = loop.hosts.rollout[i].evaluate.remote(
                        self.problems[start:stop], version, self.temperature, self.share_seed(start), start)
                    calls[ref] = i
                    drained = time.monotonic()  # the last share started: the drain is over
                ref = loop.wait_any(*calls)
                if ref is False:
                    raise RuntimeError(f"evaluation of version {version}: nothing in flight, shares {todo} waiting")
                if ref is None:
                    continue  # a training call or a stage call came back (collected, not re-admitted)
                i = calls.pop(ref)
                try:
                    trajs.extend(ray.get(ref))
                except ray.exceptions.RayActorError as exc:  # replaced; it holds this version's weights
                    loop.replace_rollout(i, exc)
                    loop.workers.hold(i)
                    todo[i] = shares(len(self.problems), n)[i]
        finally:
            loop.paused = False
            loop.workers.end_pause(time.monotonic())  # the pause is not rollout idle time
        check_versions(trajs, version)
        if len(trajs) != len(self.problems):
            raise RuntimeError(f"evaluation of version {version}: {len(trajs)} trajectories for "
                               f"{len(self.problems)} problems")
        seconds = time.monotonic() - t0
        self.seconds += seconds
        flags = tally(t.info.get("behaviour") or {} for t in trajs)  # what the policy did (customer-service only)
        return EvalResult(version, len(trajs), sum(t.success for t in trajs), sum(t.reward for t in trajs),
                          sum(sum(t.loss_mask) for t in trajs), seconds, drained - t0,
                          flags if flags["episodes"] else {})
