"""The pure planner with a multi-rank actor on 2 actor pods: every actor pod is a gang pod like the
driver. Losing any one (failed, vanished, preempted), or both at once, is one gang restart from the
checkpoint; the dead peer seen while restarting is not counted again; the next epoch has every pod."""

import datetime as dt
from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.status import JobStatus
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.lifecycle import VANISHED_SETTLE_SECONDS, Plan, plan
from asyncrl.operator.names import Role
from asyncrl.operator.observed import JobView, Observed, PodView

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(restart_backoff_seconds=10, restart_backoff_max_seconds=300)
SPEC = AsyncRLJobSpec.model_validate({
    "rollout": {"replicas": 2}, "actor": {"replicas": 2, "gpusPerReplica": 4},
    "checkpoint": {"volumeClaimName": "shared"}, "runPolicy": {"backoffLimit": 3},
})
ALL = ["j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0", "j-actor-1"]


def pod(name: str, phase: str = "Running", epoch: int = 0, **kw: Any) -> PodView:
    return PodView(name, Role(name.split("-")[1]), int(name.rsplit("-", 1)[1]), epoch, phase, True,
                   kw.pop("terminating", False), kw.pop("disrupted", False), **kw)


def run(status: dict[str, Any] | JobStatus, pods: list[PodView], now: dt.datetime = T0, **observed: Any) -> Plan:
    # a plan's status comes back as the API server holds it: written, then read again
    job = JobView.read(REF, 1, status.to_status_dict() if isinstance(status, JobStatus) else status)
    d = desired(REF, SPEC, CFG, job.status.epoch)
    return plan(job, SPEC, d, Observed({p.name: p for p in pods}, None, **observed), now, CFG)


def deleted(p: Plan) -> list[str]:
    return sorted(a.name for a in p.actions if a.verb == "delete" and a.kind == "Pod")


def test_both_actor_pods_are_gang_pods() -> None:
    d = desired(REF, SPEC, CFG, 0)
    assert sorted(d.pods) == sorted(ALL)
    assert [n for n, s in d.pods.items() if s.role.gang] == ["j-driver-0", "j-actor-0", "j-actor-1"]


def test_one_failed_actor_pod_restarts_the_whole_gang_once() -> None:
    pods = [pod(n) for n in ALL if n != "j-actor-1"] + [pod("j-actor-1", "Failed", exit_code=1)]
    p = run({"phase": "Running"}, pods)
    assert p.status.phase == "Restarting" and p.status.reason == "PodFailed"
    assert (p.status.restarts, p.counted_restarts, p.status.epoch) == (1, 1, 1)
    assert "j-actor-1 Failed" in p.status.message and "from the last checkpoint" in p.status.message
    assert deleted(p) == sorted(ALL)  # every pod of the gang, the healthy actor pod and the rollout pods too
    # the next reconcile: the surviving actor pod has died too (NCCL timeout) while the old pods go
    later = [pod("j-actor-0", "Failed", exit_code=1, terminating=True), pod("j-driver-0", terminating=True)]
    p = run(p.status, later, now=T0 + dt.timedelta(seconds=1))
    assert p.status.phase == "Restarting" and p.status.restarts == 1 and p.counted_restarts == 0
    # old pods gone, backoff over: the next epoch starts with every pod, both actor pods included
    p = run(p.status, [], now=T0 + dt.timedelta(seconds=60))
    assert p.status.phase == "Initializing" and p.status.restarts == 1
    assert sorted(a.name for a in p.actions if a.verb == "create") == sorted(ALL)


def test_both_actor_pods_failing_together_count_once() -> None:
    pods = [pod(n) for n in ALL if "actor" not in n] + [pod(f"j-actor-{i}", "Failed", exit_code=1) for i in (0, 1)]
    p = run({"phase": "Running"}, pods)
    assert (p.status.restarts, p.counted_restarts) == (1, 1)
    assert "j-actor-0 Failed" in p.status.message and "j-actor-1 Failed" in p.status.message


def test_a_vanished_or_preempted_actor_pod_is_a_gang_loss() -> None:
    rest = [pod(n) for n in ALL if n != "j-actor-1"]
    p = run({"phase": "Running"}, rest, vanished={("j-actor-1", 0): VANISHED_SETTLE_SECONDS})
    assert p.status.restarts == 1 and "j-actor-1 was deleted" in p.status.message
    p = run({"phase": "Running"}, rest + [pod("j-actor-1", terminating=True, disrupted=True)])
    assert (p.status.restarts, p.status.preemptions) == (0, 1) and p.status.reason == "Preempted"
    # a lost rollout pod is still replaced alone, whatever the actor's size
    p = run({"phase": "Running"}, [pod(n) for n in ALL if n != "j-rollout-0"])
    assert [(a.verb, a.name) for a in p.actions] == [("create", "j-rollout-0")] and p.status.phase == "Running"
