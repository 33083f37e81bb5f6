"""The job's processes as Ray actors, started and held together: :class:`HostHandles` and :func:`start_hosts`.

Each host wraps a real component in its own process and caps that process's torch threads, so
that the job's processes share the cores instead of oversubscribing them (each torch process
would otherwise start one thread per core). Tensors cross processes as numpy arrays: Ray
stores them once and readers map them zero-copy (docs/architecture.md, local Ray).

- :class:`~asyncrl.trainer.driver.hosts.rollout_host.RolloutHost`: a rollout worker (threaded: weights arrive
  while it generates);
- :class:`~asyncrl.trainer.driver.hosts.actor_host.ActorHost`: one rank of the actor;
  :class:`~asyncrl.trainer.driver.hosts.actor_group.ActorGroup` holds the ``actor.replicas x
  max(gpusPerReplica, 1)`` ranks behind one handle (every call fans out, the driver reads rank 0; a rank
  that dies or raises ends the whole group within about a second: :class:`ActorRankError`);
- :func:`dedicated_spawner`: the dedicated old-logit scorers.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits_route import OldLogitsRoute
from asyncrl.trainer.driver.hosts.actor_group import (
    ActorGroup,
    ActorRankError,
    Placement,
    start_actor_group,
    start_gang,
)
from asyncrl.trainer.driver.hosts.actor_host import ActorHost
from asyncrl.trainer.driver.hosts.common import task_context
from asyncrl.trainer.driver.hosts.rollout_host import RolloutHost


@dataclass
class HostHandles:
    """Ray handles of one job's processes, and how to start a replacement rollout worker."""

    actor: Any
    rollout: list[Any]
    pad_id: int
    new_rollout: Callable[[int], Any] | None = None  # worker index -> a started RolloutHost handle
    weights: Any = None  # ref of the sync handle rollout holds now (bucket refs, a disk folder, a broadcast version)
    # loop.weight_sync.Broadcast under weightSync.transport: broadcast (loop.weight_sync.setup; the loop above
    # owns the type, so the hosts hold it opaque)
    sync: object = None
    spawn_dedicated: Callable[[int], Any] | None = None  # replica -> a DedicatedScorer handle (dedicated)
    context: int = 0  # the actor's context in tokens: longer trajectories are refused (0: unchecked)

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
        if isinstance(self.actor, ActorGroup):
            self.actor.stop_watching()

    def actor_failure(self, exc: BaseException) -> ActorRankError | None:
        """The actor group's own failure behind ``exc`` (which rank died or raised, where, its error's
        last line), or None when no rank failed (or the actor is one process)."""
        return self.actor.failure_for(exc) if isinstance(self.actor, ActorGroup) else None

    def kill(self) -> None:
        import ray

        if isinstance(self.actor, ActorGroup):
            self.actor.kill()
        else:
            ray.kill(self.actor)
        for h in self.rollout:
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

    from asyncrl.trainer.oldlogits.precision import actor_bf16

    # precision auto resolved once, for the actor's device: the actor, the rollout hosts' interrupt-sync scorer and
    # a dedicated scorer then compute in the actor's dtype whatever device each one sits on.
    megatron = spec.actor.megatron.model_copy(update={"precision": "bf16" if actor_bf16(spec, placement) else "fp32"})
    spec = spec.model_copy(update={"actor": spec.actor.model_copy(update={"megatron": megatron})})
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
    if spec.old_logits_route is OldLogitsRoute.DEDICATED:
        spawn_dedicated = dedicated_spawner(spec, n_procs_cpus=n_procs_cpus, threads=rollout_threads,
                                            placement=placement)
    context: int = ray.get(actor.context_length.remote())
    return HostHandles(actor, rollout, pad_id, new_rollout, spawn_dedicated=spawn_dedicated, context=context)


def dedicated_spawner(spec: AsyncRLJobSpec, *, n_procs_cpus: float, threads: int,
                      placement: Placement = "local") -> Callable[[int], Any]:
    """``replica -> handle`` that starts one dedicated old-logit scorer (``oldLogits.strategy: dedicated``)
    as Ray actors: locally on ``n_procs_cpus`` logical CPUs per rank, in a cluster on a pod advertising the
    ``oldlogits`` role (the operator builds ``oldLogits.dedicated.replicas`` of them) with its GPUs.

    A scorer of ``oldLogits.dedicated.tensorParallel`` k > 1 is a gang of k ranks (one Ray actor each, one
    GPU each on a GPU pod; in a cluster all on scorer pod ``replica``, which advertises
    ``oldlogits-<replica>: k``) behind one :class:`~asyncrl.trainer.driver.hosts.actor_group.ActorGroup`: every call
    fans out, the driver reads rank 0, a rank that dies or raises stops the whole gang."""
    import ray

    from asyncrl.rollout.envs.binding import task_tokenizer
    from asyncrl.trainer.collective.endpoint import bind_host
    from asyncrl.trainer.megatron.parallel import Layout
    from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer
    from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings

    tokenizer = task_tokenizer(spec.model, spec.task)
    settings = ScorerSettings.from_spec(spec, tokenizer.vocab_size, max_sequence_length=task_context(spec, tokenizer))
    layout = spec.old_logits.dedicated.layout_for(spec.actor)
    tp = layout.tensor_parallel
    cls: Any = ray.remote(DedicatedScorer)
    if placement == "cluster" and tp == 1:
        opts: dict[str, Any] = {"num_cpus": 0, "num_gpus": layout.gpus_per_replica,
                                "resources": {C.RESOURCE_OLD_LOGITS: 1}}
    else:
        opts = {"num_cpus": n_procs_cpus}

    def spawn(replica: int) -> Any:
        if tp == 1:
            return cls.options(**opts, max_concurrency=1).remote(settings, num_threads=threads)
        pinned = {C.old_logits_pod_resource(replica): 1.0} if placement == "cluster" else {}
        rank_opts = ({"num_cpus": 0, "num_gpus": 1 if layout.gpus_per_replica else 0, "resources": pinned}
                     if placement == "cluster" else opts)

        def start_rank(r: int, init_method: Any) -> Any:
            lay = Layout(tp=tp, rank=r, world=tp, init_method=init_method)
            return cls.options(**rank_opts, max_concurrency=1).remote(settings, num_threads=threads, layout=lay)

        return start_gang(tp, pinned, start_rank, host=bind_host(placement), role=f"dedicated scorer {replica}",
                          after="the fleet starts a new gang and re-queues its unanswered work")

    return spawn
