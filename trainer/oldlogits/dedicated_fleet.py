"""The driver's side of the dedicated old-logit scorers (``oldLogits.strategy: dedicated``, paper §5.1).

:class:`DedicatedFleet` dispatches a :class:`~.dedicated_plan.DedicatedPlan`'s actions to the scorers
(:class:`~.dedicated.DedicatedScorer` as Ray actors, or a scorer gang's handle), keeps the weight references the
plan may still need, collects the answers and replaces a scorer whose process died (its unanswered work is
re-queued by the plan, so nothing is lost).
"""

from collections.abc import Callable, Sequence
from typing import Any


class DedicatedFleet:
    """Driver side: dispatches a :class:`~.dedicated_plan.DedicatedPlan`'s actions to the scorers as Ray
    actors, keeps the weight references the plan may still need, collects the answers and replaces a
    scorer that died.

    Args:
        plan: the planner (its ``resident`` decides which weight references are kept).
        handles: ``ray.remote(DedicatedScorer)`` handles, replica ``i`` at index ``i``; a scorer gang's handle
            (the driver's ``ActorGroup`` over its ranks: ``.method.remote`` on every rank, rank 0's ref back)
            has the same surface, plus ``failure_for(exc)`` and ``kill()``.
        respawn: builds a fresh handle for replica ``i`` after its process (a rank of its gang) died.

    A gang fails as one: a rank that dies or raises gets every rank killed within about a second (the gang
    handle watches all ranks' calls), so rank 0's call ends in an error and the gang is replaced like a dead
    process. A gang whose ranks *raised* is replaced at most ``MAX_RAISED_REPLACEMENTS`` times: a deterministic
    error would otherwise restart it forever; past that the error is raised (a bug, not a fault).
    """

    MAX_RAISED_REPLACEMENTS = 3

    def __init__(self, plan: Any, handles: Sequence[Any], respawn: Callable[[int], Any]) -> None:
        self.plan = plan
        self.handles = list(handles)
        self.respawn = respawn
        self.weights: dict[int, Any] = {}  # version -> ObjectRef of its HF weights (numpy)
        # weightSync.transport broadcast: the versions live only in the scorers; a respawned one gets the
        # versions it needs from a live peer (DedicatedScorer.export_version) through the object store.
        self.copies_from_peers = False
        self._pending: dict[Any, tuple[int, int | None]] = {}  # ref -> (replica, request id or None)
        self.replaced = 0
        self.raised_replacements = 0  # of self.replaced: gangs replaced because a rank raised

    def publish(self, version: int, weights_ref: Any) -> None:
        """The actor produced ``version`` (``weights_ref``: the ObjectRef the rollout workers get too)."""
        self.weights[version] = weights_ref
        self.plan.published(version)
        self.dispatch()

    def dispatch(self) -> None:
        """Send the plan's next actions; drop the weight references below the resident version."""
        from asyncrl.trainer.oldlogits.dedicated_plan import Advance, Push

        lost: set[int] = set()  # replicas replaced during this dispatch: their remaining actions are stale
        for action in self.plan.next_actions():
            if action.replica in lost:
                continue  # its work was re-queued by replica_lost; the fresh one is bootstrapped below
            h = self.handles[action.replica]
            try:
                if isinstance(action, Push):
                    # Wrapped in a list: Ray resolves a top-level ObjectRef argument, not one inside a list,
                    # so the scorer fetches these weights only when it advances to them.
                    ref = h.push_version.remote([self.weights[action.version]], action.version)
                    self._pending[ref] = (action.replica, None)
                elif isinstance(action, Advance):
                    self._pending[h.advance_to.remote(action.version)] = (action.replica, None)
                else:
                    ref = h.score.remote(action.payload(), action.version)
                    self._pending[ref] = (action.replica, action.request_id)
            except Exception as exc:  # a gang found failed when called (a rank died while it was idle)
                if not self._gang_failed(action.replica, exc):
                    raise
                self._replace(action.replica)
                lost.add(action.replica)
        for v in [v for v in self.weights if v < self.plan.resident]:
            del self.weights[v]
        if lost:
            self.dispatch()  # bootstrap the fresh gangs

    def refs(self) -> list[Any]:
        """The calls in flight (``ray.wait`` on them beside the generate calls and the train step)."""
        return list(self._pending)

    def collect(self, ref: Any) -> None:
        """One call finished: record its scores, or, if its scorer died, re-queue the scorer's work and
        replace it (a scorer's own error, e.g. a bad version, is re-raised: that is a bug, not a fault)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        if ref not in self._pending:
            return  # a call to a scorer already replaced: its work was re-queued then
        replica, request_id = self._pending.pop(ref)
        try:
            result = ray.get(ref)
        except Exception as exc:
            # A gang's failure (counted as a raise when a rank raised); a dead process; else a scorer's own error.
            if not self._gang_failed(replica, exc) and not isinstance(exc, (RayActorError, ActorUnavailableError)):
                raise
            self._replace(replica)
        else:
            if request_id is not None:
                self.plan.scored(request_id, result)
        self.dispatch()

    def _gang_failed(self, replica: int, exc: BaseException) -> bool:
        """Whether ``exc`` (from a call to ``replica``) is its gang's failure (a rank died or raised: every rank
        is stopped) that replacing the gang repairs; a gang that keeps raising is a bug (see the class doc)."""
        failure_for = getattr(self.handles[replica], "failure_for", None)
        failure = failure_for(exc) if failure_for is not None else None
        if failure is None:
            return False
        if not getattr(failure, "died", True):
            if self.raised_replacements >= self.MAX_RAISED_REPLACEMENTS:
                raise RuntimeError(f"dedicated scorer {replica}: its gang failed by a raise again after "
                                   f"{self.raised_replacements} replacements; not replacing it any more") from failure
            self.raised_replacements += 1
        return True

    def _replace(self, replica: int) -> None:
        import ray

        for ref in [r for r, (rep, _) in self._pending.items() if rep == replica]:
            del self._pending[ref]  # calls to the dead process: their work is re-queued below
        self.plan.replica_lost(replica)
        old = self.handles[replica]
        try:
            if hasattr(old, "_actor_id"):  # one process: a Ray actor handle
                ray.kill(old)
            else:  # a gang: every rank
                old.kill()
        except Exception:  # noqa: BLE001 -- already gone
            pass
        self.handles[replica] = self.respawn(replica)
        if self.copies_from_peers:
            peers = [h for r, h in enumerate(self.handles) if r != replica]
            for v in [v for v in self.weights if v >= self.plan.resident]:
                if peers:
                    self.weights[v] = peers[0].export_version.remote(v)
        self.plan.replica_replaced(replica)
        self.replaced += 1
