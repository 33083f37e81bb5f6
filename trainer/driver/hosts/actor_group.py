"""The actor's ranks as one handle, how they start, and how the group fails as one.

:class:`ActorGroup` holds the ``actor.replicas x max(gpusPerReplica, 1)`` ranks
(:class:`~asyncrl.trainer.driver.hosts.actor_host.ActorHost` Ray actors): every call fans out SPMD, the driver
reads rank 0. :func:`start_actor_group` places rank ``r`` on actor pod ``r // gpusPerReplica`` and
hands every rank the rendezvous (address and token) rank 0's pod picked.

Failure. The ranks meet in collectives, so one rank that dies (its process killed, its pod lost) or
raises leaves the others blocked in the next all-reduce until the process group's timeout
(``parallel.Layout.collective_timeout_s``). The group therefore watches every rank's calls, not only
rank 0's (a thread of the driver, one ``ray.wait`` over the calls in flight every ``poll_s``): the
first call of any rank that ends in an error ends the group -- every rank is killed (no process is
left in a collective) and :class:`ActorRankError` names the rank, its host (the pod in a cluster),
its process and the error's last line. Which rank: a killed local process closes its sockets and gloo
fails its peers' collective at once, often before Ray reports the death, so a raise is blamed only
after a short look for a rank whose process ended (its pid gone on this host, or Ray saying so within
``grace_s``); a rank lost with its node closes nothing and the peers would wait out the timeout. The driver sees it at its next wait on the group and fails
the attempt; the whole gang then restarts from the last complete checkpoint (in a cluster the
operator restarts every pod; locally :mod:`.gang_restart` reruns the job in the same run directory),
counted once against ``runPolicy.backoffLimit``.
"""

import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec

log = logging.getLogger(__name__)

Placement = Literal["local", "cluster"]  # where start_hosts puts the processes (see start_hosts)


@dataclass(frozen=True)
class RankInfo:
    """Where a rank runs: its host name (the pod's in a cluster) and its process id."""

    host: str
    pid: int

    def __str__(self) -> str:
        return f"host {self.host}, pid {self.pid}"


def _rank_info(_actor: Any) -> RankInfo:  # runs inside the rank (``__ray_call__``)
    return RankInfo(socket.gethostname(), os.getpid())


ACTOR_AFTER = "the gang restarts from its last complete checkpoint"  # what follows an actor group's failure


class ActorRankError(RuntimeError):
    """A rank of the actor group died or raised; every rank of the group has been killed.

    ``rank``, ``where`` (host and pid), ``method`` (the call that failed), ``cause`` (the last line of the
    rank's exception, or how its process ended) and ``died`` (True: the process is gone, False: it raised).
    """

    def __init__(self, rank: int, where: RankInfo | None, method: str, cause: str, died: bool, *,
                 role: str = "actor", after: str = ACTOR_AFTER) -> None:
        self.rank, self.where, self.method, self.cause, self.died = rank, where, method, cause, died
        at = f" ({where})" if where is not None else ""
        self.line = f"{role} rank {rank}{at} {'died' if died else 'raised'} in {method}: {cause}"
        super().__init__(f"{self.line}; every rank of the {role} group was stopped ({after})")


class _ProcessGone(Exception):
    """A rank's process seen ended on this host before Ray reported it."""


_RankError = tuple[int, str, bool, BaseException]  # (rank, method, its process died, the error its call holds)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (a zombie has ended: only its parent has not reaped it)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()  # noqa: SIM115 -- one read
    except OSError:
        try:
            os.kill(pid, 0)  # no /proc (not Linux): signal 0 only asks whether it exists
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _last_line(exc: BaseException) -> tuple[str, bool]:
    """(the rank's error in one line, whether its process died) for an error a rank's ref holds."""
    import ray

    if isinstance(exc, ray.exceptions.RayActorError):  # the process is gone (killed, crashed, its node lost)
        text = str(getattr(exc, "error_msg", "") or exc).strip()
        first = text.splitlines()[0] if text else ""
        return f"{type(exc).__name__}: {first[:300]}", True
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):  # RayTaskError: the exception raised in the rank
        lines = str(cause).strip().splitlines()
        return f"{type(cause).__name__}: {lines[-1] if lines else ''}".rstrip(": "), False
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}".rstrip(": "), False


class ActorGroup:
    """The actor's ranks behind one handle: ``group.method.remote(*args)`` calls ``method`` on every rank
    with the same arguments (SPMD: the ranks meet in their collectives) and returns rank 0's object
    ref(s); ``group.method.options(num_returns=2).remote(...)`` likewise. Arguments go into the object
    store once for all ranks.

    Every rank's calls are watched (see the module docstring): the first error of any rank kills every
    rank and is kept as :attr:`failure` (an :class:`ActorRankError`), raised by :meth:`check` and by
    the next call; :meth:`failure_for` maps the error the driver got from rank 0's ref (often just
    "killed") to it.
    """

    def __init__(self, ranks: list[Any], where: list[RankInfo] | None = None, *, poll_s: float = 0.5,
                 grace_s: float = 3.0, role: str = "actor", after: str = ACTOR_AFTER) -> None:
        if not ranks:
            raise ValueError("an actor group needs at least one rank")
        self.role, self.after = role, after  # how its failure is said (a dedicated scorer gang reuses the group)
        if where is not None and len(where) != len(ranks):
            raise ValueError(f"{len(where)} rank locations for {len(ranks)} ranks")
        self.ranks = ranks
        self.where = where
        self.poll_s = poll_s  # how often the watcher looks (a failure is seen this long after it at most)
        self.grace_s = grace_s  # after a first raise, how long to look for a dead rank behind it
        self.failure: ActorRankError | None = None
        self.failed_at: float | None = None  # time.monotonic() when the failure was seen
        self._watched: dict[Any, tuple[int, str]] = {}  # ref -> (rank, method) of calls not yet seen finished
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._judging = threading.Event()  # an error was seen: _root_cause is looking for the rank to blame
        self._verdict = threading.Event()  # self.failure is set
        self._thread: threading.Thread | None = None

    def __getattr__(self, name: str) -> "_GroupMethod":
        if name.startswith("_"):
            raise AttributeError(name)
        return _GroupMethod(self, name, {})

    def check(self) -> None:
        """Raise the group's failure if a rank has already failed (a call of any rank ended in an error)."""
        if self.failure is None:
            self._scan(timeout=0)
        if self.failure is not None:
            raise self.failure

    def failure_for(self, exc: BaseException, wait_s: float = 2.0) -> ActorRankError | None:
        """The group's failure behind ``exc`` (an error the driver met while the group ran), or None when
        no rank failed. Waits up to ``wait_s`` for the calls in flight to show it (the driver may see rank
        0's error before the watcher does)."""
        if isinstance(exc, ActorRankError):
            return exc
        if self.failure is None:
            try:
                self._scan(timeout=wait_s)
            except Exception:  # noqa: BLE001 -- Ray already down: what the watcher saw is all there is
                pass
        if self.failure is None and self._judging.is_set():  # the watcher is deciding whom to blame
            self._verdict.wait(self.grace_s + 5.0)
        return self.failure

    def stop_watching(self) -> None:
        """End the watcher thread (the group is being torn down)."""
        self._closed.set()

    def kill(self) -> None:
        """Kill every rank (no restart by Ray: the driver restarts the whole gang)."""
        import ray

        self.stop_watching()
        for r in self.ranks:
            try:
                ray.kill(r, no_restart=True)
            except Exception:  # noqa: BLE001 -- already gone
                pass

    # --------------------------------------------------------------------------------- watching
    def _call(self, name: str, opts: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        import ray

        self.check()
        if len(self.ranks) > 1:  # one copy in the object store for every rank
            args = tuple(a if isinstance(a, ray.ObjectRef) else ray.put(a) for a in args)
            kwargs = {k: v if isinstance(v, ray.ObjectRef) else ray.put(v) for k, v in kwargs.items()}
        refs = [getattr(r, name).options(**opts).remote(*args, **kwargs) for r in self.ranks]
        with self._lock:
            for rank, out in enumerate(refs):
                for ref in out if isinstance(out, list) else [out]:
                    self._watched[ref] = (rank, name)
        self._start_watcher()
        return refs[0]

    def _start_watcher(self) -> None:
        if self._thread is None and len(self.ranks) > 1:
            self._thread = threading.Thread(target=self._watch, name="actor-group-watch", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        import ray

        while not self._closed.is_set() and self.failure is None:
            try:
                if not ray.is_initialized():
                    return
                self._scan(timeout=self.poll_s)
            except Exception:  # noqa: BLE001 -- Ray shut down under the thread: nothing left to watch
                if not ray.is_initialized():
                    return
                log.debug("actor group watcher", exc_info=True)
                self._closed.wait(self.poll_s)  # a transient Ray error: no busy loop
            if not self._watched:
                self._closed.wait(self.poll_s)

    def _scan(self, timeout: float) -> None:
        """Look at the watched calls that finished (waiting up to ``timeout`` for a first one); the first
        error ends the group (:meth:`_fail`)."""
        import ray

        with self._lock:
            refs = list(self._watched)
        if not refs:
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=False)
        if not ready:
            return
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        errors = self._errors(ready)
        if errors:
            self._judging.set()
            try:
                blamed = self._root_cause(errors)
            except Exception:  # noqa: BLE001 -- Ray going down meanwhile: blame what was seen
                blamed = min(errors, key=lambda e: (not e[2], e[0]))
            self._fail(*blamed)

    def _root_cause(self, errors: list["_RankError"]) -> "_RankError":
        """The rank to blame among the first errors seen. A killed rank often makes its peers' collective fail
        before Ray reports the death (gloo sees the socket close at once): wait up to ``grace_s`` for a rank
        whose process died -- its ref saying so, or, for ranks on this host, its pid gone -- and name it."""
        import ray

        # every rank on this host: a dead one shows at once in /proc, a short look is enough
        here = self.where is not None and all(w.host == socket.gethostname() for w in self.where)
        deadline = time.monotonic() + (min(0.5, self.grace_s) if here else self.grace_s)
        while not any(e[2] for e in errors):
            dead = self._dead_here()
            if dead:  # its ref may say why a moment later; if not, its pid is gone: that is the cause
                with self._lock:
                    theirs = [ref for ref, (r, _) in self._watched.items() if r == dead[0]]
                if theirs:
                    ready, _ = ray.wait(theirs, num_returns=1, timeout=min(2.0, self.grace_s), fetch_local=False)
                    errors += self._errors(ready)
                if not any(e[2] for e in errors):
                    gone = _ProcessGone(f"its process {self.where[dead[0]].pid if self.where else '?'} has ended")
                    errors.append((dead[0], errors[0][1], True, gone))
                break
            with self._lock:
                rest = list(self._watched)
            left = deadline - time.monotonic()
            if not rest or left <= 0:
                break
            ready, _ = ray.wait(rest, num_returns=1, timeout=min(0.2, left), fetch_local=False)
            errors += self._errors(ready)
        return min(errors, key=lambda e: (not e[2], e[0]))

    def _dead_here(self) -> list[int]:
        """Ranks on this host whose process has ended (pid gone or a zombie)."""
        if self.where is None:
            return []
        here = socket.gethostname()
        return [r for r, w in enumerate(self.where) if w.host == here and not _alive(w.pid)]

    def _errors(self, refs: list[Any]) -> list["_RankError"]:
        """(rank, method, died, error) of those of ``refs`` (finished, watched) that hold an error."""
        import ray

        out: list[_RankError] = []
        for ref in refs:
            with self._lock:
                seen = self._watched.pop(ref, None)
            if seen is None:
                continue
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 -- a rank's failure, whatever it is
                out.append((seen[0], seen[1], isinstance(exc, ray.exceptions.RayActorError), exc))
        return out

    def _fail(self, rank: int, method: str, died: bool, exc: BaseException) -> None:
        with self._lock:
            if self.failure is not None:
                return
            cause = str(exc) if isinstance(exc, _ProcessGone) else _last_line(exc)[0]
            self.failure = ActorRankError(rank, self.where[rank] if self.where else None, method, cause, died,
                                          role=self.role, after=self.after)
            self.failed_at = time.monotonic()
            self._watched.clear()
            self._verdict.set()
        log.error("%s", self.failure)
        self.kill()  # the other ranks would wait in their next collective until its timeout


@dataclass(frozen=True)
class _GroupMethod:
    group: ActorGroup
    name: str
    opts: dict[str, Any]

    def options(self, **opts: Any) -> "_GroupMethod":
        return _GroupMethod(self.group, self.name, {**self.opts, **opts})

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.group._call(self.name, self.opts, args, kwargs)


def _rendezvous_here(host: str | None) -> Any:
    """The gang's rendezvous (an ``Endpoint``: address and token) on ``host`` of this node (None: Ray's address)."""
    from asyncrl.trainer.megatron.parallel import rendezvous

    return rendezvous(host)


def start_actor_group(spec: AsyncRLJobSpec, actor_cls: Any, opts: dict[str, Any], threads: int,
                      work_dir: str | None, placement: Placement) -> Any:
    """The actor's ``replicas x max(gpusPerReplica, 1)`` ranks, one Ray actor each: rank ``r = i*g + j`` on
    actor pod ``i`` (its ``actor-<i>`` resource, so ranks map to pods deterministically and a TP group
    stays inside a pod); rank 0 picks the rendezvous (an authenticated store: address and token). One rank: the
    plain handle, as always. The stores (the rendezvous, the broadcast group's) bind loopback in a local run."""
    from asyncrl.trainer.collective.endpoint import bind_host

    spec_json = spec.model_dump(mode="json", by_alias=True)
    world, per_pod = spec.actor.world_size, max(spec.actor.gpus_per_replica, 1)
    host = bind_host(placement)
    if world == 1:
        return actor_cls.options(**opts, max_concurrency=1).remote(spec_json, threads, work_dir, collective_host=host)

    def rank_opts(r: int) -> dict[str, Any]:
        if placement != "cluster":
            return opts
        pod = C.actor_pod_resource(r // per_pod)
        return {**opts, "num_gpus": 1 if spec.actor.gpus_per_replica else 0,
                "resources": {C.RESOURCE_ACTOR: 1, pod: 1}}

    pinned = {k: v for k, v in rank_opts(0).get("resources", {}).items() if k != C.RESOURCE_ACTOR}

    def start_rank(r: int, init_method: Any) -> Any:
        return actor_cls.options(**rank_opts(r), max_concurrency=1).remote(spec_json, threads, work_dir, rank=r,
                                                                           init_method=init_method,
                                                                           collective_host=host)

    return start_gang(world, pinned, start_rank, host=host)


def start_gang(world: int, pinned: dict[str, float], start_rank: Any, *, role: str = "actor",
               after: str = ACTOR_AFTER, host: str | None = None) -> ActorGroup:
    """Start ``world`` ranks as one :class:`ActorGroup` (the actor's, a dedicated scorer gang's): a task on rank
    0's node (the Ray resources ``pinned``) picks the rendezvous on ``host`` (``endpoint.bind_host``: loopback in
    a local run; None: the node's address) with the gang's token, ``start_rank(r, init_method)`` starts rank
    ``r``'s Ray actor; returns when every rank's constructor ran (a rank that fails to start kills the others and
    raises :class:`ActorRankError` here, not after their rendezvous timeout)."""
    import ray

    # Before any rank starts: every rank's constructor joins the process group, so all must know it up front.
    finder: Any = ray.remote(_rendezvous_here)
    init_method = ray.get(finder.options(num_cpus=0, resources=pinned).remote(host))
    ranks = [start_rank(r, init_method) for r in range(world)]
    infos = [r.__ray_call__.remote(_rank_info) for r in ranks]  # every rank's host and pid
    pending = list(infos)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready[0])
        except Exception as exc:
            for r in ranks:
                ray.kill(r, no_restart=True)
            cause, died = _last_line(exc)
            raise ActorRankError(infos.index(ready[0]), None, "start", cause, died, role=role, after=after) from exc
    return ActorGroup(ranks, ray.get(infos), role=role, after=after)
