"""The job's processes as Ray actors: rollout workers and the Megatron actor.

Each host wraps a real component in its own process and caps that process's torch threads, so
that the job's processes share the cores instead of oversubscribing them (each torch process
would otherwise start one thread per core). Tensors cross processes as numpy arrays: Ray
stores them once and readers map them zero-copy (reference/feasibility.md §1.2).

- :class:`RolloutHost`: a :class:`~asyncrl.rollout.worker.RolloutWorker`. A *threaded* actor
  (``max_concurrency=2``): ``update_weights`` runs on a second thread while ``generate`` runs,
  which is how a weight update reaches a generating worker (partial rollout).
- :class:`ActorHost`: one rank of the :class:`~asyncrl.trainer.megatron.actor.MegatronActor` with its
  warm start, train step, weights and checkpoints; :class:`ActorGroup` holds the
  ``actor.replicas x max(gpusPerReplica, 1)`` ranks behind one handle (every call fans out, the driver
  reads rank 0).
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.driver.warm import warm_start_lr

Weights = dict[str, np.ndarray]
Placement = Literal["local", "cluster"]  # where start_hosts puts the processes (see start_hosts)


def _context(spec: AsyncRLJobSpec, tokenizer: Any) -> int:
    """The longest trajectory of the job's task: the actor, the scorers and the rollout workers all
    build the model for this context length."""
    from asyncrl.rollout.envs.binding import context_length

    return context_length(spec.task, tokenizer)


def _limit_threads(n: int) -> None:
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (a reused Ray worker)
        pass


class RolloutHost:
    """One rollout worker process."""

    def __init__(self, spec_json: dict[str, Any], worker_index: int, threads: int) -> None:
        _limit_threads(threads)
        from asyncrl.rollout.worker import RolloutWorker

        self.spec = AsyncRLJobSpec.model_validate(spec_json)
        self.threads = threads
        self.worker = RolloutWorker(self.spec.task, self.spec.model, self.spec.async_, worker_index=worker_index,
                                    seed=self.spec.train.seed, rollout=self.spec.rollout,
                                    workers=self.spec.rollout.replicas)
        self._weights: Any = None  # the last version's HF tensors received (interrupt-sync scores under them)
        self._paused_reported = 0.0  # the engine's apply_seconds already reported by update_weights
        self._scorer: Any = None  # the training-side SegmentScorer, built on the first interrupt-sync window

    def generate(self, n_groups: int) -> list[Any]:
        return self.worker.generate(n_groups)

    def update_weights(self, weights: Any, version: int) -> dict[str, float]:
        """Load (first time, worker idle) or hand over (thread-safe) new weights: a weight-sync handle
        (``weightsync.objectstore.BucketRefs``: the buckets are pulled here) or an HF dict of arrays.

        Returns ``transfer_s`` (buckets pulled and reassembled, generation running meanwhile),
        ``handover_s`` (the engine's private copy), ``pause_s`` (generation stopped installing weights since
        the last call: this version when applied at once, else the boundary swaps of earlier versions)
        and ``bytes``."""
        from asyncrl.trainer.weightsync.objectstore import receive

        engine = self.worker.engine
        got = receive(weights)
        t0 = time.perf_counter()
        if self.worker.version < 0:
            self.worker.load_weights(got.state, version)
        else:
            self.worker.update_weights(got.state, version)
        handover = time.perf_counter() - t0
        self._weights = got.state  # views of the object store's buckets (interrupt-sync scores under them)
        pause = float(getattr(engine, "apply_seconds", 0.0)) - self._paused_reported
        self._paused_reported += pause
        return {"transfer_s": got.transfer_s, "handover_s": handover, "pause_s": pause, "bytes": float(got.nbytes)}

    def evaluate(self, problems: list[Any], version: int, temperature: float, seed: int, first: int) -> list[Any]:
        """One sample of each held-out problem under ``version`` (``RolloutWorker.evaluate``); the driver
        calls it only while no ``generate`` runs here."""
        return self.worker.evaluate(problems, version=version, temperature=temperature, seed=seed, first=first)

    # ------------------------------------------------------------------ interrupt-sync (paper §5.1)
    def sync_interrupt(self, timeout_s: float) -> int:
        """Phase *interrupt*: stop generation at a token boundary and hold it; in-flight episodes stay
        suspended here (a running ``generate`` returns its finished trajectories). Returns how many."""
        return len(self.worker.interrupt(timeout_s, hold=True))

    def sync_score(self, trajs: list[Any], version: int, release: bool) -> dict[str, Any]:
        """Phase *score*: with the engine's memory released (``release``), score every unscored sampled
        token of ``version`` -- of the suspended episodes here and of ``trajs`` (finished ones the driver
        holds) -- with the training-side model code under this worker's weights of ``version``.

        Returns ``{"scores": [(positions, values)] per trajs, "tokens": n, "release_s", "score_s",
        "acquire_s"}``; the suspended episodes keep their scores and carry them when they finish.
        """
        from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings, SegmentScorer

        if self.worker.version != version or self._weights is None:
            raise RuntimeError(
                f"interrupt-sync: worker {self.worker.worker_index} holds version {self.worker.version}, "
                f"the driver scores version {version}"
            )
        t0 = time.perf_counter()
        if release:
            self.worker.release()
        t1 = time.perf_counter()
        if self._scorer is None:
            self._scorer = SegmentScorer(ScorerSettings(self.worker.arch, temperature=self.spec.task.temperature,
                                                        seed=self.spec.train.seed))
        builds = self._scorer.builds
        try:
            self._scorer.load(self._weights, version)
            episodes = self.worker.suspended_episodes()
            snaps = [e.to_trajectory() for e in episodes]
            results = self._scorer.score([*snaps, *trajs], version)
            for e, (pos, val) in zip(episodes, results[: len(snaps)], strict=True):
                if pos:
                    e.set_logp_old(pos, val)
            scores = results[len(snaps):]
        finally:
            if release:
                self._scorer.free()  # the engine gets the memory back
        t2 = time.perf_counter()
        if release:
            self.worker.acquire()
        t3 = time.perf_counter()
        built = self._scorer.builds > builds  # this window built the model (first, or after free())
        return {"scores": scores, "tokens": sum(len(p) for p, _ in results),
                "release_s": t1 - t0, "score_s": t2 - t1, "acquire_s": t3 - t2,
                "scorer_build_s": self._scorer.build_seconds if built else 0.0,
                "scorer_load_s": self._scorer.load_seconds}

    def set_prompt_cursor(self, n: int) -> None:
        """Continue the worker's prompt sequence at group ``n`` (resume, replacement)."""
        self.worker.set_prompt_cursor(n)

    def sync_resume(self) -> None:
        """Phase *resume*: end the hold (the new weights were handed over in phase *update*)."""
        self.worker.resume()

    def stats(self) -> dict[str, Any]:
        return vars(self.worker.stats()).copy()


class ActorHost:
    """The Megatron actor process."""

    def __init__(self, spec_json: dict[str, Any], threads: int, work_dir: str | None = None, *,
                 rank: int = 0, init_method: str | None = None) -> None:
        _limit_threads(threads)
        self.threads = threads
        from dataclasses import replace

        from asyncrl.rollout.envs.binding import task_tokenizer
        from asyncrl.trainer.megatron.actor import ActorSettings, MegatronActor
        from asyncrl.trainer.megatron.parallel import Layout

        self.spec = AsyncRLJobSpec.model_validate(spec_json)
        self.tokenizer = task_tokenizer(self.spec.model, self.spec.task)  # the rollout workers resolve the same one
        self.pad = self.tokenizer.pad_id
        a = self.spec.actor
        self.rank, self.world = rank, a.world_size
        if work_dir is not None and rank > 0:  # snapshot files of ranks sharing a host must not collide
            work_dir = str(Path(work_dir) / f"rank{rank}")
        settings = ActorSettings.from_spec(self.spec, self.tokenizer.vocab_size, num_threads=threads,
                                           max_sequence_length=_context(self.spec, self.tokenizer), work_dir=work_dir)
        layout = Layout(tp=a.megatron.tensor_parallel, pp=a.megatron.pipeline_parallel, ep=a.megatron.expert_parallel,
                        rank=rank, world=self.world, init_method=init_method)
        self.actor = MegatronActor(replace(settings, layout=layout))

    def pad_id(self) -> int:
        return self.pad

    def model_load(self) -> dict[str, Any] | None:
        """How loading ``spec.model.weights`` went (seconds, peak RSS, ...); None for a random init."""
        report = self.actor.load_report
        return None if report is None else report.record()

    def load_warm_start(self, cache_dir: str) -> bool:
        """Load a cached warm start (True) or report there is none (False)."""
        from asyncrl.trainer.megatron.checkpoint import CheckpointError, verify_checkpoint

        cache = Path(cache_dir)
        if not (cache / "meta.json").exists():  # the actor writes checkpoints atomically
            return False
        try:
            verify_checkpoint(cache)  # sizes and checksums: a damaged cache is redone, not loaded
        except CheckpointError as exc:
            logging.getLogger(__name__).warning("%s; running the warm start again", exc)
            return False
        self.actor.load_checkpoint(str(cache), old_logits=False)  # the provider starts from these weights
        self.actor.version = 0
        return True

    def warm_start(self, start: int, stop: int, total: int, threads: int, batch_size: int = 128) -> list[float]:
        """Supervised steps ``[start, stop)`` of ``total`` on generated demonstrations; their losses.

        Called in chunks so the driver can show progress. Runs with ``threads`` torch threads
        (nothing else computes meanwhile: rollout waits for the first weights), then returns to
        the actor's own budget and ``train.learningRate``.
        """
        import random

        import torch

        from asyncrl.rollout.envs.demos import demonstrations, pad_batch

        if start == 0:
            self._demo_rng = random.Random(self.spec.train.seed)
        losses = []
        torch.set_num_threads(threads)
        try:
            for step in range(start, stop):
                self.actor.set_learning_rate(warm_start_lr(step, total))
                demos = demonstrations(self.spec.task.name, batch_size, self._demo_rng,
                                       max_tool_calls=self.spec.task.max_tool_calls, tokenizer=self.tokenizer)
                b = pad_batch(demos, pad_id=self.pad)
                losses.append(self.actor.sft_step(b.tokens, b.loss_mask).loss)
        finally:
            torch.set_num_threads(self.threads)
            self.actor.set_learning_rate(self.spec.train.learning_rate)
        return losses

    def save_warm_start(self, cache_dir: str) -> None:
        """RL starts at version 0: warm-start steps are not policy versions."""
        self.actor.version = 0
        self.save_checkpoint(cache_dir)

    def train_step(self, batch: dict[str, np.ndarray], version: int,
                   live_versions: list[int] | None = None) -> tuple[dict[str, Any], Any]:
        """One optimizer step on ``TrainBatch.to_numpy()``'s arrays; returns (flat stats, the new weights'
        sync handle or None when the step was skipped). ``live_versions``: the versions untrained tokens may still
        carry after this step (weight snapshots of every other version are released)."""
        from asyncrl.trainer.megatron.batch import TrainBatch

        if self.actor.version != version:
            raise RuntimeError(f"driver expected actor version {version}, actor is at {self.actor.version}")
        tb = TrainBatch.from_numpy(batch)
        kwargs = {} if live_versions is None else {"live_versions": live_versions}
        out = self.actor.train_step(tb, **kwargs)
        stats: dict[str, Any] = {
            "applied": out.stepped, "loss": out.loss, "grad_norm": out.grad_norm, "reference": out.reference,
            "ewma_reset": int(out.ewma_reset), "ewma_reset_reason": out.ewma_reset_reason,
            "actor_forward_s": round(out.forward_seconds, 4),
            "actor_reference_s": round(out.reference_seconds, 4), "actor_backward_s": round(out.backward_seconds, 4),
            "snapshot_versions": out.snapshot_versions, "snapshot_bytes": out.snapshot_bytes,
            "actor_audit_s": round(out.audit_seconds, 4),
            # train.minibatches x train.epochs updates per batch; "applied" = the version advanced
            "updates": out.updates, "updates_applied": out.updates_applied, "updates_skipped": out.updates_skipped,
            "micro_batches": out.micro_batches, "loss_last": out.loss_last, "grad_norm_last": out.grad_norm_last,
            "in_bounds_ratio": out.in_bounds_ratio,
            **out.correction, **out.audit,
        }
        if not out.stepped:
            stats["batch_summary"] = tb.summary()
            return stats, None
        t0 = time.perf_counter()
        handle = self.weight_handle()
        stats["weights_publish_s"] = round(time.perf_counter() - t0, 4)  # gather, convert, cast, pack, put
        return stats, handle

    def weights(self) -> Weights | None:
        """HF-named weights (rank 0; the other ranks take part in the TP gather and return None)."""
        if self.rank != 0 and self.actor.settings.layout.tp == 1:
            return None  # no collective to join
        full = self.actor.hf_state_dict()
        return {k: v.numpy() for k, v in full.items()} if self.rank == 0 else None

    def weight_handle(self) -> Any:
        """This version's weights for rollout through ``actor.weightSync``: bucket refs in the object store
        (rank 0; the other ranks join the TP gathers and return None)."""
        from asyncrl.trainer.weightsync.actor_side import publish_actor

        return publish_actor(self.actor, self.spec, rank=self.rank, tp=self.actor.settings.layout.tp)

    def score(self, tokens: np.ndarray, temperature: float) -> np.ndarray:
        """No-grad ``logp_theta`` ``[B, T]`` of right-padded ``tokens`` ``[B, T]`` under the current weights at
        ``temperature`` (the start-up discrepancy probe)."""
        import torch

        return self.actor.logprobs(torch.from_numpy(np.ascontiguousarray(tokens)), temperature=temperature).cpu().numpy()

    def save_checkpoint(self, path: str) -> None:
        """Rank 0 writes the whole state; under data parallelism alone every rank holds the same one."""
        if self.actor.settings.layout.tp > 1:
            raise NotImplementedError(
                f"checkpoints of a tensor-parallel actor (tensorParallel {self.actor.settings.layout.tp}) need "
                "sharded checkpoints, not in this build: run with tensorParallel 1 or checkpoint.everyNSteps 0"
            )
        if self.rank == 0:
            self.actor.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.actor.load_checkpoint(path)
        return int(self.actor.version)

    def close(self) -> None:
        """Release what outlives the process otherwise (snapshot files of a private folder)."""
        self.actor.close()


class ActorGroup:
    """The actor's ranks behind one handle: ``group.method.remote(*args)`` calls ``method`` on every rank
    with the same arguments (SPMD: the ranks meet in their collectives) and returns rank 0's object
    ref(s); ``group.method.options(num_returns=2).remote(...)`` likewise. Arguments go into the object
    store once for all ranks. An error of another rank surfaces at the next call (or :meth:`check`)."""

    def __init__(self, ranks: list[Any]) -> None:
        if not ranks:
            raise ValueError("an actor group needs at least one rank")
        self.ranks = ranks
        self._others: list[Any] = []  # refs of ranks > 0 not yet seen finished

    def __getattr__(self, name: str) -> "_GroupMethod":
        if name.startswith("_"):
            raise AttributeError(name)
        return _GroupMethod(self, name, {})

    def check(self) -> None:
        """Raise the error of any rank > 0 whose call already finished with one."""
        import ray

        if not self._others:
            return
        done, self._others = ray.wait(self._others, num_returns=len(self._others), timeout=0)
        if done:
            ray.get(done)

    def _call(self, name: str, opts: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import ray

        self.check()
        if len(self.ranks) > 1:  # one copy in the object store for every rank
            args = tuple(a if isinstance(a, ray.ObjectRef) else ray.put(a) for a in args)
            kwargs = {k: v if isinstance(v, ray.ObjectRef) else ray.put(v) for k, v in kwargs.items()}
        refs = [getattr(r, name).options(**opts).remote(*args, **kwargs) for r in self.ranks]
        for extra in refs[1:]:
            self._others.extend(extra if isinstance(extra, list) else [extra])
        return refs[0]


@dataclass(frozen=True)
class _GroupMethod:
    group: ActorGroup
    name: str
    opts: dict[str, Any]

    def options(self, **opts: Any) -> "_GroupMethod":
        return _GroupMethod(self.group, self.name, {**self.opts, **opts})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.group._call(self.name, self.opts, args, kwargs)


def _rendezvous_here() -> str:
    from asyncrl.trainer.megatron.parallel import rendezvous

    return rendezvous()


def start_actor_group(spec: AsyncRLJobSpec, actor_cls: Any, opts: dict[str, Any], threads: int,
                      work_dir: str | None, placement: Placement) -> Any:
    """The actor's ``replicas x max(gpusPerReplica, 1)`` ranks, one Ray actor each: rank ``r = i*g + j`` on
    actor pod ``i`` (its ``actor-<i>`` resource, so ranks map to pods deterministically and a TP group
    stays inside a pod); rank 0 picks the TCP rendezvous. One rank: the plain handle, as always."""
    spec_json = spec.model_dump(mode="json", by_alias=True)
    world, per_pod = spec.actor.world_size, max(spec.actor.gpus_per_replica, 1)
    if world == 1:
        return actor_cls.options(**opts, max_concurrency=1).remote(spec_json, threads, work_dir)

    def rank_opts(r: int) -> dict[str, Any]:
        if placement != "cluster":
            return opts
        pod = C.actor_pod_resource(r // per_pod)
        return {**opts, "num_gpus": 1 if spec.actor.gpus_per_replica else 0,
                "resources": {C.RESOURCE_ACTOR: 1, pod: 1}}

    import ray

    # A task on rank 0's pod picks the address (its node, a free port) before any rank starts: every rank's
    # constructor joins the process group, so all must know it up front.
    finder: Any = ray.remote(_rendezvous_here)
    pinned = {k: v for k, v in rank_opts(0).get("resources", {}).items() if k != C.RESOURCE_ACTOR}
    init_method = ray.get(finder.options(num_cpus=0, resources=pinned).remote())
    ranks = [actor_cls.options(**rank_opts(r), max_concurrency=1).remote(spec_json, threads, work_dir, rank=r,
                                                                         init_method=init_method)
             for r in range(world)]
    return ActorGroup(ranks)


@dataclass
class HostHandles:
    """Ray handles of one job's processes, and how to start a replacement rollout worker."""

    actor: Any
    rollout: list[Any]
    pad_id: int
    new_rollout: Callable[[int], Any] | None = None  # worker index -> a started RolloutHost handle
    weights: Any = None  # ref of the sync handle (bucket refs) rollout holds now (a replacement loads it)
    spawn_dedicated: Callable[[int], Any] | None = None  # replica -> a DedicatedScorer handle (dedicated)

    def replace_rollout(self, i: int) -> Any:
        """Start a new rollout worker ``i`` (the old handle is killed if it still answers); wait until up."""
        import ray

        if self.new_rollout is None:
            raise RuntimeError("these hosts cannot start a replacement rollout worker")
        try:
            ray.kill(self.rollout[i])
        except Exception:  # noqa: BLE001 -- already dead
            pass
        worker = self.new_rollout(i)
        ray.get(worker.stats.remote())
        self.rollout[i] = worker
        return worker

    def close(self) -> None:
        """Ask the actor to release its snapshot files (best effort: it may be dead already)."""
        import ray

        try:
            ray.get(self.actor.close.remote(), timeout=30)
        except Exception:  # noqa: BLE001 -- a dead actor has nothing left to close
            pass

    def kill(self) -> None:
        import ray

        ranks = self.actor.ranks if isinstance(self.actor, ActorGroup) else [self.actor]
        for h in [*ranks, *self.rollout]:
            ray.kill(h)


def start_hosts(spec: AsyncRLJobSpec, *, n_procs_cpus: float, actor_threads: int, rollout_threads: int,
                placement: Placement = "local", work_dir: str | None = None) -> HostHandles:
    """Start the actor and ``spec.rollout.replicas`` rollout workers; wait until all are up.

    ``placement="local"``: every process asks for ``n_procs_cpus`` logical CPUs of the one local
    node. ``placement="cluster"``: the processes go where the operator's pods advertise their role
    (``ray start --resources``): each rollout worker takes one ``{"rollout": 1}`` and the actor one
    ``{"actor": 1}``, with no CPU request (the role resource alone places them, one per pod), and the
    GPUs of its pod (``gpusPerReplica``), so that Ray hands the process those devices.
    """
    import ray

    spec_json = spec.model_dump(mode="json", by_alias=True)
    actor_cls: Any = ray.remote(ActorHost)
    rollout_cls: Any = ray.remote(RolloutHost)
    if placement == "cluster":
        # The GPUs the pod holds (ray start --num-gpus): Ray then sets CUDA_VISIBLE_DEVICES for the process.
        actor_opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": spec.actor.gpus_per_replica,
                                      "resources": {C.RESOURCE_ACTOR: 1}}
        rollout_opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": spec.rollout.gpus_per_replica,
                                        "resources": {C.RESOURCE_ROLLOUT: 1}}
    else:
        actor_opts = rollout_opts = {"num_cpus": n_procs_cpus}
    actor = start_actor_group(spec, actor_cls, actor_opts, actor_threads, work_dir, placement)

    def new_rollout(i: int) -> Any:
        return rollout_cls.options(**rollout_opts, max_concurrency=2).remote(spec_json, i, rollout_threads)

    rollout = [new_rollout(i) for i in range(spec.rollout.replicas)]
    pad_id: int = ray.get(actor.pad_id.remote())
    ray.get([w.stats.remote() for w in rollout])  # surfaces construction errors here, not mid-loop
    spawn_dedicated = None
    if spec.correction.reference == "exact" and spec.old_logits.strategy == "dedicated":
        spawn_dedicated = dedicated_spawner(spec, n_procs_cpus=n_procs_cpus, threads=rollout_threads,
                                            placement=placement)
    return HostHandles(actor, rollout, pad_id, new_rollout, spawn_dedicated=spawn_dedicated)


def dedicated_spawner(spec: AsyncRLJobSpec, *, n_procs_cpus: float, threads: int,
                      placement: Placement = "local") -> Callable[[int], Any]:
    """``replica -> handle`` that starts one dedicated old-logit scorer (``oldLogits.strategy: dedicated``)
    as a Ray actor: locally on ``n_procs_cpus`` logical CPUs, in a cluster on a pod advertising the
    ``oldlogits`` role (the operator builds ``oldLogits.dedicated.replicas`` of them) with its GPUs."""
    import ray

    from asyncrl.rollout.envs.binding import task_tokenizer
    from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer
    from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings

    tokenizer = task_tokenizer(spec.model, spec.task)
    settings = ScorerSettings.from_spec(spec, tokenizer.vocab_size, max_sequence_length=_context(spec, tokenizer))
    cls: Any = ray.remote(DedicatedScorer)
    if placement == "cluster":
        opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": spec.actor.gpus_per_replica,
                                "resources": {C.RESOURCE_OLD_LOGITS: 1}}
    else:
        opts = {"num_cpus": n_procs_cpus}

    def spawn(replica: int) -> Any:
        return cls.options(**opts, max_concurrency=1).remote(settings, num_threads=threads)

    return spawn
