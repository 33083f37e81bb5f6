"""The dedicated old-logit model (``oldLogits.strategy: dedicated``, paper §5.1).

A separate process (a Ray actor on the pods with resource ``oldlogits``, ``api/constants.py``) with
its own copy of the training-side model code (:class:`~.segment_scorer.SegmentScorer`). It follows
the versions like a rollout replica: the driver pushes every published version, and the
:class:`~.dedicated_plan.DedicatedPlan` decides when the scorer advances and which trajectory
segments it scores under its resident version, overlapped with the actor's training.

Weights of future versions are held lazily when they come as :class:`LazyWeights` (a one-element
list around a Ray ``ObjectRef``: Ray resolves an ``ObjectRef`` passed as a top-level argument, not
one inside a list), so a queued version costs no host memory here until it is advanced to; the
object stays in Ray's object store as long as someone holds the reference (the driver drops its own
reference below the plan's resident version). A plain mapping is held in this process's memory as
given: ``sum(numel * itemsize)`` per queued version, reported by :meth:`DedicatedScorer.state`.
Versions older than the resident one are never needed again and are dropped on each advance.

:class:`~asyncrl.trainer.oldlogits.dedicated_fleet.DedicatedFleet` is the driver's side: it dispatches the
plan's actions to the Ray handles, keeps the weight references the plan may still need, collects the answers and
replaces a scorer whose process died (its unanswered work is re-queued by the plan, so nothing is lost).

A scorer may be a gang (``oldLogits.dedicated.tensorParallel`` > 1): one :class:`DedicatedScorer` per rank, each
built with its :class:`~asyncrl.trainer.megatron.parallel.Layout` (the gang's own TCP rendezvous and process
group, megatron's TP state inside it), every call made on every rank in the same order (the driver's gang
handle, ``trainer/driver/scorer_gang.py``; the driver reads rank 0's answer). Weights by the object store or
disk: every rank reads the version itself and keeps its slice. By broadcast: only the gang's rank 0 is a
member of the weight-sync group (the group's size, and its re-forming when a receiver is replaced, stay per
replica, as for a rollout replica); it hands the version on to its peers over the gang's own group
(:meth:`DedicatedScorer.receive_broadcast`).

Measured (CPU, 1 thread, loaded 2-core host, ``smollm2-135m``): first build 7.2 s (megatron's
process setup and the random init), a rebuild after :meth:`SegmentScorer.free` 3.3-3.9 s, a weight
load 0.15-0.27 s for 513 MiB, one forward of 8 x 128 tokens 8.6 s.
"""

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from asyncrl.rollout.adapter_merge import AdapterMerge, is_hf_adapter_name
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.megatron.parallel import Layout
from asyncrl.trainer.oldlogits.segment_scorer import HfWeights, ScorerSettings, Segment, SegmentScorer

if TYPE_CHECKING:
    import torch

    from asyncrl.trainer.weight_sync.lora_base import BaseRefs
    from asyncrl.trainer.weight_sync.objectstore import BucketRefs
    from asyncrl.trainer.weight_sync.outcome import SyncOutcome

# A version's weights as pushed: a mapping (held here), a one-element list around a Ray ObjectRef
# (fetched on advance), or a zero-argument callable returning the mapping (fetched on advance).
LazyWeights: TypeAlias = list[Any]
PushedWeights: TypeAlias = HfWeights | LazyWeights | Callable[[], HfWeights]


@dataclass(frozen=True)
class DedicatedState:
    """What the scorer reports for metrics (``state()``)."""

    resident_version: int  # NO_VERSION (-1) before the first advance
    queued_versions: tuple[int, ...]  # pushed, not yet advanced to (ascending)
    queued_host_bytes: int  # host memory of queued versions pushed as mappings (lazy ones: 0); a gang: all ranks'
    busy_seconds: float  # total time in advance_to and score
    score_seconds: float
    load_seconds: float  # total time loading weights (conversion + copy, fetch of lazy weights)
    build_seconds: float  # the model build (once per process)
    scored_tokens: int
    score_calls: int
    advances: int
    ranks: int = 1  # the scorer's processes (its gang's tensorParallel)


class DedicatedScorer:
    """One dedicated old-logit scorer, or one rank of a scorer gang (``layout``: its place in the gang's
    tensor-parallel group); the driver starts it as ``ray.remote(DedicatedScorer)``, one process per rank."""

    def __init__(self, settings: ScorerSettings, *, num_threads: int | None = None,
                 layout: Layout | None = None) -> None:
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)
        self.scorer = SegmentScorer(settings, layout)
        self.layout = self.scorer.layout
        if self.layout.world > 1:
            self.scorer.connect()  # the gang's ranks meet now: one that cannot start fails the gang's start
        self._queued: dict[int, PushedWeights] = {}
        self._busy = self._score_s = self._load_s = 0.0
        self._calls = self._advances = 0
        self._group: Any = None  # weight_sync.broadcast.SyncGroup (transport broadcast), formed by the driver
        self._received: dict[int, dict[str, torch.Tensor]] = {}  # versions that arrived by broadcast (host memory)
        # spec.model.lora: the versions are adapters; the base comes once (set_base) and each version is merged
        # onto it when advanced to (rollout/adapter_merge.py), so a queued version costs its adapters alone
        self._merge: AdapterMerge | None = None
        self._base_fingerprint: str | None = None

    # ---------------------------------------------------------------- broadcast (actor.weightSync)
    def ping_sync(self) -> bool:
        """The driver checks every member answers before it forms the broadcast group."""
        return True

    def open_sync_group(self, endpoint: Any, rank: int, world: int, backend: str, timeout_s: float) -> None:
        """Join (again) the weight-sync broadcast group at ``endpoint`` (address and token) as ``rank`` of ``world``
        (the actor is rank 0). In a gang only rank 0 joins; its peers get each version from it inside the gang
        (:meth:`receive_broadcast`)."""
        from asyncrl.trainer.weight_sync.broadcast import open_group

        self._group = None
        if self.layout.rank > 0:
            return
        self._group = open_group(endpoint, rank, world, backend=backend,  # type: ignore[arg-type]
                                 timeout_s=timeout_s)

    def receive_broadcast(self, version: int) -> "SyncOutcome":
        """Take ``version`` off the broadcast group into host memory (used when the plan advances to it; the
        driver pushes its handle as for any transport): ``Delivered``, or ``SyncFailed`` when the group broke."""
        from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion
        from asyncrl.trainer.weight_sync.outcome import Delivered, SyncFailed
        from asyncrl.trainer.weight_sync.transport import receive

        if self.layout.rank > 0:  # a gang peer: rank 0 passes the version on inside the gang
            return self._take_from_gang_rank0(version)
        state: dict[str, torch.Tensor] | None = None
        out: SyncOutcome
        if self._group is None:
            out = SyncFailed("this scorer is in no broadcast group")
        else:
            try:
                got = receive(BroadcastVersion(version), self._group)
            except Exception as exc:  # noqa: BLE001 -- the group broke (a member died): the driver recovers
                self._group = None
                out = SyncFailed(f"{type(exc).__name__}: {exc}")
            else:
                state = {k: v.cpu() for k, v in got.state.items()}
                out = Delivered(transfer_seconds=got.transfer_seconds, nbytes=got.nbytes)
        if self.layout.world > 1:
            from asyncrl.trainer.oldlogits.gang_share import share_from_rank0

            share_from_rank0(state)  # the peers wait for it (None: they fail alike)
        if state is not None and version > self.resident_version:  # older ones are never scored again
            self._received[version] = state
        return out

    def _take_from_gang_rank0(self, version: int) -> "SyncOutcome":
        from asyncrl.trainer.oldlogits.gang_share import share_from_rank0
        from asyncrl.trainer.weight_sync.outcome import Delivered, SyncFailed

        state = share_from_rank0(None)
        if state is None:
            return SyncFailed("the gang's rank 0 did not receive this version")
        if version > self.resident_version:
            self._received[version] = state
        return Delivered(transfer_seconds=0.0, nbytes=sum(t.numel() * t.element_size() for t in state.values()))

    def export_version(self, version: int) -> "BucketRefs | None":
        """A version this scorer received by broadcast (queued or resident), as object-store bucket refs for a
        respawned peer that was not in the group then; None when it does not hold it (and from a gang's peers,
        whose rank 0 answers for the gang)."""
        from asyncrl.trainer.weight_sync.buckets import pack_buckets
        from asyncrl.trainer.weight_sync.transport import ObjectStoreTransport

        state = self._received.get(version)
        if state is None or self.layout.rank > 0:
            return None
        return ObjectStoreTransport().publish(pack_buckets(state.items(), version=version, bucket_bytes=512 * 2**20),
                                              version)

    # ---------------------------------------------------------------- LoRA (spec.model.lora)
    def set_base(self, base: "BaseRefs") -> int:
        """Take the actor's frozen base (a scorer holds none when it starts or is respawned, and the versions it
        advances to travel as adapters alone); each rank of a gang fetches it. Refused when it does not hash to
        its fingerprint or another base is held (``weight_sync/lora_base.py``). Returns the bytes fetched."""
        from asyncrl.trainer.weight_sync.lora_base import fetch_base

        fetched = fetch_base(base, self._base_fingerprint, worker="a dedicated scorer")
        self._merge = self._merge or AdapterMerge()
        self._merge.base = {k: v.clone() for k, v in fetched.items()}  # off the object store's buffers
        self._base_fingerprint = base.fingerprint
        return base.nbytes

    def _merged(self, weights: HfWeights) -> HfWeights:
        """A version delivered as LoRA adapters (with or without the base) -> its full weights on the kept base;
        other versions as they are."""
        if not any(is_hf_adapter_name(k) for k in weights):
            return weights
        import torch

        from asyncrl.trainer.weight_sync.lora_base import complete

        state = {k: v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for k, v in weights.items()}
        done = complete(state, None, self._base_fingerprint, worker="a dedicated scorer",
                        tied=self.scorer.settings.arch.tie_embeddings)
        self._merge = self._merge or AdapterMerge()
        merged = self._merge.resolve(done.state)
        self._base_fingerprint = done.fingerprint
        return merged

    # ---------------------------------------------------------------- versions
    @property
    def resident_version(self) -> int:
        return self.scorer.version

    def push_version(self, weights: PushedWeights, version: int) -> None:
        """Queue ``version`` (not loaded yet). A version at or below the resident one is refused: it
        can never be scored again, and pushing it means the driver lost track of the versions."""
        if version <= self.resident_version:
            raise ValueError(
                f"DedicatedScorer.push_version: version {version} is not newer than the resident version "
                f"{self.resident_version}; push only versions the plan still needs (DedicatedPlan actions)"
            )
        if isinstance(weights, list) and len(weights) != 1:
            raise ValueError(
                f"DedicatedScorer.push_version: lazy weights must be a one-element list around an ObjectRef, "
                f"got a list of {len(weights)}"
            )
        self._queued[version] = weights

    def advance_to(self, version: int) -> float:
        """Make the queued ``version`` resident (skipping any older queued ones, which are dropped);
        returns the seconds it took."""
        if version == self.resident_version:
            return 0.0
        if version not in self._queued:
            raise KeyError(
                f"DedicatedScorer.advance_to: version {version} was never pushed; queued versions "
                f"{sorted(self._queued)}, resident {self.resident_version}"
            )
        t0 = time.perf_counter()
        received = self._received.get(version)  # kept while resident: a respawned peer may need it
        weights = self._merged(received if received is not None else _materialise(self._queued[version]))
        self._queued.pop(version, None)
        self.scorer.load(weights, version)
        del weights
        for v in [v for v in self._queued if v < version]:
            del self._queued[v]
        for v in [v for v in self._received if v < version]:
            del self._received[v]
        seconds = time.perf_counter() - t0
        self._load_s += seconds
        self._busy += seconds
        self._advances += 1
        return seconds

    # ---------------------------------------------------------------- scoring
    def score(
        self, items: Sequence[Segment] | Sequence[Trajectory], version: int
    ) -> list[list[float]] | list[tuple[list[int], list[float]]]:
        """Score under the resident ``version``: ``(tokens, positions)`` segments -> their log-probs
        (aligned with positions); trajectories -> ``(positions, log-probs)`` of their unscored tokens
        of ``version`` (:meth:`SegmentScorer.score`). A version other than the resident one raises."""
        t0 = time.perf_counter()
        try:
            if items and isinstance(items[0], Trajectory):
                trajs = [t for t in items if isinstance(t, Trajectory)]
                return self.scorer.score(trajs, version)
            self._require_version(version)
            return self.scorer.score_segments([s for s in items if not isinstance(s, Trajectory)])
        finally:
            seconds = time.perf_counter() - t0
            self._score_s += seconds
            self._busy += seconds
            self._calls += 1

    def _require_version(self, version: int) -> None:
        if version != self.resident_version:
            raise ValueError(
                f"DedicatedScorer.score: asked for version {version} but version {self.resident_version} is "
                "resident; advance_to(version) first (a token is scored only under its own version)"
            )

    # ---------------------------------------------------------------- metrics
    def state(self) -> DedicatedState:
        """What this scorer holds and did; in a gang (every rank calls it) the host bytes are summed over the
        ranks (each holds what it received), the rest is this rank's, the same on every rank."""
        host_bytes = sum(_host_bytes(w) for w in [*self._queued.values(), *self._received.values()])
        if self.layout.world > 1:
            import torch
            import torch.distributed as dist

            on = "cuda" if dist.get_backend() == "nccl" else "cpu"
            total = torch.tensor([host_bytes], dtype=torch.float64, device=on)
            dist.all_reduce(total)
            host_bytes = int(total.item())
        return DedicatedState(
            resident_version=self.resident_version,
            queued_versions=tuple(sorted(self._queued)),
            queued_host_bytes=host_bytes,
            busy_seconds=self._busy,
            score_seconds=self._score_s,
            load_seconds=self._load_s,
            build_seconds=self.scorer.build_seconds,
            scored_tokens=self.scorer.scored_tokens,
            score_calls=self._calls,
            advances=self._advances,
            ranks=self.layout.world,
        )


def _materialise(weights: PushedWeights) -> HfWeights:
    if isinstance(weights, list):
        import ray

        from asyncrl.trainer.weight_sync.broadcast import BroadcastVersion
        from asyncrl.trainer.weight_sync.transport import receive

        ref: Any = weights[0]  # an ObjectRef of the version's weight-sync handle (or HF weights)
        handle = ray.get(ref)
        if handle is None or isinstance(handle, BroadcastVersion):
            raise RuntimeError(
                "dedicated scorer: a version broadcast before this scorer joined the group is held by no live peer "
                "(a respawn under weightSync.transport broadcast with every scorer lost); use transport objectStore "
                "or more oldLogits.dedicated.replicas")
        return cast(HfWeights, receive(handle).state)
    if callable(weights):
        return weights()
    return weights


def _host_bytes(weights: PushedWeights) -> int:
    if isinstance(weights, Mapping):
        return sum(int(w.nbytes) for w in weights.values())
    return 0  # lazy: in Ray's object store (or wherever the callable reads it from) until advanced to
