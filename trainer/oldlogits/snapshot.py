"""Exact old logits by weight snapshots (paper §5.1, ``oldLogits.strategy: snapshot``).

The provider keeps a copy of the weights of every version a not-yet-trained token still references
(:meth:`SnapshotProvider.retain`, fed by the driver through ``MegatronActor.train_step(...,
live_versions=...)``; :mod:`.retention` computes that set). ``pi_old`` of each token is then the
training-side forward under *its own* version's weights, so a batch — even one partial trajectory —
that spans several versions gets the true old log-probs token by token, and ``r_d = pi_old / mu_old``
is pure train–inference discrepancy.

Why each rule of the store:

1. A version is recorded right after the update that made it (rollout receives those weights at
   once, so its tokens may come back in the very next batch), and at a scoring if it is not yet
   resident (version 0, or the first step after a resume).
2. ``retain(live)`` releases every version outside ``live`` at once: memory follows the versions
   actually referenced, not a fixed ``W + 1`` (without a live set the newest ``capacity`` stay).
3. ``capacity`` (``oldLogits.snapshot.maxVersions``, 0 = ``W + 1``) is a hard cap: recording
   past it gives up the oldest version. A token of a released or given-up version raises
   :class:`MissingSnapshotError` that says which happened: it is never scored under another version.
4. ``device: disk`` keeps each version as one safetensors file in a work folder and loads it
   (memory-mapped) for each scoring; files are deleted on release and on :meth:`close`.
5. With a sharded actor, one copy per (node, tensor/pipeline shard): the data-parallel replicas of a
   node hold identical shards, so the lowest of them writes the version once and all map that file
   (``device: cpu``: in ``/dev/shm``; :mod:`.node_share` has the rules). Alone (one process, DP=1) the
   store keeps its private copy; under DP/TP every file name says its shard, so ranks never collide.
"""

import os
import shutil
import tempfile
import weakref
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from asyncrl.api.correction import ReferencePolicy
from asyncrl.trainer.oldlogits import node_share, span_plan
from asyncrl.trainer.oldlogits.protocol import PaddedBatch, ResidentVersions, Scorer, VersionBankScorer

SnapshotMedium = Literal["cpu", "disk"]
_GIVEN_UP_MEMORY = 64  # how many released/given-up versions the store remembers for its errors


class MissingSnapshotError(LookupError):
    """A token carries a version whose weights were not kept."""


@dataclass(frozen=True)
class _Mapped:
    """A version held as the node's shared file, mapped (rule 5): ``own`` when this rank wrote it."""

    path: Path
    tensors: dict[str, Tensor]
    nbytes: int
    own: bool


def _tensor_bytes(tensors: Mapping[str, Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class WeightSnapshots:
    """Version -> a copy of the named parameters, in host memory or in safetensors files.

    Under a data-parallel actor the DP replicas of a node keep one copy per version and shard between them
    (rule 5): the placement is agreed at the first write, so every rank must record the same versions in
    the same order (the actor's stages do: SPMD).

    Args:
        capacity: the most versions resident at once (hard cap, >= 1).
        device: ``cpu`` (host memory; shared: a ``/dev/shm`` folder) or ``disk`` (one safetensors file per
            version).
        work_dir: the folder of the ``disk`` files (created if needed; ranks given the same folder on one
            node share its files); None = a private temporary folder, removed on :meth:`close`.
    """

    def __init__(self, capacity: int, *, device: SnapshotMedium = "cpu", work_dir: str | None = None) -> None:
        if capacity < 1:
            raise ValueError(
                f"oldLogits.snapshot.maxVersions resolves to a snapshot capacity of {capacity}; it must be >= 1 "
                "(0 = async.maxStaleness + 1)"
            )
        if device not in ("cpu", "disk"):
            raise ValueError(f"oldLogits.snapshot.device {device!r} is not one of cpu, disk")
        self.capacity = capacity
        self.device: SnapshotMedium = device
        self._work_dir = None if work_dir is None else Path(work_dir)
        self._store: OrderedDict[int, dict[str, Tensor] | Path | _Mapped] = OrderedDict()
        self._given_up: OrderedDict[int, str] = OrderedDict()  # version -> why it is gone
        self._dir: Path | None = None  # the folder of this store's own files (disk, alone)
        self._cleanup: weakref.finalize | None = None
        self._placed = False  # rule 5: decided at the first write (the process group exists by then)
        self._shared: node_share.SharedPlace | None = None
        self._suffix = ""  # of a private file's name: the rank under a group (ranks may share the folder)

    def _place(self) -> None:
        """Where this store's copies live (once, at the first write: a collective under DP, rule 5)."""
        if self._placed:
            return
        self._placed = True
        disk = self.device == "disk"
        root = Path(tempfile.gettempdir()) if disk else node_share.memory_root()
        self._shared = node_share.place(self._work_dir if disk else None, root)
        self._suffix = node_share.private_suffix()
        if self._shared is not None:
            if self._shared.writer and self._shared.owns_folder:
                self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._shared.folder), ignore_errors=True)
        elif disk:
            if self._work_dir is None:
                self._dir = Path(tempfile.mkdtemp(prefix="asyncrl-snapshots-"))
                self._cleanup = weakref.finalize(self, shutil.rmtree, str(self._dir), ignore_errors=True)
            else:
                self._dir = self._work_dir
                self._dir.mkdir(parents=True, exist_ok=True)

    @property
    def folder(self) -> Path | None:
        """The folder of the version files: the node-shared one (rule 5), a disk store's own, or None (memory)."""
        return self._shared.folder if self._shared is not None else self._dir

    @property
    def sharers(self) -> int:
        """DP ranks on this node that share this store's copies (1: a private store)."""
        return self._shared.sharers if self._shared is not None else 1

    # ---------------------------------------------------------------- what is resident
    @property
    def versions(self) -> list[int]:
        """Resident versions, oldest first."""
        return sorted(self._store)

    @property
    def nbytes(self) -> int:
        """Bytes of the versions this rank reads: host memory (``cpu``) or file sizes (``disk``), whether
        its own copy or the node's shared one (:attr:`shared_bytes` of them)."""
        total = 0
        for held in self._store.values():
            if isinstance(held, Path):
                total += held.stat().st_size
            elif isinstance(held, _Mapped):
                total += held.nbytes
            else:
                total += _tensor_bytes(held)
        return total

    @property
    def shared_bytes(self) -> int:
        """Of :attr:`nbytes`, the bytes mapped from a copy another rank of this node wrote (rule 5): the
        node holds ``sum over its ranks of (nbytes - shared_bytes)``."""
        return sum(h.nbytes for h in self._store.values() if isinstance(h, _Mapped) and not h.own)

    def resident(self) -> ResidentVersions:
        return ResidentVersions(versions=len(self._store), nbytes=self.nbytes, shared_bytes=self.shared_bytes)

    def path(self, version: int) -> Path | None:
        """The file of ``version`` (``disk``, or a node-shared copy; None when not resident or in memory)."""
        held = self._store.get(version)
        return held.path if isinstance(held, _Mapped) else held if isinstance(held, Path) else None

    # ---------------------------------------------------------------- record, release, read
    def record(self, version: int, params: Mapping[str, Tensor]) -> None:
        """Keep a copy of ``params`` as ``version`` (no-op when resident); past the capacity the
        oldest versions are given up."""
        if version in self._store:
            return
        self._place()
        if self._shared is not None:
            self._store[version] = self._record_shared(self._shared, version, params)
        elif self._dir is not None:
            self._store[version] = _save(self._dir / f"v{version}{self._suffix}.safetensors", _host_copy(params))
        else:
            self._store[version] = _host_copy(params)
        self._given_up.pop(version, None)
        while len(self._store) > self.capacity:
            oldest = min(self._store)
            self._drop(oldest, f"was given up at the cap of {self.capacity} resident versions "
                               "(oldLogits.snapshot.maxVersions)")

    def _record_shared(self, shared: node_share.SharedPlace, version: int, params: Mapping[str, Tensor]) -> _Mapped:
        """Rule 5: the writer saves the node's copy, the DP group meets, every sharer maps the file."""
        path = shared.file(version)
        if shared.writer:
            _save(path, _host_copy(params))
        shared.barrier()  # every DP rank records the same versions in the same order (SPMD)
        from safetensors.torch import load_file

        tensors = load_file(str(path), device="cpu")  # memory-mapped: the node's pages, not a copy
        nbytes = path.stat().st_size if self.device == "disk" else _tensor_bytes(tensors)
        return _Mapped(path=path, tensors=tensors, nbytes=nbytes, own=shared.writer)

    def retain(self, keep: Collection[int]) -> list[int]:
        """Release every resident version not in ``keep`` (at once); returns the released ones."""
        wanted = set(keep)
        released = [v for v in self.versions if v not in wanted]
        for v in released:
            self._drop(v, "was released: the live versions passed to train_step did not include it")
        return released

    def check(self, versions: Collection[int]) -> None:
        """Raise :class:`MissingSnapshotError` unless every one of ``versions`` is resident."""
        missing = sorted(v for v in versions if v not in self._store)
        if not missing:
            return
        lines = []
        for v in missing:
            why = self._given_up.get(v)
            lines.append(f"version {v} {why}" if why else f"version {v} was never recorded")
        raise MissingSnapshotError(
            f"no weight snapshot of version {missing[0]}; kept: {self.versions}; " + "; ".join(lines) + ". "
            "The driver must pass every version a not-yet-trained token references to "
            "train_step(live_versions=...) and drop the groups holding a version it gives up at the cap "
            "(asyncrl.trainer.oldlogits.retention: live_versions, cap_drop) before training; with no live "
            "set, raise oldLogits.snapshot.maxVersions (0 = async.maxStaleness + 1) or lower async.maxStaleness"
        )

    def get(self, version: int) -> dict[str, Tensor]:
        """The weights of ``version`` (``disk``: loaded memory-mapped from its file)."""
        self.check((version,))
        held = self._store[version]
        if isinstance(held, _Mapped):
            return held.tensors
        if isinstance(held, Path):
            from safetensors.torch import load_file

            return load_file(str(held), device="cpu")
        return held

    def _drop(self, version: int, why: str) -> None:
        held = self._store.pop(version)
        if isinstance(held, Path):
            held.unlink(missing_ok=True)
        elif isinstance(held, _Mapped) and held.own:
            held.path.unlink(missing_ok=True)  # the readers' mappings stay valid until they drop them
        self._given_up[version] = why
        while len(self._given_up) > _GIVEN_UP_MEMORY:
            self._given_up.popitem(last=False)

    def close(self) -> None:
        """Release everything; ``disk``: delete the files (and the private temporary folder)."""
        for v in self.versions:
            self._drop(v, "was released when the store closed")
        if self._cleanup is not None:
            self._cleanup()  # rmtree of the private folder, once

    # ---------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """The resident versions *with their tensors* (``disk`` too): a checkpoint must rebuild
        them even after the files it saw were released by later steps."""
        return {
            "capacity": self.capacity,
            "device": self.device,
            "versions": {v: dict(self.get(v)) for v in self.versions},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Rebuild the resident versions (files again for ``disk``); a smaller capacity keeps the newest."""
        for v in self.versions:
            self._drop(v, "was replaced by a checkpoint's snapshots")
        self._given_up.clear()
        for v, weights in sorted(state["versions"].items()):
            self.record(int(v), weights)


def _host_copy(params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {n: p.detach().to("cpu", copy=True).contiguous() for n, p in params.items()}


def _save(path: Path, tensors: dict[str, Tensor]) -> Path:
    from safetensors.torch import save_file

    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)  # a crash never leaves a half-written version under its name
    return path


def score_exact(store: WeightSnapshots, scorer: Scorer, tokens: Tensor, versions: Tensor, loss_mask: Tensor,
                route_slots: Tensor | None = None, route_slot_versions: Tensor | None = None) -> Tensor:
    """``pi_old`` ``[b, T]`` (fp32): each ``loss_mask`` token's log-prob under its own version (0 elsewhere).

    Args:
        store: holds every version present under ``loss_mask`` (checked before any forward).
        scorer: runs the forwards (:meth:`Scorer.logprobs_under`, the live weights untouched).
        tokens: ``[b, T]`` long; versions: ``[b, T]`` long; loss_mask: ``[b, T]`` bool.
        route_slots, route_slot_versions: ``[b, S, T, L, k]`` and ``[b, S]`` (routing replay): version ``v``'s
            forward replays, per row, the slot of version ``v`` (the prefix routes its tokens were sampled
            through, re-prefills included); None: the routers choose.

    One forward per version, over only the rows that hold it; ``disk`` loads one version at a time. A scorer
    that runs several versions at once (:class:`VersionBankScorer`: LoRA adapters) gets ONE forward instead,
    over one row per (row, version it holds) pair, each under its own version's adapter. Either way a row is cut
    after its version's last token, and rows (pairs) cut to very different lengths run in one forward per
    length group (:mod:`~asyncrl.trainer.oldlogits.span_plan`): a row switched at half its length costs
    1.5 rows, not 2.
    """
    if not (tokens.shape == versions.shape == loss_mask.shape) or tokens.dim() != 2:
        raise ValueError(
            f"tokens {tuple(tokens.shape)}, versions {tuple(versions.shape)} and loss_mask "
            f"{tuple(loss_mask.shape)} must all be [b, T]"
        )
    out = torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    wanted = sorted(int(v) for v in torch.unique(versions[loss_mask]).tolist())
    store.check(wanted)  # a missing version must fail before any forward runs
    if len(wanted) > 1 and isinstance(scorer, VersionBankScorer) and scorer.scores_versions_at_once:
        return _score_in_one_forward(store, scorer, tokens, versions, loss_mask, wanted, out)
    for v in wanted:
        sel = loss_mask & (versions == v)  # [b, T]
        held = sel.any(dim=1).nonzero().squeeze(1)  # only the rows that hold version v
        weights = store.get(v)  # once per version (disk: one load)
        # each row cut after v's last token in it (causal: nothing later counts), rows of similar length together
        for idx, n in span_plan.plan(span_plan.needed_lengths(sel[held]).tolist(), overhead=tokens.shape[1]):
            rows = held[torch.tensor(idx, dtype=torch.long)]
            routes = None if route_slots is None or route_slot_versions is None else \
                slot_of_version(route_slots[rows], route_slot_versions[rows], v)[:, :n]
            logp = scorer.logprobs_under(weights, tokens[rows, :n], routes).float()  # [r, n]
            out[rows, :n] = torch.where(sel[rows, :n], logp.to(out.device), out[rows, :n])
    return out


def slot_of_version(slots: Tensor, slot_versions: Tensor, version: int) -> Tensor:
    """``[r, T, L, k]``: each row's routes of ``version`` from ``slots`` ``[r, S, T, L, k]`` by
    ``slot_versions`` ``[r, S]``; every row must hold it (a row scored under a version it was sampled in)."""
    hit = slot_versions == version  # [r, S]
    if not bool(hit.any(dim=1).all()):
        raise ValueError(f"routing replay: a row scored under version {version} has no routes of it; "
                         f"its slots hold versions {slot_versions.tolist()}")
    return slots[torch.arange(len(slots)), hit.int().argmax(dim=1)]
def _score_in_one_forward(store: WeightSnapshots, scorer: VersionBankScorer, tokens: Tensor, versions: Tensor,
                          loss_mask: Tensor, wanted: list[int], out: Tensor) -> Tensor:
    """:func:`score_exact` over the adapter bank: row ``i`` of ``tokens`` appears once per version it holds, cut
    after that version's last token in it, and the pairs run in the fewest forwards their lengths call for
    (:mod:`~asyncrl.trainer.oldlogits.span_plan`; one forward when they are about equally long)."""
    sels = [loss_mask & (versions == v) for v in wanted]  # [b, T] each
    rows = [sel.any(dim=1).nonzero().squeeze(1) for sel in sels]  # the rows holding each version
    pair_row = torch.cat(rows)
    slot = torch.cat([torch.full((len(r),), k, dtype=torch.long) for k, r in enumerate(rows)])
    pair_sel = torch.cat([sel[r] for sel, r in zip(sels, rows, strict=True)])  # [P, T]
    lengths = span_plan.needed_lengths(pair_sel).tolist()
    bank = [store.get(v) for v in wanted]
    for idx, n in span_plan.plan(lengths, overhead=tokens.shape[1]):
        pick = torch.tensor(idx, dtype=torch.long)
        r = pair_row[pick]
        logp = scorer.logprobs_under_each(bank, tokens[r, :n], slot[pick]).float().to(out.device)  # [p, n]
        # a row may appear twice in a forward (once per version): its pairs select disjoint tokens, so adding
        # each pair's tokens to the zeros there writes every token once, whatever the order
        out[:, :n].index_put_((r,), torch.where(pair_sel[pick, :n], logp, 0.0), accumulate=True)
    return out


class StoreBacked:
    """Retention, residency, cleanup and checkpoint state of an owner of a :class:`WeightSnapshots`
    ``store`` (the snapshot provider, the live audit): all the store's."""

    store: WeightSnapshots

    def retain(self, versions: Collection[int]) -> None:
        self.store.retain(versions)

    def resident(self) -> ResidentVersions:
        return self.store.resident()

    def close(self) -> None:
        self.store.close()

    def state_dict(self) -> dict[str, Any]:
        return {"snapshots": self.store.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.store.load_state_dict(state["snapshots"])


class SnapshotProvider(StoreBacked):
    """``correction.reference: exact`` with ``oldLogits.strategy: snapshot``."""

    reference = ReferencePolicy.EXACT
    extra_forward = True  # one no-grad forward per version present in the batch

    def __init__(self, capacity: int, *, device: SnapshotMedium = "cpu", work_dir: str | None = None) -> None:
        self.store = WeightSnapshots(capacity, device=device, work_dir=work_dir)

    def score(self, batch: PaddedBatch, scorer: Scorer) -> Tensor | None:
        """``pi_old`` ``[B, T]``: each trained token's log-prob under its own version's weights (0
        elsewhere). Only the rows holding a version are scored under it."""
        self.store.record(scorer.version, scorer.named_weights())  # no-op unless not yet resident (rule 1)
        return score_exact(self.store, scorer, batch.tokens, batch.versions, batch.loss_mask,
                           batch.route_slots, batch.route_slot_versions)

    def logp_ref(
        self, batch: PaddedBatch, logp_theta: Tensor, actor_version: int, scored: Tensor | None
    ) -> Tensor:
        if scored is None:
            raise ValueError("exact old logits need the snapshot forwards: call score() before logp_ref()")
        return scored.detach()

    def observe_update(self, batch: PaddedBatch, scorer: Scorer, keep_ratio: float) -> str:
        """Record the new version now: rollout receives these weights with this update (rule 1)."""
        self.store.record(scorer.version, scorer.named_weights())
        return ""

