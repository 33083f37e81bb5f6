"""The planner and the driver's interrupt-sync phase: ``status.syncPhase``, the ``SyncStuck`` condition,
its one Warning event, the operator's counter of stuck phases, and the requeue that finds a hung phase."""

import datetime as dt
from typing import Any

from prometheus_client import CollectorRegistry

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.status import Condition, SyncPhase
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.lifecycle import Plan, plan
from asyncrl.operator.metrics import create_metrics
from asyncrl.operator.names import Role
from asyncrl.operator.observed import JobView, Observed, PodView

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings()
ALL = ["j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0"]


def interrupt_sync(timeout: int = 300) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate({
        "rollout": {"replicas": 2}, "actor": {"replicas": 1}, "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "interruptSync", "interruptSync": {"phaseTimeoutSeconds": timeout}},
    })


def pods() -> dict[str, PodView]:
    return {n: PodView(n, Role(n.split("-")[1]), int(n[-1]), 0, "Running", True, False, False) for n in ALL}


def reconcile(status: dict[str, Any], now: dt.datetime, spec: AsyncRLJobSpec) -> Plan:
    return plan(JobView.read(REF, 1, status), spec, desired(REF, spec, CFG, 0), Observed(pods(), None), now, CFG)


def training(phase: str, since: str, reported: str = "2026-01-01T11:58:00Z") -> dict[str, Any]:
    return {"policyVersion": 3, "syncPhase": phase, "syncPhaseSince": since, "reportedAt": reported}


def cond(p: Plan, ctype: str = "SyncStuck") -> Condition:
    return next(c for c in p.status.conditions if c.type == ctype)


def test_phase_names_are_the_driver_metric_labels_capitalised() -> None:
    assert [p.value for p in SyncPhase] == ["Idle", "Interrupt", "Score", "Update", "Resume"]
    assert [p.metric_label for p in SyncPhase] == ["idle", "interrupt", "score", "update", "resume"]


def test_a_phase_within_its_timeout_is_surfaced_and_requeued_for_the_moment_it_would_time_out() -> None:
    # Score began 11:59:00, timeout 300 s, now 12:00:00: 60 s in, 240 s left (+1 s margin)
    p = reconcile({"phase": "Running", "training": training("Score", "2026-01-01T11:59:00Z")}, T0, interrupt_sync())
    assert p.status.sync_phase.to_status_dict() == {"phase": "Score", "since": "2026-01-01T11:59:00Z",
                                                    "timedOut": False}
    assert cond(p).status == "False" and not p.events and p.sync_stuck == 0
    assert p.requeue_after == 241.0


def test_a_phase_past_its_timeout_sets_sync_stuck_once_with_one_event_and_one_count() -> None:
    reg = CollectorRegistry()
    metrics = create_metrics(reg)
    metrics.observe_phase("ns", "j", "Running")
    labels = {"namespace": "ns", "asyncrljob": "j"}
    assert reg.get_sample_value("asyncrl_operator_sync_stuck_total", labels) == 0  # pre-set for a new job

    # Score began 11:50:00, now 12:00:00: 600 s > phaseTimeoutSeconds 300
    tr = training("Score", "2026-01-01T11:50:00Z")
    p = reconcile({"phase": "Running", "training": tr}, T0, interrupt_sync())
    stuck = cond(p)
    assert (stuck.status, stuck.reason) == ("True", "SyncPhaseTimeout")
    assert stuck.message == ("interrupt-sync phase Score running since 2026-01-01T11:50:00Z: 600 s > "
                             "phaseTimeoutSeconds 300")
    assert stuck.last_transition_time == "2026-01-01T12:00:00Z"
    assert [(e.type, e.reason, e.message) for e in p.events] == [("Warning", "SyncPhaseTimeout", stuck.message)]
    assert p.status.sync_phase.timed_out is True and p.sync_stuck == 1
    metrics.sync_phases_stuck("ns", "j", p.sync_stuck)

    later = T0 + dt.timedelta(minutes=2)  # the same phase still hangs: no new event, no new count, same words
    again = reconcile({**p.status.to_status_dict(), "training": tr}, later, interrupt_sync())
    assert not again.events and again.sync_stuck == 0
    assert cond(again) == stuck
    metrics.sync_phases_stuck("ns", "j", again.sync_stuck)
    assert reg.get_sample_value("asyncrl_operator_sync_stuck_total", labels) == 1

    # the driver moves on: SyncStuck goes False at once, syncPhase shows the new phase
    moved = reconcile({**again.status.to_status_dict(), "training": training("Update", "2026-01-01T12:02:00Z")},
                      later + dt.timedelta(seconds=5), interrupt_sync())
    assert cond(moved).status == "False" and cond(moved).last_transition_time == "2026-01-01T12:02:05Z"
    assert moved.status.sync_phase.to_status_dict() == {"phase": "Update", "since": "2026-01-01T12:02:00Z",
                                                        "timedOut": False}
    assert not moved.events

    metrics.forget("ns", "j")
    assert reg.get_sample_value("asyncrl_operator_sync_stuck_total", labels) is None


def test_the_same_phase_stuck_again_in_a_later_update_counts_again() -> None:
    first = reconcile({"phase": "Running", "training": training("Score", "2026-01-01T11:50:00Z")}, T0,
                      interrupt_sync())
    assert first.sync_stuck == 1
    # a later update's Score phase (new since) hangs too: a new stuck phase
    later = T0 + dt.timedelta(hours=1)
    second = reconcile({**first.status.to_status_dict(),
                        "training": training("Score", "2026-01-01T12:50:00Z", reported="2026-01-01T12:50:01Z")},
                       later, interrupt_sync())
    assert second.sync_stuck == 1 and [e.reason for e in second.events] == ["SyncPhaseTimeout"]


def test_idle_never_times_out_and_the_timeout_is_the_jobs_own() -> None:
    idle = reconcile({"phase": "Running", "training": training("Idle", "2026-01-01T10:00:00Z")}, T0,
                     interrupt_sync())
    assert cond(idle).status == "False" and not idle.events and idle.requeue_after is None
    # 90 s in Interrupt: fine under the default 300 s, stuck under phaseTimeoutSeconds 60
    tr = training("Interrupt", "2026-01-01T11:58:30Z")
    assert cond(reconcile({"phase": "Running", "training": tr}, T0, interrupt_sync())).status == "False"
    assert cond(reconcile({"phase": "Running", "training": tr}, T0, interrupt_sync(60))).status == "True"


def test_a_dead_drivers_last_phase_is_not_stuck_after_a_restart() -> None:
    # status.training still holds the phase the driver of the previous attempt reported before it died
    tr = training("Score", "2026-01-01T11:00:00Z", reported="2026-01-01T11:00:30Z")
    p = reconcile({"phase": "Running", "attemptStartTime": "2026-01-01T11:50:00Z", "training": tr}, T0,
                  interrupt_sync())
    assert cond(p).status == "False" and not p.events and p.sync_stuck == 0
    # nor while the gang restarts
    restarting = reconcile({"phase": "Initializing", "training": training("Score", "2026-01-01T11:00:00Z")}, T0,
                           interrupt_sync())
    assert cond(restarting).status == "False" and restarting.sync_stuck == 0
