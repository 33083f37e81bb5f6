"""The job driver: one asynchronous GRPO run on Ray, read top to bottom.

    setup    run directory, metrics endpoint, local Ray, rollout workers, actor
    warm     supervised warm start (cached in the run directory), or resume from a checkpoint
    loop     admit groups (staleness capacity) -> collect -> batch -> actor step -> weight sync
             [-> evaluation of the new version on held-out prompts, when spec.eval makes it due]
    cleanup  summary.json, report.png, Ray shutdown -- on every exit path, Ctrl-C included

Data flow (docs/architecture.md, the path of one token): rollout workers (threaded Ray actors, so that ``update_weights``
reaches a worker in the middle of ``generate``) return versioned trajectories; the
:class:`StalenessBuffer` admits and releases whole GRPO groups so that no trained token is more
than ``async.maxStaleness`` versions old; the actor (a Ray actor: megatron keeps process-global
parallel state, and a separate process keeps the driver responsive while it trains) computes the
reference log-probs, the correction loss and the optimizer step; its new weights go once into
the object store (numpy arrays) and every worker loads them from there. ``maxStaleness: 0`` is the
synchronous baseline with this same code: admission then allows exactly one batch per version.

Why the actor is a Ray actor, measured on the quickstart (2 shared cores): the process boundary
costs a median 9-10 ms per step (batch in as numpy, stats and the weights reference out) plus
6 ms of weight sync, against 280-650 ms of actor compute per step, i.e. 2-4 %; in return the
driver keeps collecting and admitting rollout work while the actor trains, and megatron's
process-global state never leaks into the caller (tests and the benchmark run several jobs in
one process).
"""

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from asyncrl.api.job import AsyncRLJob, AsyncRLJobSpec
from asyncrl.api.old_logits_route import OldLogitsRoute
from asyncrl.rollout.envs.runner import ENV_ERROR_REASONS
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer import export
from asyncrl.trainer.driver.hosts.actor_group import ActorGroup
from asyncrl.trainer.driver.hosts.fleet import HostHandles, Placement, start_hosts
from asyncrl.trainer.driver.hosts.ray_env import local_ray
from asyncrl.trainer.driver.hosts.warm_start import warm_start_threads
from asyncrl.trainer.driver.loop import weight_sync
from asyncrl.trainer.driver.loop.accounting import (
    count_correction,
    count_eval,
    count_ewma_reset,
    count_old_logits,
    count_refusals,
    count_rollouts,
    success_rate,
)
from asyncrl.trainer.driver.loop.evaluation import EvalResult, Evaluator, evaluated_versions
from asyncrl.trainer.driver.loop.grpo_batch import assemble_batch, refuse_unusable, token_staleness
from asyncrl.trainer.driver.loop.run_scope import (
    JobHosts,
    MetricsEndpoint,
    RunOutcome,
    job_metrics,
    open_run_dir,
    sigterm_stops,
)
from asyncrl.trainer.driver.loop.stage import PhaseCallback, Stage
from asyncrl.trainer.driver.loop.stage_registry import make_stage
from asyncrl.trainer.driver.loop.staleness import Group, StalenessBuffer, check_staleness
from asyncrl.trainer.driver.loop.startup_probe import startup_check
from asyncrl.trainer.driver.loop.workers import GenerateCall, WorkerPool
from asyncrl.trainer.driver.run import checkpoints, recovery
from asyncrl.trainer.driver.run.metrics import DriverMetrics
from asyncrl.trainer.driver.run.rundir import RunDir
from asyncrl.trainer.driver.run.step_report import ActorStep, StepReport, step_line
from asyncrl.trainer.driver.run.summary import RunSummary, SummaryDraft
from asyncrl.trainer.driver.run.termination import StopRequest

if TYPE_CHECKING:
    from ray import ObjectRef

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How to run a job locally (everything the YAML does not say)."""

    run_dir: Path | None = None  # default runs/<job>-<UTC timestamp>
    steps: int | None = None  # override spec.train.steps
    port: int | None = None  # override spec.monitoring.port; 0 = any free port
    metrics_host: str = "127.0.0.1"
    num_cpus: float = field(default_factory=lambda: float(os.cpu_count() or 2))  # cores Ray may use
    actor_threads: int = 1  # torch threads of the actor process
    rollout_threads: int = 1  # torch threads per rollout worker
    warm_start: bool = True  # run (or reuse) the supervised warm start
    warm_start_dir: Path | None = None  # where the warm start is cached (default <run-dir>/warm_start)
    checkpoint_base: Path | None = None  # a relative checkpoint.dir lives here (a cluster: the job's volume)
    placement: Placement = "local"  # "cluster": hosts go on the pods' role resources (hosts.start_hosts)
    restarts: tuple[str, ...] = ()  # why each earlier attempt of this run failed (gang_restart.run_with_restarts)


@dataclass
class RunResult:
    """What ``run_job`` hands back (also written to ``summary.json``)."""

    run_dir: Path
    summary: RunSummary
    steps: list[dict[str, Any]] = field(default_factory=list)  # the metrics.jsonl lines (a resumed log included)
    metrics_url: str | None = None


LoopEvent = StepReport | EvalResult  # what on_step receives, typed (metrics.jsonl holds them flattened)
StepCallback = Callable[[LoopEvent], None]
BatchCallback = Callable[[list[Group], int], None]  # (groups about to train, actor version)
WarmCallback = Callable[[int, int, float], None]  # (warm-start steps done, total, last loss)
StartCallback = Callable[[dict[str, Any]], None]  # the summary so far, as summary.json writes it


class RunCallbacks(TypedDict, total=False):
    """:func:`run_job`'s callbacks by name (``run_with_restarts`` hands them to every attempt)."""

    on_step: StepCallback | None
    on_start: StartCallback | None
    on_batch: BatchCallback | None
    on_warm: WarmCallback | None
    on_phase: PhaseCallback | None


class NonFiniteLossError(RuntimeError):
    """Raised when too many consecutive steps had a non-finite loss."""


def default_run_dir(job: AsyncRLJob) -> Path:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{job.metadata.name}-{stamp}"


def run_job(job: AsyncRLJob, options: RunOptions = RunOptions(), on_step: StepCallback | None = None,
            on_start: StartCallback | None = None,
            on_batch: BatchCallback | None = None, on_warm: WarmCallback | None = None,
            on_phase: PhaseCallback | None = None) -> RunResult:
    """Run ``job`` (already validated) on a local Ray; returns the summary and per-step records.

    ``on_start`` gets the summary so far (metrics URL, run directory) once the workers are up,
    ``on_step`` every step's :class:`StepReport` and every :class:`EvalResult` (typed), ``on_batch`` every batch right before the actor trains on it,
    ``on_warm`` the warm start's progress, ``on_phase`` every interrupt-sync phase change
    (``idle``, ``interrupt``, ``score``, ``update``, ``resume``).
    """
    spec = job.spec
    total_steps = options.steps or spec.train.steps
    run = open_run_dir(job, options.run_dir or default_run_dir(job), checkpoint_base=options.checkpoint_base,
                       warm_start_dir=options.warm_start_dir)
    metrics = job_metrics(job)
    started = time.monotonic()
    summary = SummaryDraft(job=job.metadata.name, run_dir=str(run.path), max_staleness=spec.async_.max_staleness,
                           reference=spec.correction.reference.value, restarts=len(options.restarts))
    if options.restarts:  # gang restarts before this attempt (gang_restart), counted once each
        summary.restart_causes = tuple(options.restarts)
    records: list[dict[str, Any]] = []
    stop = StopRequest()  # SIGTERM (preemption, drain): stop cleanly, checkpoint, exit 0
    # --- setup; cleanup on every exit path, Ctrl-C included, in the reverse order (loop/run_scope.py) ------
    with MetricsEndpoint() as endpoint, RunOutcome(job, run, summary, records, started, stop) as outcome:
        if spec.monitoring.enabled:
            port = spec.monitoring.port if options.port is None else options.port
            summary.metrics_url = endpoint.serve(metrics.registry, port, options.metrics_host)
        with (local_ray(num_cpus=max(1, math.ceil(options.num_cpus))) as own_ray, JobHosts(own_ray) as held,
              sigterm_stops(stop), held.naming_actor_failure()):
            hosts = held.track(_start_hosts(spec, options, run))
            summary.startup_s = round(time.monotonic() - started, 2)
            _model_load(hosts, summary)
            _announce_endpoints(hosts, spec)
            weight_sync.setup(hosts, spec, run.checkpoint_dir(spec.checkpoint.dir), options.placement)
            if on_start is not None:
                on_start({**summary.to_json(), "total_steps": total_steps})
            # --- warm start or resume ------------------------------------------------------------
            version, driver_state = _warm_or_resume(hosts, job, run, options, summary, on_warm, stop)
            summary.start_version = version
            if spec.correction.startup_check.enabled:  # refuses (exit 2) before any step
                startup_check(hosts, spec, version, summary, metrics)
            # a resumed run continues its log (a torn last line is cut off and said)
            records.extend(run.keep_steps_up_to(version, summary.notes()))
            outcome.logged_from = len(records)
            # --- the loop ------------------------------------------------------------------------
            loop = _Loop(spec=spec, hosts=hosts, metrics=metrics, run=run, version=version, on_step=on_step,
                         on_batch=on_batch, records=records, summary=summary, started=started,
                         stage=make_stage(spec, on_phase), stop=stop)
            loop.restore(driver_state)
            loop.run(total_steps)
    return RunResult(run.path, outcome.final, records, outcome.final.metrics_url)


def _start_hosts(spec: AsyncRLJobSpec, options: RunOptions, run: RunDir) -> HostHandles:
    """The job's Ray processes, the cores split evenly between them (every dedicated scorer rank is one too)."""
    n_procs = (spec.rollout.replicas + spec.actor.world_size
               + (spec.old_logits.dedicated.replicas * spec.old_logits.dedicated.layout_for(spec.actor).world_size
                  if spec.old_logits_route is OldLogitsRoute.DEDICATED else 0))
    return start_hosts(spec, n_procs_cpus=options.num_cpus / n_procs, actor_threads=options.actor_threads,
                       rollout_threads=options.rollout_threads, placement=options.placement,
                       # snapshot.device disk: under the run directory locally; in a cluster the actor's pod
                       # has its own disk (a private folder there)
                       work_dir=str(run.path / "snapshots") if options.placement == "local" else None)


def _model_load(hosts: HostHandles, summary: SummaryDraft) -> None:
    """Put how the actor loaded ``spec.model.weights`` (seconds, peak RSS) into the summary and the log."""
    import ray

    if (model_load := ray.get(hosts.actor.model_load.remote())) is not None:
        summary.model_load = model_load
        log.info("actor loaded %s (%s): %.2f s, peak RSS %.0f MiB", model_load["folder"],
                 model_load["architecture"], model_load["seconds"], model_load["peak_rss_bytes"] / 2**20)


def _announce_endpoints(hosts: HostHandles, spec: AsyncRLJobSpec) -> None:
    """Log each rollout worker's OpenAI-compatible endpoint (``spec.task.agent``): where a harness connects."""
    import ray

    if spec.task.agent is None:
        return
    for i, url in enumerate(ray.get([w.endpoint_url.remote() for w in hosts.rollout])):
        log.info("agent endpoint of rollout worker %d: %s", i, url)


def _warm_threads(hosts: HostHandles, options: RunOptions) -> int:
    """Torch threads per actor rank in the warm start: one host's cores split between the most ranks of the
    actor group on one host (the group's rank locations; all of them locally, a pod's in a cluster). The
    host's cores: locally ``options.num_cpus``; in a cluster an actor pod's CPUs (``options.actor_threads``,
    what Ray says the pods carrying the actor role have), not the driver pod's own count."""
    where = (hosts.actor.where or []) if isinstance(hosts.actor, ActorGroup) else []  # one rank: a plain handle
    cores = options.actor_threads if options.placement == "cluster" else options.num_cpus
    return warm_start_threads(cores, [w.host for w in where])


def _warm_start(hosts: HostHandles, total: int, cache: Path, options: RunOptions,
                on_warm: WarmCallback | None, chunk: int = 25, sigterm: StopRequest | None = None) -> dict[str, Any]:
    """Supervised warm start in chunks (progress), cached in ``cache`` for a rerun; SIGTERM ends it after
    the chunk in progress, uncached (a rerun does it again: it fits no grace period otherwise)."""
    import ray

    if ray.get(hosts.actor.load_warm_start.remote(str(cache))):
        return {"cached": True, "steps": total, "seconds": 0.0}
    threads = _warm_threads(hosts, options)  # rollout waits for the first weights meanwhile
    t0 = time.monotonic()
    losses: list[float] = []
    for start in range(0, total, chunk):
        stop = min(total, start + chunk)
        losses += ray.get(hosts.actor.warm_start.remote(start, stop, total, threads))
        if on_warm is not None:
            on_warm(stop, total, losses[-1])
        if sigterm is not None and sigterm.requested and stop < total:
            return {"cached": False, "steps": stop, "interrupted": True}
    ray.get(hosts.actor.save_warm_start.remote(str(cache)))
    return {"cached": False, "steps": total, "seconds": round(time.monotonic() - t0, 2), "threads_per_rank": threads,
            "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4)}


def _warm_or_resume(hosts: HostHandles, job: AsyncRLJob, run: RunDir, options: RunOptions,
                    summary: SummaryDraft, on_warm: WarmCallback | None, sigterm: StopRequest | None = None
                    ) -> tuple[int, recovery.DriverState | None]:
    """Resume from the newest checkpoint (with the driver's state saved beside it), else warm-start
    (reusing a cached warm start)."""
    import ray

    from asyncrl.rollout.envs.binding import has_demonstrations

    spec = job.spec
    ckpt_dir = run.checkpoint_dir(spec.checkpoint.dir)
    # The newest checkpoint that verifies (sizes, checksums, driver state); broken newer ones are set
    # aside and said, so one corrupt folder never blocks a resume.
    point = checkpoints.choose_resume(ckpt_dir) if spec.checkpoint.resume else checkpoints.ResumePoint(None)
    latest = point.checkpoint
    summary.notes().extend(point.notices())
    state: recovery.DriverState | None = None
    if latest is not None:
        version = ray.get(hosts.actor.load_checkpoint.remote(str(latest.path)))
        summary.resumed_from = str(latest.path)
        state = point.state
    elif options.warm_start and spec.train.warm_start_steps > 0 and has_demonstrations(spec.task):
        summary.warm_start = _warm_start(hosts, spec.train.warm_start_steps,
                                            options.warm_start_dir or run.warm_start_dir, options, on_warm,
                                            sigterm=sigterm)
        version = 0
    else:
        version = 0
    weight_sync.initial(hosts, int(version))
    return int(version), state


class _Loop:
    """The asynchronous loop's state; ``run`` is the story, the methods are its steps."""

    def __init__(self, *, spec: AsyncRLJobSpec, hosts: HostHandles, metrics: DriverMetrics, run: RunDir, version: int,
                 on_step: StepCallback | None, on_batch: BatchCallback | None, records: list[dict[str, Any]],
                 summary: SummaryDraft, started: float, stage: Stage | None = None,
                 stop: StopRequest | None = None) -> None:
        self.spec, self.hosts, self.m, self.run_dir = spec, hosts, metrics, run
        self.version = version
        self.on_step, self.on_batch = on_step, on_batch
        self.records, self.summary, self.started = records, summary, started
        self.W = spec.async_.max_staleness
        B = spec.train.prompts_per_step
        # Members of a group may come back in different calls once interrupt-sync interrupts them.
        self.buffer = StalenessBuffer(self.W, B, base_version=version, group_size=spec.task.group_size)
        n = len(hosts.rollout)
        self.chunk = max(1, math.ceil(B / n))  # groups per generate call
        self.workers = WorkerPool(n, time.monotonic())  # each worker: idle since when, or its call in flight
        self.stage = stage or Stage()
        self.consecutive_nonfinite = 0
        self.total_steps = version
        self.m.policy_version.set(version)
        self.cursors = [0] * n  # groups requested from each worker over the run (its prompt cursor)
        self.replacements = 0
        self.refusals_seen: dict[int, dict[str, int]] = {}  # worker index -> its endpoint's refusals counted so far
        self.step_extra: dict[str, float] = {}  # what the stage adds to the next step's report
        self.reports: list[StepReport] = []  # this session's steps
        # versions already evaluated (a resumed run's log says which; read back from its lines once)
        self.evaluated: set[int] = evaluated_versions(records)
        self.evaluator = Evaluator(spec)
        self.paused = False  # an evaluation runs: no training generate call is admitted
        self.stop = stop or StopRequest()  # SIGTERM: admit nothing more, checkpoint, leave
        self.saved_version = version  # the newest version with a checkpoint (the start: nothing new yet)

    def restore(self, state: recovery.DriverState | None) -> None:
        """Continue each worker's prompt sequence from a checkpoint's driver state (no prompt replayed);
        the groups that were waiting or in flight then are counted as aborted (rollout regenerates)."""
        import ray

        if state is None:
            return
        if len(state.cursors) != len(self.hosts.rollout):
            # A changed rollout.replicas: workers keep their index; new ones start at 0.
            state = recovery.DriverState(state.version, (state.cursors + [0] * len(self.hosts.rollout))[
                : len(self.hosts.rollout)], state.buffer, state.groups_open)
        self.cursors = list(state.cursors)
        ray.get([w.set_prompt_cursor.remote(c) for w, c in zip(self.hosts.rollout, self.cursors, strict=True)])
        # a copy: self.cursors moves on, the summary keeps where the resume started
        self.summary.resume = {"cursors": list(self.cursors), "groups_aborted_at_resume": state.groups_open}

    # ---------------------------------------------------------------------------------------------
    def run(self, total_steps: int) -> None:

        self.total_steps = total_steps
        loop_start = time.monotonic()
        try:
            self.stage.start(self)
            self._evaluate_if_due()  # version 0: the policy before any RL step
            while self.version < total_steps and not self.stop.requested:
                self._admit()
                wait_start = time.monotonic()
                batch = self._next_batch()
                while batch is None and not self.stop.requested:
                    self.wait_any()
                    batch = self._next_batch()
                if batch is None:  # SIGTERM while collecting: that step is abandoned, not half-trained
                    break
                self.m.trainer_idle.inc(time.monotonic() - wait_start)
                self._train(batch)
            if self.stop.requested:
                self._stop_checkpoint()
        finally:  # also on Ctrl-C or an error: the accounting is part of a usable run directory
            self._drain()
            self._account_time(time.monotonic() - loop_start)

    def wait_any(self, *extra: "ObjectRef") -> "ObjectRef | Literal[False] | None":
        """Wait until one generate call, one call of the old-logit stage or one of ``extra`` finishes and
        handle it (collect and admit, or the stage's answer); returns the ``extra`` ref that finished,
        None otherwise, and False when nothing is in flight at all."""
        import ray

        refs = [*extra, *self.workers.refs(), *self.stage.refs()]
        if not refs:
            return False
        done, _ = ray.wait(refs, num_returns=1)
        ref = done[0]
        if ref in extra:
            return ref
        if ref in self.workers:
            self.collect(ref)
            self._admit()
        else:
            self.stage.collect(self, ref)
        return None

    def _account_time(self, wall: float) -> None:
        for seconds in self.workers.restart_idle_clocks(time.monotonic()):
            self.m.rollout_idle.inc(seconds)
        # An evaluation pauses training and rollout on purpose: its seconds are not the loop's to idle in.
        working = max(0.0, wall - self.evaluator.seconds)
        self.m.trainer_seconds.inc(working)
        self.m.rollout_worker.inc(working * len(self.hosts.rollout))
        value = self.m.registry.get_sample_value
        self.summary.loop = {
            "wall_s": round(wall, 3),
            "eval_s": round(self.evaluator.seconds, 3),
            "trainer_idle_s": round(value("asyncrl_trainer_idle_seconds_total") or 0.0, 3),
            "rollout_idle_s": round(value("asyncrl_rollout_idle_seconds_total") or 0.0, 3),
            "rollout_worker_s": round(value("asyncrl_rollout_worker_seconds_total") or 0.0, 3),
            "train_s": round(sum(r.step_s + (r.sync.seconds if r.sync else 0.0) for r in self.reports), 3),
            "trajectories_trained": sum(r.trajectories for r in self.reports if r.applied),
        }

    def _stop_checkpoint(self) -> None:
        """After SIGTERM: a final checkpoint of the current version (unless it has one), within the grace period."""
        t0 = time.monotonic()
        if self.version > self.saved_version:
            self.summary.final_checkpoint = str(self._checkpoint())
        self.summary.stopped = {"signal": "SIGTERM", "version": self.version,
                                   "checkpoint_s": round(time.monotonic() - t0, 3),
                                   "seconds_after_signal": round(self.stop.seconds_since(), 3)}
        log.warning("stopped at version %d after SIGTERM: checkpoint %s, %.1f s after the signal",
                    self.version, self.summary.final_checkpoint or "(already saved)", self.stop.seconds_since())

    def _admit(self) -> None:
        """Give every idle worker as many new groups as the staleness capacity allows (none while an
        evaluation runs, none after SIGTERM)."""
        if self.paused or self.stop.requested:
            return
        now = time.monotonic()
        for i, worker in enumerate(self.hosts.rollout):
            if not self.workers.slots[i].idle:
                continue
            n = self.buffer.reserve(self.chunk, self.version)
            if n == 0:
                break
            self.m.rollout_idle.inc(self.workers.leave_idle(i, now))
            ref = worker.generate.remote(n)
            self.cursors[i] += n
            self.workers.admitted(GenerateCall(ref, i, n, self.version))
            self.stage.admitted(self, ref, self.version)
        self._gauges()

    def collect(self, ref: "ObjectRef") -> None:
        """One generate call came back: count it and put its groups in the buffer."""
        import ray

        # own: the call of the worker now at its slot, which idles from here; else an orphan (a replacement
        # runs at the slot and is already counted idle or busy)
        call, own = self.workers.returned(ref, time.monotonic())
        i, reserved = call.worker, call.groups
        try:
            trajs: list[Trajectory] = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # the worker's process died: replace it, go on
            self.m.rollout_errors.inc()
            self.buffer.abort(reserved)
            self.stage.returned(self, ref, [])
            if own:  # not yet replaced (a weight sync may have found it first)
                self.replace_rollout(i, exc)
            return
        except Exception as exc:  # noqa: BLE001 -- reported with the task and trajectories it hit
            self.m.rollout_errors.inc()
            self.buffer.abort(reserved)
            self.stage.returned(self, ref, [])
            raise RuntimeError(f"rollout worker {i} failed: {_cause(exc)}") from exc
        # rewards out of range and over-length trajectories never reach a batch (nor reward_mean or reward_sum)
        refused = refuse_unusable(trajs, max_reward=self.spec.task.endpoint.max_reward_magnitude,
                                  context=self.hosts.context)
        for why, n in refused.items():
            self.m.trajectories_dropped.labels(why).inc(n)
        count_rollouts(self.m, trajs)
        self.buffer.put(trajs, reserved)
        self.stage.returned(self, ref, trajs)

    def replace_rollout(self, i: int, exc: BaseException) -> None:
        """Start a new rollout worker ``i`` in place of a dead one: same index, the dead one's prompt
        cursor (its in-flight groups were counted as aborted and their slots freed), the current weights."""
        import ray

        limit = 3 * len(self.hosts.rollout)
        if self.replacements >= limit:
            raise RuntimeError(
                f"rollout worker {i} died and {self.replacements} workers were already replaced in this run "
                f"(limit {limit}): {_cause(exc)}"
            ) from exc
        self.replacements += 1
        self.buffer.abort_partial(f"w{i}-")  # members suspended in the dead worker never come back
        log.warning("rollout worker %d died (%s); replacing it at version %d", i, _cause(exc), self.version)
        worker = self.hosts.replace_rollout(i)
        ray.get(worker.set_prompt_cursor.remote(self.cursors[i]))
        weight_sync.to_replacement(self.hosts, worker, self.version, lora=self.spec.model.lora is not None)
        self.m.worker_replacements.labels("rollout").inc()
        self.workers.replaced(i, time.monotonic())  # a call of the dead one still in flight is an orphan now

    def on_every_worker(self, call: Callable[[Any], Any]) -> list[Any]:
        """``ray.get`` of ``call(worker)`` on every rollout worker; a worker found dead is replaced (it
        loads ``hosts.weights``) and its answer is None."""
        import ray

        refs = [call(w) for w in self.hosts.rollout]
        out: list[Any] = []
        for i, ref in enumerate(refs):
            try:
                out.append(ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                self.replace_rollout(i, exc)
                out.append(None)
        return out

    def _next_batch(self) -> list[Group] | None:
        batch, dropped = self.buffer.take_batch(self.version)
        if dropped.groups:
            self.m.trajectories_dropped.labels("stale").inc(dropped.trajectories)
            self.m.tokens_dropped.labels("stale").inc(dropped.sampled_tokens)
            self.stage.released(self, list(dropped.dropped))
        if batch is None and not self.workers.in_flight and not self.stop.requested:
            # Nothing in flight and not enough ready: admission must be able to make progress.
            self._admit()
            if not self.workers.in_flight:
                raise RuntimeError(
                    f"staleness buffer stalled: {self.buffer.ready} groups ready, capacity "
                    f"{self.buffer.capacity(self.version)} at version {self.version}"
                )
        return batch

    def _train(self, groups: list[Group]) -> None:
        """Batch -> actor step -> new version -> weight sync; one step record."""
        import ray

        worst = check_staleness(groups, self.version, self.W)  # the hard guard
        if self.on_batch is not None:
            self.on_batch(groups, self.version)
        self.stage.before_train(self, groups)  # dedicated: wait until every older token is scored
        batch = assemble_batch(groups, pad_id=self.hosts.pad_id)
        gaps = token_staleness(batch.versions, batch.loss_mask, self.version)
        t0 = time.monotonic()
        stats_ref: ObjectRef
        stats_ref, weights_ref = self.hosts.actor.train_step.options(num_returns=2).remote(
            batch.to_numpy(), self.version, **self.stage.step_kwargs(self)
        )
        # Keep feeding rollout (and the old-logit stage) while the actor trains: that overlap is the
        # whole point of async.
        while self.wait_any(stats_ref) is not stats_ref:
            pass
        actor: ActorStep = ray.get(stats_ref)
        out = actor.metrics
        self.stage.trained(self, groups)
        step_s = time.monotonic() - t0
        self.m.step_duration.observe(step_s)
        reference = self.spec.correction.reference.value
        self.m.reference_seconds.labels(reference).inc(out.reference_seconds)
        rewards = [t.reward for g in groups for t in g]  # one per batch row
        report = StepReport(
            step=self.version + 1, wall_s=time.monotonic() - self.started,
            reward_mean=sum(rewards) / len(rewards), success_rate=success_rate(groups),
            staleness_mean=float(gaps.float().mean()) if gaps.numel() else 0.0,
            staleness_max=worst, trajectories=len(rewards),
            partial_frac=sum(t.is_partial for g in groups for t in g) / max(1, len(rewards)),
            step_s=step_s,
            env_errors=self._env_errors_total(),  # episodes the environment's code aborted so far
            actor=actor, dedicated_wait_s=self.step_extra.get("dedicated_wait_s"),
        )
        self.step_extra = {}
        self._pull_refusals()
        if not out.applied:
            # Non-finite loss: the actor skipped the update; the report carries its batch summary.
            # No version came of these groups: their admission slots are free again.
            self.buffer.step_skipped(len(groups))
            self.m.nonfinite_losses.inc()
            self.m.optimizer_updates.labels("skipped").inc(out.updates_skipped)
            self.consecutive_nonfinite += 1
            line = self._record(report)
            if self.consecutive_nonfinite >= 3:
                raise NonFiniteLossError(f"3 consecutive non-finite losses at version {self.version}: {line}")
            return
        self.consecutive_nonfinite = 0
        for g in gaps.tolist():
            self.m.token_staleness.observe(g)
        count_correction(self.m, out.correction, reference, int(batch.loss_mask.sum()))
        count_ewma_reset(self.m, out.ewma_reset_reason, out.ewma_reset_outcome)
        count_old_logits(self.m, out, reference)
        self.version += 1
        self.hosts.weights = weights_ref
        sync = self.stage.sync_weights(self, weights_ref, self.version)
        self.m.weight_sync_duration.observe(sync.seconds)
        self.m.weight_sync_transfer.observe(sync.transfer_seconds or 0.0)
        self.m.weight_sync_pause.observe(sync.pause_seconds or 0.0)
        self.m.policy_version.set(self.version)
        self.m.optimizer_steps.inc()
        report = report.with_(sync=sync)
        if self.version % self.spec.checkpoint.every_steps == 0 or self.version == self.total_steps:
            # The last step is saved too: rerunning a finished job resumes there and has nothing to redo.
            report = report.with_(checkpoint=str(self._checkpoint()))
        if export.due(self.version, self.total_steps, self.spec.checkpoint.export_every_steps):
            path, seconds = self._export()
            report = report.with_(export=path, export_s=seconds)
        self._record(report)
        self._evaluate_if_due()

    def _evaluate_if_due(self) -> None:
        """Evaluate the current version on the held-out prompts when ``spec.eval`` says so: one record."""
        if not self.evaluator.due(self.version, self.total_steps, self.evaluated):
            return
        result = self.evaluator.run(self)
        self.evaluated.add(result.version)
        count_eval(self.m, result)
        self._record(result)

    def _checkpoint(self) -> Path:
        import ray

        root = self.run_dir.checkpoint_dir(self.spec.checkpoint.dir)
        ckpt = checkpoints.path_for(root, self.version)
        # The driver's state first: a complete actor checkpoint always has it.
        recovery.save(root, recovery.DriverState(
            self.version, list(self.cursors), vars(self.buffer.counts).copy(),
            groups_open=self.buffer.ready + self.buffer.running))
        ray.get(self.hosts.actor.save_checkpoint.remote(str(ckpt)))
        self.saved_version = self.version
        checkpoints.prune(root, self.spec.checkpoint.keep)
        recovery.prune(root, {c.version for c in checkpoints.all_complete(root)})
        return ckpt

    def _export(self) -> tuple[str, float]:
        """The current version as an HF folder in ``<checkpoint dir>/exports`` (``checkpoint.exportEverySteps``),
        from the actor's fp32 weights; the newest ``exportKeep`` are kept."""
        import ray

        # The actor's fp32 weights (rollout's may be bf16 on the wire: actor.weightSync).
        result = export.export_weights(
            ray.get(self.hosts.actor.weights.remote()), export.model_files(self.spec),
            self.run_dir.checkpoint_dir(self.spec.checkpoint.dir), self.version,
            job_name=self.summary.job, keep=self.spec.checkpoint.export_keep)
        self.summary.export = result.record()  # the newest: at the end, the final export
        return str(result.path), round(result.seconds, 3)

    def _record(self, event: StepReport | EvalResult) -> dict[str, Any]:
        """Write one event as a ``metrics.jsonl`` line (flattened here, once, with the buffer's running
        total of stale-dropped groups) and hand it, typed, to ``on_step``; returns the line."""
        wall = time.monotonic() - self.started
        dropped = self.buffer.counts.groups_dropped_stale
        if isinstance(event, StepReport):
            event = event.with_(dropped_groups_total=dropped)  # the typed event carries it, as the line does
            line = step_line(event)
            self.reports.append(event)
        else:
            line = event.record(wall) | {"dropped_groups_total": dropped}
        self.records.append(line)
        self.run_dir.append_step(line)
        self._gauges()
        if self.on_step is not None:
            self.on_step(event)
        return line

    def _drain(self) -> None:
        """Stop: in-flight generate calls are abandoned (Ray shutdown ends them) and counted as aborted."""
        abandoned = self.workers.abandon()
        in_flight = sum(c.groups for c in abandoned)
        for c in abandoned:
            self.buffer.abort(c.groups)
        self.summary.add_stage(self.stage.summary())
        self.summary.worker_replacements = self.replacements
        # episodes the environment's code aborted, by reason (asyncrl_env_errors_total; the job went on)
        self.summary.env_errors = self._env_errors()
        self._pull_refusals()
        buffer = vars(self.buffer.counts).copy()
        buffer["groups_in_flight_at_end"] = in_flight
        buffer["groups_left_unused"] = self.buffer.ready
        # interrupt-sync: groups whose members are still suspended in their workers when the run ends
        buffer["groups_suspended_at_end"] = self.buffer.running
        self.summary.buffer = buffer

    def _pull_refusals(self) -> None:
        """The rollout workers' endpoint refusals into ``asyncrl_agent_requests_refused_total`` (agent jobs only; a
        worker that does not answer is skipped until the next step: metrics never stop the job)."""
        import ray

        if self.spec.task.agent is None:
            return
        for i, w in enumerate(self.hosts.rollout):
            try:
                now = ray.get(w.agent_refusals.remote(), timeout=10)
            except Exception:  # noqa: BLE001 -- a dead or busy worker: its counts arrive with the next pull
                continue
            count_refusals(self.m, self.refusals_seen.setdefault(i, {}), now)

    def _env_errors(self) -> dict[str, int]:
        """``asyncrl_env_errors_total`` by reason, as counted so far."""
        return {r: int(self.m.registry.get_sample_value("asyncrl_env_errors_total", {"reason": r}) or 0)
                for r in ENV_ERROR_REASONS}

    def _env_errors_total(self) -> int:
        return sum(self._env_errors().values())

    def _gauges(self) -> None:
        self.m.buffer_ready.set(self.buffer.ready)
        self.m.rollout_running.set(self.buffer.running)
        self.m.admission_capacity.set(self.buffer.capacity(self.version))


def _cause(exc: BaseException) -> str:
    """The original exception's message (Ray wraps it in a RayTaskError with a long traceback)."""
    cause = getattr(exc, "cause", None) or exc
    return f"{type(cause).__name__}: {cause}"
