"""How a new version's weights reach the rollout workers (and dedicated scorers), in one place.

The driver calls these and nothing else on the weight path: once after the hosts start (:func:`setup`),
at start (:func:`initial`), after every applied step (:func:`to_every_worker`), inside an interrupt-sync
window (:func:`to_workers`), for a replaced worker (:func:`to_replacement`) and for receivers that join
later (:func:`join`, :func:`for_joiner`: the dedicated scorers). ``hosts.weights`` is the sync handle of
the version rollout holds now (the actor's ``weight_handle``: bucket refs, a disk folder, or a
broadcast handle).

Per ``actor.weightSync.transport``:

- ``objectStore``: every receiver pulls the handle's buckets (Ray moves them node to node);
- ``disk``: the actor writes ``<checkpoint.dir>/weight-sync/v<version>/model.safetensors``; every receiver
  reads the folder the handle names. The newest :func:`disk_keep` versions stay: rollout loads the newest
  one while the next is written, a dedicated scorer may trail by ``maxLagVersions``;
- ``broadcast``: the actor's rank 0 and every receiver form one collective group (:class:`Broadcast`,
  gloo, or NCCL when every member has a GPU) once, and it survives the steps. Per version the driver
  starts the actor's send and every receiver's receive *together* (separate Ray calls: the actor runs one
  call at a time, so the send cannot live inside ``train_step``, whose result the driver reads first).
  A receiver that joins late -- a replaced rollout worker, a respawned scorer, the scorers at start --
  gets the current version from the object store (the actor keeps the last version's buckets for it),
  and the group is formed again, with the new member, before the next version. A member that died
  during a send makes the collective fail (its sockets close): the survivors that missed the version get
  it from the object store and the group is re-formed.

Under ``spec.model.lora`` the versions after the first travel as adapters alone: a replacement gets the actor's
frozen base beside the version, through the object store to it alone, whatever the transport
(:func:`to_replacement`, ``weight_sync/lora_base.py``); so does every dedicated scorer when it starts
(:func:`give_base`).
"""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.old_logits_route import OldLogitsRoute
from asyncrl.api.weight_sync import DISK_NEEDS_VOLUME_MESSAGE, WeightTransport
from asyncrl.trainer.driver.hosts.fleet import HostHandles

if TYPE_CHECKING:
    from asyncrl.trainer.weight_sync.broadcast import Backend
    from asyncrl.trainer.weight_sync.outcome import SendOutcome, SyncOutcome

log = logging.getLogger(__name__)

OnEveryWorker = Callable[[Callable[[Any], Any]], list[Any]]  # _Loop.on_every_worker: replaces dead workers
GROUP_TIMEOUT_S = 300.0  # a member that never joins (or answers) fails the group after this long
PING_TIMEOUT_S = 120.0  # receivers answer between calls (a dedicated scorer after its running score)


@dataclass
class Broadcast:
    """The broadcast group as the driver sees it: who is in it, and whether it must be formed again."""

    backend: "Backend"
    extra: list[Any] = field(default_factory=list)  # receivers beside rollout (dedicated scorers)
    members: tuple[Any, ...] = ()  # the receivers of the group as last formed (rank i + 1)
    formed: int = 0  # how many times it was formed (1 = never re-formed)

    def wanted(self, hosts: HostHandles) -> tuple[Any, ...]:
        return (*hosts.rollout, *self.extra)

    def stale(self, hosts: HostHandles) -> bool:
        wanted = self.wanted(hosts)
        return len(wanted) != len(self.members) or any(a is not b for a, b in zip(wanted, self.members, strict=True))

    def form(self, hosts: HostHandles) -> bool:
        """(Re-)form the group: the actor's rank 0 serves the store, every receiver joins (blocking). A member
        found dead first (the loop or the fleet replaces it later) leaves the group unformed: False."""
        import ray

        members = self.wanted(hosts)
        pings = [m.ping_sync.remote() for m in members]
        try:
            ray.get(pings, timeout=PING_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            log.warning("weight sync: a broadcast receiver is gone (%s); this version goes by the object store",
                        type(exc).__name__)
            self.members = ()
            return False
        endpoint = ray.get(hosts.actor.sync_endpoint.remote())  # address and a fresh token, handed out through Ray
        world = 1 + len(members)
        refs = [hosts.actor.open_sync_group.remote(endpoint, world, self.backend, GROUP_TIMEOUT_S)]
        refs += [m.open_sync_group.remote(endpoint, i + 1, world, self.backend, GROUP_TIMEOUT_S)
                 for i, m in enumerate(members)]
        ray.get(refs)
        self.members = members
        self.formed += 1
        if self.formed > 1:
            log.info("weight sync: broadcast group formed again (%d receivers)", len(members))
        return True


def disk_keep(spec: AsyncRLJobSpec) -> int:
    """Versions the disk transport keeps: the newest (rollout loads it) and the one being written, plus what a
    dedicated scorer may still advance to (``maxLagVersions`` behind, and the staleness window W)."""
    keep = 2
    if spec.old_logits_route is OldLogitsRoute.DEDICATED:
        keep += spec.old_logits.dedicated.max_lag_versions + spec.async_.max_staleness
    return keep


def _backend(spec: AsyncRLJobSpec, placement: str) -> "Backend":
    """NCCL when every member holds a GPU (a cluster whose actor and rollout pods have GPUs), else gloo."""
    gpus = spec.actor.gpus_per_replica > 0 and spec.rollout.gpus_per_replica > 0
    return "nccl" if placement == "cluster" and gpus else "gloo"


def setup(hosts: HostHandles, spec: AsyncRLJobSpec, checkpoint_dir: Path, placement: str = "local") -> None:
    """Once, after the hosts started: tell every actor rank where the disk transport writes (and how many
    versions stay) and remember the broadcast group to form. In a cluster, ``disk`` needs the checkpoint
    volume (every pod sees the same folder) and is refused without it."""
    import ray

    transport = spec.actor.weight_sync.transport
    if transport is WeightTransport.DISK and placement == "cluster" and not spec.checkpoint.volume_claim_name:
        raise ValueError(DISK_NEEDS_VOLUME_MESSAGE)
    root = str(checkpoint_dir / "weight-sync") if transport is WeightTransport.DISK else None
    ray.get(hosts.actor.configure_sync.remote(root, disk_keep(spec)))
    hosts.sync = Broadcast(_backend(spec, placement)) if transport is WeightTransport.BROADCAST else None


def broadcasts(hosts: HostHandles) -> bool:
    """Whether the versions travel by broadcast (receivers outside the group need object-store copies)."""
    return _group(hosts) is not None


def _group(hosts: HostHandles) -> Broadcast | None:
    sync = getattr(hosts, "sync", None)
    return sync if isinstance(sync, Broadcast) else None


def _broadcast(hosts: HostHandles, group: Broadcast, version: int,
               to_rollout: Callable[[Callable[[Any], Any]], list[Any]]) -> list["SyncOutcome | None"]:
    """Send ``version`` to the whole group: the actor's send, every scorer's and rollout worker's receive
    started together; a receiver that missed it (the group broke) gets it from the object store."""
    import ray

    from asyncrl.trainer.weight_sync.outcome import SyncFailed

    if group.stale(hosts) and not group.form(hosts):
        hosts.weights = hosts.actor.weights_for_joiner.remote(version)  # the scorers' push reads it too
        return to_rollout(lambda w: w.update_weights.remote(hosts.weights, version))
    send = hosts.actor.send_weights.remote(version)
    scorers = [s.receive_broadcast.remote(version) for s in group.extra]
    outs: list[SyncOutcome | None] = to_rollout(lambda w: w.update_weights.remote(hosts.weights, version))
    sent: SendOutcome = ray.get(send)
    missed = [i for i, o in enumerate(outs) if isinstance(o, SyncFailed)]
    scorer_outs: list[SyncOutcome] = []
    for ref in scorers:
        try:
            scorer_outs.append(ray.get(ref))
        except ray.exceptions.RayActorError as exc:  # the fleet finds it dead on its next call, and respawns it
            scorer_outs.append(SyncFailed(str(exc)))
    scorers_missed = any(isinstance(o, SyncFailed) for o in scorer_outs)
    if isinstance(sent, SyncFailed) or missed or scorers_missed:
        log.warning("weight sync: broadcast of version %d failed (%s); %d rollout worker(s) take it from the "
                    "object store, the group is formed again", version,
                    sent.reason if isinstance(sent, SyncFailed) else "a receiver failed", len(missed))
        group.members = ()  # re-formed before the next version
        if missed:
            handle = hosts.actor.weights_for_joiner.remote(version)
            fixed = ray.get([hosts.rollout[i].update_weights.remote(handle, version) for i in missed])
            for i, o in zip(missed, fixed, strict=True):
                outs[i] = o
        # A scorer that missed it: its push of this version is resolved from the object store instead.
        if scorers_missed:
            hosts.weights = hosts.actor.weights_for_joiner.remote(version)
    return outs


def initial(hosts: HostHandles, version: int) -> None:
    """Publish the actor's current weights and install them on every rollout worker (blocking)."""
    import ray

    hosts.weights = hosts.actor.weight_handle.remote()
    group = _group(hosts)
    if group is not None:
        _broadcast(hosts, group, version, lambda call: ray.get([call(w) for w in hosts.rollout]))
        return
    ray.get([w.update_weights.remote(hosts.weights, version) for w in hosts.rollout])


def to_every_worker(hosts: HostHandles, on_every_worker: OnEveryWorker, weights: Any,
                    version: int) -> list["SyncOutcome | None"]:
    """``version``'s ``weights`` (a step's sync handle, also ``hosts.weights``) to every worker (and, under
    broadcast, every scorer in the group); each worker's ``RolloutHost.update_weights`` outcome (``Delivered``),
    None for a worker found dead and replaced."""
    hosts.weights = weights
    group = _group(hosts)
    if group is not None:
        return _broadcast(hosts, group, version, on_every_worker)
    return on_every_worker(lambda w: w.update_weights.remote(weights, version))


def to_workers(hosts: HostHandles, workers: list[Any], weights: Any, version: int) -> list["SyncOutcome | None"]:
    """``weights`` to exactly ``workers`` (an interrupt-sync window: generation is stopped on all of them)."""
    import ray

    hosts.weights = weights
    group = _group(hosts)
    if group is not None:
        return _broadcast(hosts, group, version, lambda call: ray.get([call(w) for w in workers]))
    return ray.get([w.update_weights.remote(weights, version) for w in workers])


def for_joiner(hosts: HostHandles, version: int) -> Any:
    """A ref of the handle a receiver outside the broadcast group reads ``version`` from: ``hosts.weights``
    (objectStore, disk: anyone can read them), the object-store copy of the actor's kept buckets (broadcast)."""
    if _group(hosts) is None:
        return hosts.weights
    return hosts.actor.weights_for_joiner.remote(version)


def to_replacement(hosts: HostHandles, worker: Any, version: int, *, lora: bool = False) -> "SyncOutcome":
    """The version rollout holds now to a worker that joined late (a replacement): ``hosts.weights``, or under
    broadcast its object-store copy (the group takes the new worker in before the next version). Under
    ``spec.model.lora`` (``lora``) the versions after the first are adapters alone, so the actor's frozen base
    goes with them, through the object store to this worker alone (``weight_sync/lora_base.py``)."""
    import ray

    base = hosts.actor.base_for_joiner.remote() if lora else None
    return ray.get(worker.update_weights.remote(for_joiner(hosts, version), version, base))


def give_base(hosts: HostHandles, receivers: list[Any]) -> int:
    """Under ``spec.model.lora``: the actor's frozen base to receivers that hold none and follow versions that
    travel as adapters alone (the dedicated scorers, at start and when respawned); one object-store copy for
    all of them, freed once they have it. Blocks until each took it (a refused base raises here); the bytes
    each fetched."""
    import ray

    base = hosts.actor.base_for_joiner.remote()
    return max(ray.get([r.set_base.remote(base) for r in receivers]), default=0)


def join(hosts: HostHandles, receivers: list[Any]) -> None:
    """Receivers beside rollout (the dedicated scorers, respawned ones included) that follow every version:
    under broadcast they become members (the group is formed again before the next version)."""
    group = _group(hosts)
    if group is not None:
        group.extra = receivers  # the caller's own list: a respawned scorer in it is seen at the next version
