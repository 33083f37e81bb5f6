"""The pure planner, without any server: phases, failure policy, deadlines, mask guard, conditions."""

import datetime as dt
from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.status import JobStatus
from asyncrl.api.validation import SpecError, SpecProblem
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.lifecycle import plan, plan_deletion
from asyncrl.operator.names import Role
from asyncrl.operator.observed import JobView, Observed, PodView

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(restart_backoff_seconds=10, restart_backoff_max_seconds=300)


def spec(**sections: Any) -> AsyncRLJobSpec:
    base: dict[str, Any] = {"rollout": {"replicas": 2}, "actor": {"replicas": 1}, "runPolicy": {"backoffLimit": 1}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return AsyncRLJobSpec.model_validate(base)


def pod(name: str, phase: str = "Running", ready: bool = True, epoch: int = 0, disrupted: bool = False) -> PodView:
    role = Role(name.split("-")[1])
    return PodView(name, role, int(name.rsplit("-", 1)[1]), epoch, phase, ready, False, disrupted)


ALL = ["j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0"]


def run(status: dict[str, Any] | JobStatus, pods: list[PodView], s: AsyncRLJobSpec | None = None,
        now: dt.datetime = T0, children: bool = False) -> Any:
    s = s or spec()
    # a plan's status comes back as the API server holds it: written, then read again
    job = JobView.read(REF, 1, status.to_status_dict() if isinstance(status, JobStatus) else status)
    d = desired(REF, s, CFG, job.status.epoch)
    kids = {(c.kind, c.name): c.manifest for c in d.children} if children else None
    return plan(job, s, d, Observed({p.name: p for p in pods}, kids), now, CFG)


def verbs(p: Any) -> list[tuple[str, str, str]]:
    return [(a.verb, a.kind, a.name) for a in p.actions]


def test_new_job_creates_every_child_then_goes_initializing() -> None:
    p = run({}, [], children=False)
    assert sorted(n for v, k, n in verbs(p) if k == "Pod") == sorted(ALL)
    assert p.status.phase == "Initializing" and p.status.start_time == "2026-01-01T12:00:00Z"
    d = desired(REF, spec(), CFG, 0, ray_token="t0k3n")
    p2 = plan(JobView.read(REF, 1, {}), spec(), d, Observed({}, {}), T0, CFG)
    kinds = {"ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding", "Secret", "NetworkPolicy"}
    assert {c.kind for c in d.children} == kinds  # no PodGroup without a gang scheduler
    assert sorted((k, n) for v, k, n in verbs(p2) if k != "Pod") == sorted((c.kind, c.name) for c in d.children)


def test_all_ready_is_running_with_replica_strings() -> None:
    p = run({"phase": "Initializing", "startTime": "2026-01-01T11:59:00Z"}, [pod(n) for n in ALL])
    assert p.status.phase == "Running" and not p.actions
    assert p.status.replicas.rollout == "2/2" and p.status.replicas.actor == "1/1"
    conds = {c.type: c for c in p.status.conditions}
    assert conds["Running"].status == "True" and conds["Running"].observed_generation == 1


def test_lost_rollout_pod_is_replaced_alone_and_not_counted() -> None:
    p = run({"phase": "Running"}, [pod(n) for n in ALL if n != "j-rollout-1"])
    assert verbs(p) == [("create", "Pod", "j-rollout-1")]
    assert p.status.restarts == 0 and p.status.rollout_replacements == 1 and p.status.phase == "Running"
    failed = [pod(n) for n in ALL if n != "j-rollout-0"] + [pod("j-rollout-0", "Failed", False)]
    assert verbs(run({"phase": "Running"}, failed)) == [("delete", "Pod", "j-rollout-0")]


def test_failed_actor_restarts_the_gang_with_backoff_and_counts() -> None:
    pods = [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", "Failed", False)]
    p = run({"phase": "Running", "restarts": 0}, pods)
    assert p.status.phase == "Restarting" and p.status.restarts == 1 and p.status.epoch == 1
    assert sorted(n for v, k, n in verbs(p) if v == "delete") == sorted(ALL)
    assert p.status.restart_after == "2026-01-01T12:00:10Z"  # base backoff 10 s for restart 1
    assert p.requeue_after == 10 and p.counted_restarts == 1
    # restart 2 > backoffLimit 1: Failed, and running pods are deleted
    p2 = run({"phase": "Running", "restarts": 1, "epoch": 1}, [pod(n, epoch=1) for n in ALL if n != "j-driver-0"])
    assert p2.status.phase == "Failed" and p2.status.reason == "BackoffLimitExceeded"
    assert {n for v, k, n in verbs(p2) if v == "delete"} == set(ALL) - {"j-driver-0"}


def test_preemption_is_not_counted() -> None:
    pods = [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", "Failed", False, disrupted=True)]
    p = run({"phase": "Running", "restarts": 1}, pods)
    assert p.status.phase == "Restarting" and p.status.restarts == 1 and p.status.preemptions == 1


def test_restarting_waits_for_old_pods_and_backoff_then_recreates_with_new_epoch() -> None:
    st = {"phase": "Restarting", "epoch": 1, "restartAfter": "2026-01-01T12:00:10Z"}
    assert verbs(run(st, [pod("j-driver-0")])) == [("delete", "Pod", "j-driver-0")]
    waiting = run(st, [])
    assert not waiting.actions and waiting.requeue_after == 10
    p = run(st, [], now=T0 + dt.timedelta(seconds=11))
    assert p.status.phase == "Initializing" and len(p.actions) == 4
    assert {a.body["metadata"]["annotations"]["asyncrl.io/epoch"] for a in p.actions} == {"1"}


def test_terminal_is_terminal_and_ttl_deletes_the_job() -> None:
    s = spec(runPolicy={"ttlSecondsAfterFinished": 60})
    st = {"phase": "Succeeded", "completionTime": "2026-01-01T12:00:00Z"}
    p = run(st, [], s)  # children gone (deleted by hand): nothing is recreated
    assert p.actions == [] and p.status.phase == "Succeeded" and p.requeue_after == 60
    late = run(st, [], s, now=T0 + dt.timedelta(seconds=61))
    assert verbs(late) == [("delete", "AsyncRLJob", "j")]


def test_driver_success_finishes_the_job() -> None:
    pods = [pod(n) for n in ALL if n != "j-driver-0"] + [pod("j-driver-0", "Succeeded", False)]
    p = run({"phase": "Running"}, pods)
    assert p.status.phase == "Succeeded" and p.status.completion_time
    assert {n for v, k, n in verbs(p) if v == "delete"} == set(ALL) - {"j-driver-0"}  # the driver keeps its logs


def test_a_driver_that_exits_0_while_terminating_is_a_preemption_not_success() -> None:
    # SIGTERM (drain, preemption): the driver checkpoints and exits 0; its pod is being deleted
    driver = PodView("j-driver-0", Role.DRIVER, 0, 0, "Succeeded", False, True, True)
    p = run({"phase": "Running"}, [pod(n) for n in ALL if n != "j-driver-0"] + [driver])
    assert p.status.phase == "Restarting" and p.status.preemptions == 1, p.status


def test_deadlines() -> None:
    s = spec(runPolicy={"preRunningDeadlineSeconds": 60, "activeDeadlineSeconds": 3600})
    pending = [pod(n, "Pending", False) for n in ALL]
    st = {"phase": "Initializing", "startTime": "2026-01-01T11:58:00Z", "attemptStartTime": "2026-01-01T11:58:00Z"}
    p = run(st, pending, s)
    assert p.status.phase == "Failed" and p.status.reason == "PreRunningDeadlineExceeded"
    st = {"phase": "Running", "startTime": "2026-01-01T10:00:00Z", "attemptStartTime": "2026-01-01T10:00:00Z"}
    p = run(st, [pod(n) for n in ALL], s)
    assert p.status.reason == "DeadlineExceeded"


def test_suspend_deletes_pods_and_resume_recreates() -> None:
    s = spec(runPolicy={"suspend": True})
    p = run({"phase": "Running", "startTime": "2026-01-01T10:00:00Z"}, [pod(n) for n in ALL], s)
    assert p.status.phase == "Suspended" and sorted(n for _, _, n in verbs(p)) == sorted(ALL)
    p = run({"phase": "Suspended"}, [], spec())
    assert p.status.phase == "Initializing" and len(p.actions) == 4
    assert [e.reason for e in p.events][:1] == ["Resumed"]


def test_invalid_spec_creates_nothing() -> None:
    err = SpecError([SpecProblem("spec.actor", "world size 3 is not a multiple of 2")])
    p = plan(JobView.read(REF, 2, {}), err, None, Observed({}, {}), T0, CFG)
    assert p.actions == [] and p.status.phase == "ValidationFailed"
    assert "spec.actor" in p.status.message
    conds = {c.type: c for c in p.status.conditions}
    assert conds["SpecValid"].status == "False" and conds["SpecValid"].observed_generation == 2


def test_mask_guard_degrades_once_and_acts() -> None:
    training = {"policyVersion": 9, "keepRatio": 0.5}
    s = spec(monitoring={"maskGuard": {"action": "Fail"}})
    p = run({"phase": "Running", "training": training}, [pod(n) for n in ALL], s)
    degraded = {c.type: c for c in p.status.conditions}["Degraded"]
    assert (degraded.status, degraded.reason) == ("True", "MaskCollapse")
    assert p.status.phase == "Failed" and p.status.reason == "MaskCollapse"
    assert [e.reason for e in p.events].count("MaskCollapseDetected") == 1
    s = spec(monitoring={"maskGuard": {"action": "Suspend"}})
    p = run({"phase": "Running", "training": training}, [pod(n) for n in ALL], s)
    assert ("patch", "AsyncRLJob", "j") in verbs(p)
    again = run({"phase": "Running", "training": training, "conditions": p.status.conditions},
                [pod(n) for n in ALL], s)
    assert not [e for e in again.events if e.reason == "MaskCollapseDetected"]  # no repeat events
    warn = run({"phase": "Running", "training": {"policyVersion": 9, "keepRatio": 0.85}}, [pod(n) for n in ALL])
    assert {c.type: c for c in warn.status.conditions}["Degraded"].reason == "MaskDegrading"


def test_a_malformed_training_report_is_degraded_unknown_and_decides_nothing() -> None:
    s = spec(monitoring={"maskGuard": {"action": "Fail"}})
    bad = {"policyVersion": -1, "keepRatio": 0.1}  # 0.1 < criticalKeepRatio: the job would fail, were it read
    p = run({"phase": "Running", "training": bad}, [pod(n) for n in ALL], s)
    degraded = {c.type: c for c in p.status.conditions}["Degraded"]
    assert (degraded.status, degraded.reason) == ("Unknown", "BadTrainingReport")
    assert degraded.message.startswith("status.training is malformed: 1 validation error for TrainingSummary\n"
                                       "policyVersion\n  Input should be greater than or equal to 0")
    assert p.status.phase == "Running" and p.events == [] and p.actions == []


def test_a_condition_key_this_version_does_not_know_keeps_the_condition() -> None:
    first = run({"phase": "Initializing"}, [pod(n) for n in ALL])
    written = first.status.to_status_dict()
    written["conditions"] = [{**c, "futureKey": 1} for c in written["conditions"]]  # a newer operator's copy
    later = run(written, [pod(n) for n in ALL], now=T0 + dt.timedelta(minutes=5))
    assert {c.type: c.last_transition_time for c in later.status.conditions}["Running"] == "2026-01-01T12:00:00Z"


def test_condition_transition_time_is_kept_when_status_does_not_change() -> None:
    first = run({"phase": "Initializing"}, [pod(n) for n in ALL])
    later = run(first.status, [pod(n) for n in ALL], now=T0 + dt.timedelta(minutes=5))
    t = {c.type: c.last_transition_time for c in later.status.conditions}
    assert t["Running"] == "2026-01-01T12:00:00Z"


def test_deletion_plan_times_out() -> None:
    obs = Observed({"j-driver-0": pod("j-driver-0")})
    d = plan_deletion(obs, deleting_for=1, timeout=30)
    assert not d.done and [a.name for a in d.actions] == ["j-driver-0"]
    d = plan_deletion(obs, deleting_for=31, timeout=30)
    assert d.done and d.timed_out and d.actions[0].body == {"gracePeriodSeconds": 0}
    assert plan_deletion(Observed({}), 0, 30).done
