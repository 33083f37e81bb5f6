"""The status boundary: ``read_status`` (a mapping in, a typed ``JobStatus`` out, what it left out named)
and ``JobStatus.to_status_dict`` (the one serialisation) undo each other on what the operator writes."""

from asyncrl.api.status import (
    OPERATOR_FIELDS,
    Condition,
    JobStatus,
    Phase,
    ReplicaCounts,
    SyncPhase,
    SyncPhaseStatus,
    read_status,
)

T = "2026-01-01T12:00:00Z"
WRITTEN = {  # a status as the operator writes it (every kind of field once)
    "phase": "Running", "reason": "PodsReady", "message": "all pods are running and ready", "observedGeneration": 3,
    "conditions": [{"type": "Running", "status": "True", "reason": "PodsReady", "message": "", "lastTransitionTime": T,
                    "observedGeneration": 3}],
    "replicas": {"rollout": "2/2", "actor": "1/1", "rolloutReady": 2, "rolloutDesired": 2, "actorReady": 1,
                 "actorDesired": 1, "driverReady": True},
    "restarts": 1, "preemptions": 2, "rolloutReplacements": 3, "epoch": 4, "startTime": T, "attemptStartTime": T,
    "restartAfter": T, "disruptedPods": ["j-actor-0@4"], "syncPhase": {"phase": "Score", "since": T, "timedOut": True},
    "agentEndpoint": "http://j-agent.ns.svc:8100/v1",
}


def test_the_operator_fields_are_every_field_but_the_drivers_training() -> None:
    aliases = [f.alias for f in JobStatus.model_fields.values()]
    assert sorted(OPERATOR_FIELDS) == sorted(a for a in aliases if a != "training") and len(set(OPERATOR_FIELDS)) == 17


def test_what_the_operator_writes_reads_back_typed_and_writes_out_the_same() -> None:
    status, unreadable = read_status(WRITTEN)
    assert unreadable == {}
    assert (status.phase, status.epoch, status.restarts) == (Phase.RUNNING, 4, 1)
    assert status.conditions == [Condition(type="Running", status="True", reason="PodsReady", last_transition_time=T,
                                           observed_generation=3)]
    assert status.replicas == ReplicaCounts(rollout="2/2", actor="1/1", rollout_ready=2, rollout_desired=2,
                                            actor_ready=1, actor_desired=1, driver_ready=True)
    assert status.sync_phase == SyncPhaseStatus(phase=SyncPhase.SCORE, since=T, timed_out=True)
    assert status.to_status_dict() == WRITTEN


def test_absent_is_absent_on_the_way_out_empty_lists_included() -> None:
    # defaults the operator always writes (the counters) are written; None and empty lists are no field
    assert JobStatus().to_status_dict() == {"restarts": 0, "preemptions": 0, "rolloutReplacements": 0, "epoch": 0}
    status, _ = read_status({**WRITTEN, "disruptedPods": []})
    assert "disruptedPods" not in status.to_status_dict() and status.disrupted_pods == []


def test_keys_no_model_knows_are_dropped_at_any_depth() -> None:
    # The CRD prunes unknown fields: only a copy written by another operator version can hold one.
    raw = {**WRITTEN, "futureField": {"x": 1},
           "conditions": [{**WRITTEN["conditions"][0], "futureKey": "y"}],
           "syncPhase": {**WRITTEN["syncPhase"], "futureKey": 0}}
    status, unreadable = read_status(raw)
    assert unreadable == {} and status.to_status_dict() == WRITTEN


def test_an_unreadable_operator_field_is_left_out_and_named() -> None:
    raw = {**WRITTEN, "phase": "Exploded", "restarts": -1}
    status, unreadable = read_status(raw)
    assert status.phase is None and status.restarts == 0  # as if absent: the planner reads no phase as Pending
    assert sorted(unreadable) == ["phase", "restarts"]
    assert unreadable["restarts"] == "restarts: Input should be greater than or equal to 0"
    assert status.to_status_dict() == {k: v for k, v in WRITTEN.items() if k != "phase"} | {"restarts": 0}


def test_the_drivers_training_is_read_strictly_and_a_malformed_one_named() -> None:
    status, unreadable = read_status({"training": {"policyVersion": 7, "keepRatio": 0.5}})
    assert unreadable == {} and status.training is not None and status.training.keep_percent == 50.0
    status, unreadable = read_status({"training": {"policyVersion": 7, "extra": 1}})  # no tolerance: a bad report
    assert status.training is None and list(unreadable) == ["training"]
    assert "extra\n  Extra inputs are not permitted" in unreadable["training"]
    status, unreadable = read_status({"training": {}})  # an empty report is no report
    assert status.training is None and unreadable == {}
