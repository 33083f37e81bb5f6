"""The actor's ranks as one handle, and how they start.

:class:`ActorGroup` holds the ``actor.replicas x max(gpusPerReplica, 1)`` ranks
(:class:`~asyncrl.trainer.driver.hosts.ActorHost` Ray actors): every call fans out SPMD, the driver
reads rank 0. :func:`start_actor_group` places rank ``r`` on actor pod ``r // gpusPerReplica`` and
hands every rank the TCP rendezvous rank 0's pod picked.
"""

from dataclasses import dataclass
from typing import Any, Literal

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec

Placement = Literal["local", "cluster"]  # where start_hosts puts the processes (see start_hosts)


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
