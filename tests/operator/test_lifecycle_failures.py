"""Failure semantics of the pure planner (issue 7): per-attempt deadlines, preemption seen late,
refused creates, waiting reasons, old pods before new ones, spec edits, bad-spec exits, foreign owners.

No server: the pod manifests are written as a kubelet and a scheduler would report them.
"""

import datetime as dt
from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.status import Condition, JobStatus, read_status
from asyncrl.operator.builders import Desired, JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.lifecycle import (
    VANISHED_SETTLE_SECONDS,
    CreateFailure,
    Plan,
    fold_create_failures,
    plan,
)
from asyncrl.operator.names import Role
from asyncrl.operator.observed import JobView, Observed, PodView, observe_pods

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(restart_backoff_seconds=10, restart_backoff_max_seconds=300)
ALL = ["j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0"]


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def stamp(seconds: float) -> str:
    return at(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def spec(**sections: Any) -> AsyncRLJobSpec:
    base: dict[str, Any] = {"rollout": {"replicas": 2}, "actor": {"replicas": 1}, "runPolicy": {"backoffLimit": 1}}
    for k, v in sections.items():
        base.setdefault(k, {}).update(v)
    return AsyncRLJobSpec.model_validate(base)


def pod(name: str, phase: str = "Running", ready: bool = True, epoch: int = 0, **kw: Any) -> PodView:
    return PodView(name, Role(name.split("-")[1]), int(name.rsplit("-", 1)[1]), epoch, phase, ready,
                   kw.pop("terminating", False), kw.pop("disrupted", False), **kw)


def run(status: dict[str, Any] | JobStatus, pods: list[PodView], s: AsyncRLJobSpec | None = None,
        now: dt.datetime = T0, children: dict[tuple[str, str], dict[str, Any]] | None = None, generation: int = 1,
        **observed: Any) -> Plan:
    s = s or spec()
    # a plan's status comes back as the API server holds it: written, then read again
    job = JobView.read(REF, generation, status.to_status_dict() if isinstance(status, JobStatus) else status)
    d = desired(REF, s, CFG, job.status.epoch)
    return plan(job, s, d, Observed({p.name: p for p in pods}, children, **observed), now, CFG)


def verbs(p: Plan) -> list[tuple[str, str, str]]:
    return [(a.verb, a.kind, a.name) for a in p.actions]


def cond(p: Plan | JobStatus, ctype: str) -> Condition:
    status = p.status if isinstance(p, Plan) else p
    return next(c for c in status.conditions if c.type == ctype)


def own_children(d: Desired) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c.kind, c.name): c.manifest for c in d.children}


def pod_manifest(name: str, uid: str = "uid-1", **status: Any) -> dict[str, Any]:
    role = name.split("-")[1]
    return {"metadata": {"name": name, "uid": f"pod-{name}", "labels": {"asyncrl.io/job": "j", "asyncrl.io/role": role},
                         "annotations": {"asyncrl.io/epoch": "0"},
                         "ownerReferences": [{"kind": "AsyncRLJob", "name": "j", "uid": uid}]},
            "status": {"phase": "Pending", **status}}


# ---------------------------------------------------------------- 1. pre-running deadline per attempt

def test_pre_running_deadline_is_per_attempt_and_restarting_does_not_count() -> None:
    s = spec(runPolicy={"preRunningDeadlineSeconds": 60, "backoffLimit": 3})
    # Attempt 1 started an hour ago and trained; a restart is waiting out its backoff.
    restarting = {"phase": "Restarting", "epoch": 1, "startTime": stamp(-3600), "attemptStartTime": stamp(-3600),
                  "restartAfter": stamp(10)}
    p = run(restarting, [], s)
    assert p.status.phase == "Restarting" and not p.actions and p.requeue_after == 10
    p = run(restarting, [], s, now=at(11))  # backoff over: attempt 2 starts its own clock
    assert p.status.phase == "Initializing" and p.status.attempt_start_time == stamp(11)
    assert p.status.start_time == stamp(-3600)  # activeDeadlineSeconds still counts from the start
    assert p.requeue_after == 60
    # Attempt 2 at 59 s is not late; at 61 s it is, and the message says what the pods wait for.
    pending = [pod(n, "Pending", False, epoch=1) for n in ALL]
    assert run(p.status, pending, s, now=at(11 + 59)).status.phase == "Initializing"
    stuck = [pod("j-actor-0", "Pending", False, epoch=1, waiting_reason="ImagePullBackOff",
                 waiting_message="back-off pulling image")] + pending[:3]
    late = run(p.status, stuck, s, now=at(11 + 61))
    assert late.status.phase == "Failed" and late.status.reason == "PreRunningDeadlineExceeded"
    assert "waiting: ImagePullBackOff: j-actor-0 (back-off pulling image)" in late.status.message


def test_resume_with_an_old_attempt_time_starts_instead_of_failing() -> None:
    s = spec(runPolicy={"preRunningDeadlineSeconds": 60})
    p = run({"phase": "Suspended", "attemptStartTime": stamp(-7200)}, [], s)
    assert p.status.phase == "Initializing" and len(p.actions) == 4
    assert p.status.attempt_start_time == stamp(0)


# ---------------------------------------------------------------- 2. preemption, also when terminating or gone

def test_disrupted_terminating_pod_counts_as_preempted_at_once() -> None:
    pods = [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", terminating=True, disrupted=True)]
    p = run({"phase": "Running", "restarts": 1}, pods)
    assert p.status.phase == "Restarting" and p.status.reason == "Preempted"
    assert (p.status.restarts, p.status.preemptions, p.preemptions, p.counted_restarts) == (1, 1, 1, 0)
    assert "j-actor-0 terminating (preempted)" in p.status.message
    # the terminating pod is not deleted again; the others go
    assert sorted(n for v, k, n in verbs(p) if v == "delete") == sorted(set(ALL) - {"j-actor-0"})


def test_disrupted_but_still_running_pod_is_left_alone() -> None:
    pods = [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", disrupted=True)]
    p = run({"phase": "Running"}, pods)
    assert p.status.phase == "Running" and not p.actions


def test_vanished_pod_seen_disrupted_before_is_a_preemption() -> None:
    pods = [pod(n) for n in ALL if n != "j-driver-0"]
    p = run({"phase": "Running"}, pods, disrupted=frozenset({("j-driver-0", 0)}))
    assert p.status.preemptions == 1 and p.status.restarts == 0
    assert "j-driver-0 was preempted and is gone" in p.status.message
    # a disruption of the same name in an earlier epoch does not excuse a loss now
    p = run({"phase": "Running", "epoch": 1}, [pod(n, epoch=1) for n in ALL if n != "j-driver-0"],
            disrupted=frozenset({("j-driver-0", 0)}))
    assert p.status.preemptions == 0 and p.status.restarts == 1


def test_a_pod_that_just_vanished_waits_for_its_deleted_event_then_counts() -> None:
    """A list ahead of the pod's DELETED event: no verdict for VANISHED_SETTLE_SECONDS (requeued for
    the moment it ends); the event's disruption then makes it a preemption, its absence a failure."""
    pods = [pod(n) for n in ALL if n != "j-driver-0"]
    p = run({"phase": "Running"}, pods, vanished={("j-driver-0", 0): 1.0})
    assert p.status.phase == "Running" and p.status.restarts == 0 and not p.actions
    assert p.requeue_after == VANISHED_SETTLE_SECONDS - 1.0
    p = run({"phase": "Running"}, pods, vanished={("j-driver-0", 0): 1.0}, disrupted=frozenset({("j-driver-0", 0)}))
    assert p.status.preemptions == 1 and p.status.restarts == 0
    p = run({"phase": "Running"}, pods, vanished={("j-driver-0", 0): VANISHED_SETTLE_SECONDS})
    assert p.status.restarts == 1 and p.status.preemptions == 0
    # never listed by this operator (e.g. it restarted meanwhile): judged at once, as before
    assert run({"phase": "Running"}, pods).status.restarts == 1
    # a vanished rollout pod is replaced alone at once: nothing to tell apart
    p = run({"phase": "Running"}, [pod(n) for n in ALL if n != "j-rollout-1"], vanished={("j-rollout-1", 0): 0.5})
    assert ("create", "Pod", "j-rollout-1") in verbs(p)


def test_a_disruption_is_written_to_status_until_the_gang_moves_on() -> None:
    # Running; the scheduler marks the actor for preemption: nothing to do yet, but it is written down
    p = run({"phase": "Running"}, [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", disrupted=True)])
    assert p.status.phase == "Running" and p.status.disrupted_pods == ["j-actor-0@0"]
    # the actor is gone: a preemption; the gang restart moves to epoch 1 and drops the old epoch's entry
    p = run(p.status, [pod(n) for n in ALL if n != "j-actor-0"], disrupted=frozenset({("j-actor-0", 0)}))
    assert p.status.preemptions == 1 and p.status.restarts == 0
    assert "disruptedPods" not in p.status.to_status_dict()


def test_preemption_limit_fails_the_job() -> None:
    s = spec(runPolicy={"preemptionLimit": 2, "backoffLimit": 0})
    pods = [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", "Failed", False, disrupted=True)]
    p = run({"phase": "Running", "preemptions": 1}, pods, s)
    assert p.status.phase == "Restarting" and p.status.preemptions == 2
    p = run({"phase": "Running", "preemptions": 2}, pods, s)
    assert p.status.phase == "Failed" and p.status.reason == "PreemptionLimitExceeded"
    assert "preemptionLimit=2" in p.status.message and p.status.preemptions == 2


# ---------------------------------------------------------------- 3. refused creates

def test_refused_create_is_a_condition_retried_with_backoff_never_a_lost_pod() -> None:
    first = run({}, [])
    assert len([a for a in first.actions if a.kind == "Pod"]) == 4
    quota = 'pods "j-actor-0" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=3, limited: pods=3'
    p = fold_create_failures(JobStatus(), first, [CreateFailure("Pod", "j-actor-0", 403, quota)], T0, CFG)
    failed = cond(p, "FailedCreate")
    assert (failed.status, failed.reason) == ("True", "FailedCreate") and quota in failed.message
    assert p.status.phase == "Initializing" and p.status.restart_after == stamp(10)  # base backoff 10 s
    assert p.requeue_after == 10
    assert [(e.type, e.reason) for e in p.events if quota in e.message] == [("Warning", "FailedCreate")]

    three = [pod(n, "Pending", False) for n in ALL if n != "j-actor-0"]
    waiting = run(p.status, three, now=at(5))  # within the backoff: nothing created, nothing counted
    assert waiting.actions == [] and waiting.status.phase == "Initializing" and waiting.status.restarts == 0
    assert cond(waiting, "FailedCreate").status == "True" and waiting.requeue_after == 5

    retry = run(waiting.status, three, now=at(11))
    assert verbs(retry) == [("create", "Pod", "j-actor-0")] and retry.status.restarts == 0
    again = fold_create_failures(waiting.status, retry, [CreateFailure("Pod", "j-actor-0", 403, quota)], at(11), CFG)
    # failing for 11 s already: wait as long again (the waits double without a counter)
    assert again.status.restart_after == stamp(22)
    assert cond(again, "FailedCreate").last_transition_time == stamp(0)

    done = run(again.status, three, now=at(22))
    assert verbs(done) == [("create", "Pod", "j-actor-0")]
    assert cond(done, "FailedCreate").status == "False" and "restartAfter" not in done.status.to_status_dict()


def test_backoff_is_capped() -> None:
    prev, _ = read_status({"conditions": [{"type": "FailedCreate", "status": "True", "reason": "FailedCreate",
                                           "lastTransitionTime": stamp(-3600)}]})
    p = fold_create_failures(prev, run({}, []), [CreateFailure("Pod", "j-driver-0", 422, "bad")], T0, CFG)
    assert p.status.restart_after == stamp(300)


def test_refused_rollout_replacement_is_retried_without_counting_again() -> None:
    pods = [pod(n) for n in ALL if n != "j-rollout-1"]
    p = run({"phase": "Running"}, pods)
    assert p.status.rollout_replacements == 1
    p = fold_create_failures(JobStatus(), p, [CreateFailure("Pod", "j-rollout-1", 403, "exceeded quota")], T0, CFG)
    assert p.status.phase == "Running" and "refused" not in (p.status.message or "")  # the condition says it
    later = run(p.status, pods, now=at(10))
    assert verbs(later) == [("create", "Pod", "j-rollout-1")] and later.status.rollout_replacements == 1


def test_name_taken_by_another_owner_is_a_conflict_and_a_failed_create() -> None:
    taken = CreateFailure("Pod", "j-driver-0", 409, "Pod/j-driver-0 exists and is owned by nobody", conflict=True)
    p = fold_create_failures(JobStatus(), run({}, []), [taken], T0, CFG)
    assert cond(p, "ChildConflict").status == "True" and cond(p, "FailedCreate").status == "True"
    assert [e.reason for e in p.events].count("ChildConflict") == 1
    again = fold_create_failures(p.status, run(p.status, [], now=at(10)), [taken], at(10), CFG)
    assert [e.reason for e in again.events].count("ChildConflict") == 0  # once per new conflict


# ---------------------------------------------------------------- 4. waiting reasons

def test_pod_view_reads_waiting_reasons_exit_code_and_termination_message() -> None:
    unsched = pod_manifest("j-rollout-1", conditions=[{"type": "PodScheduled", "status": "False",
                                                       "reason": "Unschedulable", "message": "0/3 nodes fit"}])
    assert (PodView.from_manifest(unsched).waiting_reason, PodView.from_manifest(unsched).waiting_message) == \
        ("Unschedulable", "0/3 nodes fit")
    init = pod_manifest("j-actor-0", initContainerStatuses=[
        {"name": "wait-gcs", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                   "message": 'secret "j-ray-token" not found'}}}],
        containerStatuses=[{"name": "actor", "state": {"waiting": {"reason": "PodInitializing"}}}])
    v = PodView.from_manifest(init)
    assert v.waiting_reason == "CreateContainerConfigError" and "j-ray-token" in v.waiting_message
    routine = pod_manifest("j-actor-0", containerStatuses=[{"name": "actor",
                                                            "state": {"waiting": {"reason": "ContainerCreating"}}}])
    assert PodView.from_manifest(routine).waiting_reason == ""
    driver = pod_manifest("j-driver-0", phase="Failed", containerStatuses=[
        {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
        {"name": "driver", "state": {"terminated": {"exitCode": 2, "message": "spec.task.name: bad\n"}}}])
    v = PodView.from_manifest(driver)
    assert (v.exit_code, v.termination_message, v.uid, v.owner_uids) == (
        2, "spec.task.name: bad\n", "pod-j-driver-0", ("uid-1",))


def test_waiting_reasons_reach_status_condition_and_one_event_each() -> None:
    st = {"phase": "Initializing", "attemptStartTime": stamp(0)}
    pods = [pod("j-driver-0", "Running", False), pod("j-rollout-0", "Pending", False),
            pod("j-actor-0", "Pending", False, waiting_reason="ImagePullBackOff",
                waiting_message='Back-off pulling image "asyncrl/job:0.1.0"'),
            pod("j-rollout-1", "Pending", False, waiting_reason="Unschedulable",
                waiting_message="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")]
    p = run(st, pods)
    assert p.status.phase == "Initializing"
    assert p.status.message == (
        'waiting for pods: ImagePullBackOff: j-actor-0 (Back-off pulling image "asyncrl/job:0.1.0"); '
        "Unschedulable: j-rollout-1 (0/3 nodes are available: 3 Insufficient nvidia.com/gpu.)")
    ready = cond(p, "PodsReady")
    assert (ready.status, ready.reason) == ("False", "ImagePullBackOff")  # the first pod's, by name
    assert "Insufficient nvidia.com/gpu" in ready.message
    assert sorted((e.type, e.reason) for e in p.events) == [("Warning", "ImagePullBackOff"), ("Warning", "Unschedulable")]
    # the next reconcile: same reasons, no new events; a pull retry (ErrImagePull) is the same story
    flip = [*pods[:2], pod("j-actor-0", "Pending", False, waiting_reason="ErrImagePull"), pods[3]]
    again = run(p.status, flip, now=at(10))
    assert again.events == [] and "ErrImagePull: j-actor-0" in again.status.message
    # a new reason: one event naming the pod and the kubelet's message
    config = [pods[0], pod("j-rollout-0", "Pending", False, waiting_reason="CreateContainerConfigError",
                           waiting_message='secret "hf-token" not found'), *flip[2:]]
    third = run(again.status, config, now=at(20))
    assert [(e.reason, e.message) for e in third.events] == [
        ("CreateContainerConfigError", 'CreateContainerConfigError: j-rollout-0 (secret "hf-token" not found)')]
    # all clear: the message says where the start-up stands
    clear = run(third.status, [pod(n, "Running", n != "j-actor-0") for n in ALL], now=at(30))
    assert clear.status.message == "3/4 pods running and ready" and cond(clear, "PodsReady").reason == \
        "PodsNotReady"


def test_waiting_message_stays_bounded_for_a_large_job() -> None:
    s = spec(rollout={"replicas": 40})
    stuck = [pod(f"j-rollout-{i}", "Pending", False, waiting_reason="Unschedulable", waiting_message="0/3 nodes")
             for i in range(40)] + [pod("j-driver-0", "Running", False), pod("j-actor-0", "Pending", False)]
    p = run({"phase": "Initializing", "attemptStartTime": stamp(0)}, stuck, s)
    assert p.status.message == "waiting for pods: Unschedulable: j-rollout-0, j-rollout-1, j-rollout-10 and " \
        "37 more (0/3 nodes)"
    assert [e.reason for e in p.events] == ["Unschedulable"]
    assert run(p.status, stuck, s, now=at(5)).events == []


# ---------------------------------------------------------------- 5. old pods go before new ones

def test_resume_waits_for_old_pods_to_terminate() -> None:
    old = [pod(n, terminating=True) for n in ALL]
    p = run({"phase": "Suspended", "restarts": 0}, old)
    assert p.actions == [] and p.status.phase == "Pending" and p.status.reason == "WaitingForOldPods"
    assert [e.reason for e in p.events] == ["Resumed"] and p.requeue_after == 1.0
    p = run(p.status, old[:1])  # still one left: nothing created, nothing counted
    assert p.actions == [] and p.status.restarts == 0
    p = run(p.status, [])
    assert p.status.phase == "Initializing" and sorted(n for _, _, n in verbs(p)) == sorted(ALL)


def test_pending_start_deletes_leftovers_first() -> None:
    p = run({"phase": "Pending"}, [pod("j-rollout-0")])
    assert verbs(p) == [("delete", "Pod", "j-rollout-0")] and p.status.phase == "Pending"


# ---------------------------------------------------------------- 7. spec edits while running

def test_pod_shaping_edit_restarts_the_gang_on_purpose() -> None:
    old, new = spec(), spec(train={"learningRate": 1e-4})
    old_hash, new_hash = desired(REF, old, CFG, 0).spec_hash, desired(REF, new, CFG, 0).spec_hash
    assert old_hash != new_hash
    pods = [pod(n, spec_hash=old_hash) for n in ALL]
    p = run({"phase": "Running", "restarts": 0}, pods, new, generation=2)
    assert p.status.phase == "Restarting" and p.status.reason == "SpecChanged"
    assert (p.status.restarts, p.status.preemptions, p.status.epoch, p.spec_restarts) == (0, 0, 1, 1)
    assert p.status.observed_generation == 2 and p.status.restart_after == stamp(0)
    assert sorted(n for v, _, n in verbs(p) if v == "delete") == sorted(ALL)
    event = next(e for e in p.events if e.reason == "SpecChanged")
    assert "generation 2" in event.message
    # pods built from the current spec, or from before spec hashes existed: nothing happens
    assert run({"phase": "Running"}, [pod(n, spec_hash=new_hash) for n in ALL], new).actions == []
    assert run({"phase": "Running"}, [pod(n) for n in ALL], new).actions == []


def test_run_policy_and_mask_guard_edits_restart_nothing() -> None:
    s = spec()
    pods = [pod(n, spec_hash=desired(REF, s, CFG, 0).spec_hash) for n in ALL]
    edited = spec(runPolicy={"backoffLimit": 7, "activeDeadlineSeconds": 9000},
                  monitoring={"maskGuard": {"warnKeepRatio": 0.95}})
    p = run({"phase": "Running"}, pods, edited, generation=3)
    assert p.status.phase == "Running" and not [a for a in p.actions if a.kind == "Pod"]
    assert p.status.observed_generation == 3


# ---------------------------------------------------------------- 8. no checkpoint, no "last checkpoint"

def test_messages_say_from_scratch_without_a_checkpoint_volume() -> None:
    failed = [pod(n) for n in ALL if n != "j-actor-0"] + [pod("j-actor-0", "Failed", False)]
    texts: list[str] = []
    for s in (spec(), spec(runPolicy={"suspend": True})):
        p = run({"phase": "Running"}, failed, s)
        texts += [p.status.message, *(e.message for e in p.events)]
    texts += [e.message for e in run({"phase": "Suspended"}, [], spec()).events]
    texts += [e.message for e in run({"phase": "Restarting", "epoch": 1}, []).events]
    assert texts and not [t for t in texts if "last checkpoint" in t or "checkpoint kept" in t]
    assert all("from scratch (no checkpoint volume)" in t for t in texts if "restart" in t or "resum" in t)
    with_volume = spec(checkpoint={"volumeClaimName": "ckpt"})
    assert "from the last checkpoint" in run({"phase": "Running"}, failed, with_volume).status.message


# ---------------------------------------------------------------- 9. driver exit 2

def test_driver_exit_2_is_a_permanent_invalid_spec() -> None:
    bad = pod("j-driver-0", "Failed", False, exit_code=2,
              termination_message="/etc/asyncrl/job.yaml: spec.task.name: got 'chess'\n")
    p = run({"phase": "Running", "restarts": 0}, [bad, *(pod(n) for n in ALL[1:])])
    assert p.status.phase == "Failed" and p.status.reason == "InvalidSpec" and p.status.restarts == 0
    assert "spec.task.name: got 'chess'" in p.status.message
    assert sorted(n for v, _, n in verbs(p) if v == "delete") == sorted(ALL[1:])  # the driver keeps its logs
    crash = pod("j-driver-0", "Failed", False, exit_code=1)
    assert run({"phase": "Running"}, [crash, *(pod(n) for n in ALL[1:])]).status.phase == "Restarting"


# ---------------------------------------------------------------- 10. foreign owners

def test_child_owned_by_someone_else_is_never_patched_and_blocks_the_start() -> None:
    d = desired(REF, spec(), CFG, 0)
    kids = own_children(d)
    foreign_cm = {**kids[("ConfigMap", "j-spec")], "data": {"job.yaml": "not ours"}}
    foreign_cm["metadata"] = {"name": "j-spec", "ownerReferences": [{"kind": "AsyncRLJob", "name": "j",
                                                                    "uid": "old-uid"}]}
    kids[("ConfigMap", "j-spec")] = foreign_cm
    p = run({}, [], children=kids)
    assert p.actions == [] and p.status.phase == "Pending" and p.status.reason == "ChildConflict"
    conflict = cond(p, "ChildConflict")
    assert conflict.status == "True" and "ConfigMap/j-spec exists and is owned by AsyncRLJob j (uid old-uid)" \
        in conflict.message
    assert [e.reason for e in p.events if e.type == "Warning"] == ["ChildConflict"]
    # a pod event reconcile does not read children: the verdict holds, still no pod
    later = run(p.status, [], children=None, now=at(5))
    assert later.actions == [] and cond(later, "ChildConflict").status == "True" and not later.events
    # the conflict is gone (deleted by hand, or garbage-collected): pods are created
    del kids[("ConfigMap", "j-spec")]
    fixed = run(later.status, [], children=kids, now=at(10))
    assert cond(fixed, "ChildConflict").status == "False" and fixed.status.phase == "Initializing"
    assert ("create", "ConfigMap", "j-spec") in verbs(fixed)


def test_own_children_are_patched_but_never_a_secret() -> None:
    d = desired(REF, spec(), CFG, 0, ray_token="t0k3n")
    kids = own_children(d)
    kids[("ConfigMap", "j-spec")] = {**kids[("ConfigMap", "j-spec")], "data": {"job.yaml": "stale"}}
    secret = ("Secret", "j-ray-token")
    kids[secret] = {"metadata": kids[secret]["metadata"]}  # read as metadata only: no data to compare
    p = run({"phase": "Running"}, [pod(n) for n in ALL], children=kids)
    assert [(v, k) for v, k, _ in verbs(p)] == [("patch", "ConfigMap")]


def test_pods_listed_by_label_but_owned_by_others_are_ignored() -> None:
    mine = [pod_manifest(n) for n in ALL]
    impostor = pod_manifest("j-rollout-7", uid="someone-else")
    own, foreign = observe_pods([*mine, impostor], "uid-1")
    assert sorted(own) == sorted(ALL) and foreign == {"j-rollout-7": "AsyncRLJob j (uid someone-else)"}
    p = run({"phase": "Running"}, [pod(n) for n in ALL], children=None, foreign_pods=foreign)
    assert p.actions == [] and p.status.replicas.rollout == "2/2"
    # one that takes a desired pod's name is a conflict: named, never deleted
    taken = {"j-actor-0": "nobody (no ownerReferences)"}
    p = run({}, [], children=own_children(desired(REF, spec(), CFG, 0)), foreign_pods=taken)
    assert "Pod/j-actor-0 exists and is owned by nobody" in cond(p, "ChildConflict").message
    assert not [a for a in p.actions if a.kind == "Pod"]


def test_pod_group_follows_the_gang_size() -> None:
    s = spec(scheduling={"gangScheduler": "volcano"})
    kids = own_children(desired(REF, s, CFG, 0))
    group = kids[("PodGroup", "j")]
    assert group["spec"]["minMember"] == 4
    assert not run({"phase": "Running"}, [pod(n) for n in ALL], s, children=kids).actions
    kids[("PodGroup", "j")] = {**group, "spec": {**group["spec"], "minMember": 3, "queue": "default"}}
    p = run({"phase": "Running"}, [pod(n) for n in ALL], s, children=kids)
    assert [(a.verb, a.kind, a.api_version) for a in p.actions] == [("patch", "PodGroup", group["apiVersion"])]
    assert p.actions[0].body == {"spec": group["spec"]}
