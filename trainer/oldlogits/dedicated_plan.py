"""The driver's planner for the dedicated old-logit model: what to score, where, and when to advance.

Pure and single-threaded: the driver feeds it what happened (generate calls admitted and returned,
weight versions published, scores returned, trajectories trained or dropped, scorers lost and
replaced) and dispatches what :meth:`DedicatedPlan.next_actions` returns, in order, to the scorers
(:class:`~asyncrl.trainer.oldlogits.dedicated.DedicatedScorer`). Before each train step it asks
:meth:`DedicatedPlan.gate` whether the batch may train.

Invariants (the property test drives random schedules through them):

1. Every sampled token of version ``u`` is scored under version ``u`` -- while ``u`` is resident on
   the scorers -- at most once; every trained token older than the actor's version is scored before
   it trains. The actor scores its own version ``v`` itself (``PrecomputedProvider``), so a token of
   ``v`` needs no score from here; it may get one (scoring is eager: a trajectory returned while the
   scorers hold ``v`` may still train at ``v + 1``), and then the actor's own value is the one used.
2. All replicas hold the same resident version ``d`` (lockstep). ``d -> d'`` only when, for every
   version ``u`` in ``d .. d'-1``, no returned trajectory has unscored tokens of ``u``, no scoring
   request of ``u`` is unanswered, and no in-flight generate call was admitted at ``<= u`` (a call
   admitted at actor version ``a`` returns tokens of versions ``>= a`` only). So no token ever
   arrives for a version already left; should one (a worker that broke the rule), :meth:`returned`
   hands its trajectory back as unscorable, to be dropped and counted, never scored by another
   version.
3. Advancing waits for the *answers* of version ``d``: if a scorer dies, its unanswered requests go
   back to the queue and are re-issued (to a live replica, or to the replacement after it is
   bootstrapped with versions ``d .. latest``), with new request ids; a late answer to an old id is
   ignored. Nothing is lost, nothing scored twice.
4. Ray runs one caller's calls to one (single-threaded) actor in submission order, so a
   ``Push(r, u)`` dispatched before ``Advance(r, u)`` and that before ``ScoreRequest(r, u)`` execute in
   that order; the plan emits them in that order.

Weights: the driver must keep the weights of versions ``resident .. latest`` (a replacement is
bootstrapped with them) and may drop the rest (:attr:`DedicatedPlan.resident`).
"""

import itertools
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.rollout.trajectory import Trajectory, TrajectoryStatus


@dataclass(frozen=True)
class Push:
    """Send the weights of ``version`` to replica ``replica`` (``DedicatedScorer.push_version``)."""

    replica: int
    version: int


@dataclass(frozen=True)
class Advance:
    """Make ``version`` resident on replica ``replica`` (``DedicatedScorer.advance_to``)."""

    replica: int
    version: int


@dataclass(frozen=True)
class Segment:
    """One trajectory's tokens and the positions of its tokens of the request's version."""

    traj_id: str
    tokens: list[int]
    positions: tuple[int, ...]
    routes: Any = None  # [n, L, k] the request version's prefix routes (routing replay R3); None: none captured


@dataclass(frozen=True)
class ScoreRequest:
    """Score ``segments`` under ``version`` on replica ``replica``; answer with :meth:`DedicatedPlan.scored`."""

    request_id: int
    replica: int
    version: int
    segments: tuple[Segment, ...]

    @property
    def tokens(self) -> int:
        return sum(len(s.positions) for s in self.segments)

    def payload(self) -> list[tuple[list[int], list[int], Any]]:
        """``(tokens, positions, routes)`` per segment: the argument of ``DedicatedScorer.score``."""
        return [(s.tokens, list(s.positions), s.routes) for s in self.segments]


Action = Push | Advance | ScoreRequest


@dataclass(frozen=True)
class TrainGate:
    """Whether a batch may train at ``actor_version`` now."""

    wait: bool
    unscored_tokens: int  # trained tokens older than actor_version without their exact old log-prob
    unscored_versions: tuple[int, ...]
    lag: int  # actor_version - resident version
    over_lag: bool  # lag > maxLagVersions

    @property
    def reason(self) -> str:
        parts = []
        if self.unscored_tokens:
            parts.append(f"{self.unscored_tokens} tokens of versions {list(self.unscored_versions)} unscored")
        if self.over_lag:
            parts.append(f"scorers trail the actor by {self.lag} versions")
        return "; ".join(parts)


@dataclass(frozen=True)
class PlanState:
    """Counts for metrics and logs."""

    resident: int
    latest: int
    calls_in_flight: int
    trajectories: int  # returned, not yet trained or dropped
    pending_tokens: int  # waiting for a request
    outstanding_requests: int
    outstanding_tokens: int
    live_replicas: int
    scored_tokens_total: int
    requeued_tokens_total: int  # re-issued after a scorer was lost
    unscorable_trajectories_total: int


@dataclass
class _Replica:
    live: bool = True
    bootstrapped: bool = False
    pushed: int = -1  # newest version pushed


@dataclass
class _Version:
    """Work of one version: unrequested positions per trajectory, unanswered requests."""

    pending: dict[str, list[int]] = field(default_factory=dict)
    requests: set[int] = field(default_factory=set)


class DedicatedPlan:
    """See the module docstring. ``start_version``: the actor's version when the loop starts."""

    def __init__(self, *, replicas: int, max_lag_versions: int, start_version: int) -> None:
        problems = []
        if replicas < 1:
            problems.append(f"oldLogits.dedicated.replicas must be >= 1, got {replicas}")
        if max_lag_versions < 0:
            problems.append(f"oldLogits.dedicated.maxLagVersions must be >= 0, got {max_lag_versions}")
        if start_version < 0:
            problems.append(f"start_version must be >= 0, got {start_version}")
        if problems:
            raise ValueError("DedicatedPlan: " + "; ".join(problems))
        self.max_lag = max_lag_versions
        self._resident = start_version
        self._latest = start_version
        self._replicas = {r: _Replica() for r in range(replicas)}
        self._calls: dict[Hashable, int] = {}  # in-flight generate call -> actor version at admission
        self._trajs: dict[str, Trajectory] = {}
        self._work: dict[int, _Version] = {}
        self._requests: dict[int, ScoreRequest] = {}
        self._ids = itertools.count()
        self._scored_total = self._requeued_total = self._unscorable_total = 0

    # ---------------------------------------------------------------- what the driver tells the plan
    @property
    def resident(self) -> int:
        """The scorers' resident version; the driver may drop the weights of older versions."""
        return self._resident

    @property
    def latest(self) -> int:
        return self._latest

    def admitted(self, call_id: Hashable, version: int) -> None:
        """A generate call was sent at actor version ``version`` (its tokens are of versions >= it)."""
        if call_id in self._calls:
            raise ValueError(f"DedicatedPlan.admitted: call {call_id!r} is already in flight")
        if version < self._resident:
            raise ValueError(
                f"DedicatedPlan.admitted: call {call_id!r} admitted at version {version}, older than the "
                f"scorers' resident version {self._resident}; admit at the actor's current version"
            )
        self._calls[call_id] = version

    def returned(self, call_id: Hashable, trajectories: Sequence[Trajectory]) -> list[str]:
        """A generate call came back (``[]`` if it failed). Its trajectories' unscored tokens are
        queued by version. Returns the ids of trajectories holding an unscored token of a version the
        scorers already left: they can never be scored exactly; drop and count them."""
        if call_id not in self._calls:
            raise KeyError(f"DedicatedPlan.returned: call {call_id!r} was never admitted (or returned twice)")
        del self._calls[call_id]
        unscorable = []
        for t in trajectories:
            if t.status in (TrajectoryStatus.ABORTED, TrajectoryStatus.INTERRUPTED):
                continue  # never trained as an episode
            if t.traj_id in self._trajs:
                raise ValueError(f"DedicatedPlan.returned: trajectory {t.traj_id} returned twice")
            by_version: dict[int, list[int]] = {}
            for i in t.unscored():
                by_version.setdefault(t.versions[i], []).append(i)
            if by_version and min(by_version) < self._resident:
                unscorable.append(t.traj_id)
                continue
            self._trajs[t.traj_id] = t
            for v, positions in by_version.items():
                self._work.setdefault(v, _Version()).pending[t.traj_id] = positions
        self._unscorable_total += len(unscorable)
        return unscorable

    def published(self, version: int) -> None:
        """The actor produced ``version`` (its weights are ready to push)."""
        if version != self._latest + 1:
            raise ValueError(
                f"DedicatedPlan.published: expected version {self._latest + 1} (latest is {self._latest}), "
                f"got {version}"
            )
        self._latest = version

    def scored(self, request_id: int, values: Sequence[Sequence[float]]) -> int:
        """A scorer answered ``request_id`` (values aligned with its segments' positions): the log-probs
        go into the trajectories (``Trajectory.set_logp_old``). An unknown id (re-issued after its
        scorer was declared lost) is ignored. Returns the tokens recorded."""
        request = self._requests.pop(request_id, None)
        if request is None:
            return 0
        self._work[request.version].requests.discard(request_id)
        if len(values) != len(request.segments):
            raise ValueError(
                f"DedicatedPlan.scored: request {request_id} has {len(request.segments)} segments, "
                f"the answer {len(values)}"
            )
        recorded = 0
        for seg, vals in zip(request.segments, values, strict=True):
            bad = [p for p, x in zip(seg.positions, vals, strict=True) if not math.isfinite(x)]
            if len(vals) != len(seg.positions) or bad:
                raise ValueError(
                    f"DedicatedPlan.scored: request {request_id}, trajectory {seg.traj_id}: {len(vals)} values "
                    f"for {len(seg.positions)} positions, non-finite at positions {bad[:5]}"
                )
            traj = self._trajs.get(seg.traj_id)
            if traj is None:
                continue  # trained or dropped meanwhile
            traj.set_logp_old(list(seg.positions), list(vals))
            recorded += len(vals)
        self._scored_total += recorded
        return recorded

    def released(self, traj_ids: Iterable[str]) -> None:
        """Trajectories trained or dropped (stale, aborted groups): nothing more is scored for them."""
        for tid in traj_ids:
            if self._trajs.pop(tid, None) is None:
                continue
            for work in self._work.values():
                work.pending.pop(tid, None)

    def replica_lost(self, replica: int) -> int:
        """Replica ``replica`` died: its unanswered requests go back to the queue (re-issued by the
        next :meth:`next_actions`). Returns the tokens re-queued."""
        self._replica(replica).live = False
        requeued = 0
        for rid in [rid for rid, req in self._requests.items() if req.replica == replica]:
            req = self._requests.pop(rid)
            work = self._work[req.version]
            work.requests.discard(rid)
            for seg in req.segments:
                if seg.traj_id in self._trajs:
                    work.pending.setdefault(seg.traj_id, []).extend(seg.positions)
                    requeued += len(seg.positions)
        self._requeued_total += requeued
        return requeued

    def replica_replaced(self, replica: int) -> None:
        """A fresh scorer now answers for ``replica``: the next actions bootstrap it."""
        self._replicas[replica] = _Replica()

    # ---------------------------------------------------------------- what the plan tells the driver
    def next_actions(self) -> list[Action]:
        """Pushes, advances and scoring requests to dispatch now, in this order."""
        actions: list[Action] = []
        live = [r for r, rep in self._replicas.items() if rep.live]
        for r in live:
            rep = self._replicas[r]
            if not rep.bootstrapped:  # a fresh process: every version still needed, then the resident one
                actions += [Push(r, u) for u in range(self._resident, self._latest + 1)]
                actions.append(Advance(r, self._resident))
                rep.bootstrapped, rep.pushed = True, self._latest
            actions += [Push(r, u) for u in range(rep.pushed + 1, self._latest + 1)]
            rep.pushed = self._latest
        target = self._resident
        while target < self._latest and self._may_leave(target):
            target += 1
        if target > self._resident:
            for u in range(self._resident, target):
                self._work.pop(u, None)
            self._resident = target
            actions += [Advance(r, target) for r in live]
        actions += self._requests_for(self._resident, live)
        return actions

    def gate(self, trajectories: Iterable[Trajectory], actor_version: int) -> TrainGate:
        """May a batch of ``trajectories`` train at ``actor_version``? It waits while a trained token
        older than ``actor_version`` has no exact old log-prob, or the scorers trail by more than
        ``maxLagVersions``. The driver keeps collecting (generate calls, scores) while it waits.

        Raises:
            ValueError: a trajectory with such a token is not one the plan holds (never passed to
                :meth:`returned`, or already released or unscorable): nothing would ever score it.
        """
        unscored, versions, orphans = 0, set(), []
        for t in trajectories:
            old, mine = t.logp_old, 0
            for i, (m, v) in enumerate(zip(t.loss_mask, t.versions, strict=True)):
                if m and v < actor_version and (old is None or math.isnan(old[i])):
                    mine += 1
                    versions.add(v)
            if mine and t.traj_id not in self._trajs:
                orphans.append(t.traj_id)
            unscored += mine
        if orphans:
            raise ValueError(
                f"DedicatedPlan.gate: trajectories {orphans[:5]} (of {len(orphans)}) have unscored tokens older "
                f"than version {actor_version} but the plan does not hold them; pass every returned trajectory "
                "to returned() and drop the unscorable ones it names instead of training them"
            )
        lag = actor_version - self._resident
        over = lag > self.max_lag
        return TrainGate(unscored > 0 or over, unscored, tuple(sorted(versions)), lag, over)

    def state(self) -> PlanState:
        return PlanState(
            resident=self._resident,
            latest=self._latest,
            calls_in_flight=len(self._calls),
            trajectories=len(self._trajs),
            pending_tokens=sum(len(p) for w in self._work.values() for p in w.pending.values()),
            outstanding_requests=len(self._requests),
            outstanding_tokens=sum(r.tokens for r in self._requests.values()),
            live_replicas=sum(rep.live for rep in self._replicas.values()),
            scored_tokens_total=self._scored_total,
            requeued_tokens_total=self._requeued_total,
            unscorable_trajectories_total=self._unscorable_total,
        )

    # ---------------------------------------------------------------- internals
    def _may_leave(self, version: int) -> bool:
        work = self._work.get(version)
        if work is not None and (work.pending or work.requests):
            return False
        return all(admitted > version for admitted in self._calls.values())

    def _requests_for(self, version: int, live: list[int]) -> list[ScoreRequest]:
        work = self._work.get(version)
        if work is None or not work.pending or not live:
            return []
        # Balance by tokens, counting what each replica still has outstanding; longest first.
        load = dict.fromkeys(live, 0)
        for req in self._requests.values():
            if req.replica in load:
                load[req.replica] += req.tokens
        chunks: dict[int, list[Segment]] = {r: [] for r in live}
        items = sorted(work.pending.items(), key=lambda kv: -len(kv[1]))
        for tid, positions in items:
            r = min(live, key=lambda x: (load[x], x))
            traj = self._trajs[tid]
            routes = None if traj.routes is None else traj.routes.for_version(version)
            chunks[r].append(Segment(tid, traj.tokens, tuple(sorted(positions)), routes))
            load[r] += len(positions)
        work.pending.clear()
        out = []
        for r, segs in chunks.items():
            if segs:
                req = ScoreRequest(next(self._ids), r, version, tuple(segs))
                self._requests[req.request_id] = req
                work.requests.add(req.request_id)
                out.append(req)
        return out

    def _replica(self, replica: int) -> _Replica:
        if replica not in self._replicas:
            raise KeyError(f"DedicatedPlan: unknown replica {replica}; replicas are {sorted(self._replicas)}")
        return self._replicas[replica]
