"""How the reconciler turns API answers into status and events, without a server.

``MemoryKube`` below stands in for ``asyncrl.operator.kube.Kube`` only to script what the API
server answers (a 403 from quota admission, a 409 for a name someone else holds, a pod event
about a pod that is gone). What a real server answers is proven by the real-server tests; here
the question is what the operator makes of each answer. Also here: the timer that re-runs a
reconcile keeps kopf's event context (``Later``), checked with kopf's own event queue.
"""

import asyncio
import contextvars
import copy
import datetime as dt
import json
import threading
from typing import Any, cast

import kopf
import pytest
from kopf._core.engines import posting
from kubernetes.client import ApiException
from prometheus_client import CollectorRegistry

from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.handlers import post_event
from asyncrl.operator.kube import Kube
from asyncrl.operator.lifecycle import VANISHED_SETTLE_SECONDS
from asyncrl.operator.metrics import create_metrics
from asyncrl.operator.reconcile import Later, ReconcileError, Reconciler

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
# resync 1 ms: every requeue is longer, so no background timer runs during these tests
CFG = OperatorSettings(restart_backoff_seconds=10, restart_backoff_max_seconds=300, resync_seconds=0.001)
ALL = {"j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0"}


def api_error(code: int, message: str) -> ApiException:
    exc = ApiException(status=code, reason={403: "Forbidden", 409: "Conflict", 500: "Internal Server Error"}[code])
    exc.body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": code})
    return exc


class MemoryKube:
    """Objects by (kind, name) in one namespace; ``refuse[(verb, kind, name)]`` is the next answer."""

    def __init__(self) -> None:
        self.job: dict[str, Any] = {
            "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "uid-1", "generation": 1},
            "spec": {"rollout": {"replicas": 2}, "actor": {"replicas": 1}, "runPolicy": {"backoffLimit": 2}},
        }
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.refuse: dict[tuple[str, str, str], ApiException] = {}
        self.calls: list[tuple[str, str, str]] = []

    def _answer(self, verb: str, kind: str, name: str) -> None:
        self.calls.append((verb, kind, name))
        if (exc := self.refuse.get((verb, kind, name))) is not None:
            raise exc

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.job)

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        merged = {**self.job.get("status", {}), **status}
        self.job["status"] = {k: v for k, v in merged.items() if v is not None}

    def patch_job(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        # only the operator's status copy (status_guard) is patched on the job itself here
        assert set(body) == {"metadata"} and set(body["metadata"]) == {"annotations"}, body
        self.job["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])

    def delete_job(self, namespace: str, name: str) -> None:
        raise AssertionError("not expected here")

    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        key, value = selector.split("=")
        return [copy.deepcopy(o) for (k, _), o in self.objects.items()
                if k == "Pod" and (o["metadata"].get("labels") or {}).get(key) == value]

    def get(self, kind: str, namespace: str, name: str, api_version: str = "v1") -> dict[str, Any] | None:
        self._answer("get", kind, name)
        return copy.deepcopy(self.objects.get((kind, name)))

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        self._answer("create", kind, name)
        if (kind, name) in self.objects:
            raise api_error(409, f'{kind.lower()}s "{name}" already exists')
        self.objects[(kind, name)] = copy.deepcopy(body)

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], api_version: str = "v1") -> None:
        self._answer("patch", kind, name)
        self.objects[(kind, name)].update(copy.deepcopy(body))

    def delete(self, kind: str, namespace: str, name: str, grace_period_seconds: int | None = None,
               api_version: str = "v1") -> None:
        self._answer("delete", kind, name)
        self.objects.pop((kind, name))

    # -- the kubelet's part
    def run_pods(self) -> None:
        for (kind, _), o in self.objects.items():
            if kind == "Pod":
                o["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


class Harness:
    def __init__(self) -> None:
        self.kube = MemoryKube()
        self.now = T0
        self.events: list[tuple[str, str, str]] = []
        self.reconciler = Reconciler(CFG, cast(Kube, self.kube), create_metrics(CollectorRegistry()),
                                     lambda body, t, r, m: self.events.append((t, r, m)), clock=lambda: self.now)

    def reconcile(self, after: float = 0.0, children: bool = True) -> dict[str, Any]:
        self.now = T0 + dt.timedelta(seconds=after)
        self.events.clear()
        self.reconciler.reconcile("ns", "j", children=children)
        return self.kube.job["status"]

    def cond(self, ctype: str) -> dict[str, Any]:
        return next(c for c in self.kube.job["status"]["conditions"] if c["type"] == ctype)

    def pods(self) -> set[str]:
        return {n for k, n in self.kube.objects if k == "Pod"}


@pytest.fixture
def h() -> Any:
    harness = Harness()
    yield harness
    harness.reconciler.close()


def test_quota_refusal_is_failed_create_with_the_servers_message_then_retried(h: Harness) -> None:
    quota = 'pods "j-actor-0" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=3, limited: pods=3'
    h.kube.refuse[("create", "Pod", "j-actor-0")] = api_error(403, quota)
    st = h.reconcile()  # no ReconcileError: the refusal is handled, not retried at once by kopf
    assert h.pods() == ALL - {"j-actor-0"} and st["phase"] == "Initializing"
    assert (h.cond("FailedCreate")["status"], h.cond("FailedCreate")["message"]) == (
        "True", f"create Pod j-actor-0: 403 {quota}")
    assert ("Warning", "FailedCreate", f"create Pod j-actor-0 refused: 403 {quota}") in h.events
    assert not [r for _, r, _ in h.events if r.startswith("FailedTo")]
    before = len(h.kube.calls)
    st = h.reconcile(after=5, children=False)  # a pod event inside the backoff
    assert st["restarts"] == 0 and st["phase"] == "Initializing" and h.pods() == ALL - {"j-actor-0"}
    assert not [c for c in h.kube.calls[before:] if c[0] == "create"]
    del h.kube.refuse[("create", "Pod", "j-actor-0")]  # quota raised
    st = h.reconcile(after=10, children=False)
    assert h.pods() == ALL and h.cond("FailedCreate")["status"] == "False" and st["restarts"] == 0


# What the server answered for every owned child of a job created seconds after `helm install` put the CRD in
# (measured on the real cluster, tests/cluster): its REST mapping of the new kind is not loaded for ~30 s.
UNMAPPED = ('configmaps "j-spec" is forbidden: cannot set blockOwnerDeletion in this case because cannot find '
            'RESTMapping for APIVersion asyncrl.io/v1alpha1 Kind AsyncRLJob')


def test_pods_wait_for_the_children_they_need_and_a_pod_event_retries_those_children_too(h: Harness) -> None:
    for kind, name in (("ConfigMap", "j-spec"), ("ServiceAccount", "j-status"), ("NetworkPolicy", "j")):
        h.kube.refuse[("create", kind, name)] = api_error(403, UNMAPPED)
    st = h.reconcile()
    # no pod without its ConfigMap (a volume the kubelet would retry for minutes) or the driver's ServiceAccount
    assert not h.pods() and not [c for c in h.kube.calls if c[:2] == ("create", "Pod")]
    creates = [c for c in h.kube.calls if c[0] == "create"]
    assert {k for _, k, _ in creates} == {"Secret", "ConfigMap", "Service", "NetworkPolicy", "ServiceAccount", "Role",
                                          "RoleBinding"}  # every other child was still tried, pods not
    cond = h.cond("FailedCreate")["message"]
    assert cond.startswith(f"create ConfigMap j-spec: 403 {UNMAPPED}") or f"create ConfigMap j-spec: 403 {UNMAPPED}" in cond
    assert "create Pod j-driver-0: not sent until ConfigMap j-spec, ServiceAccount j-status can be created" in cond
    assert "retrying in 10 s" in st["message"] and "the job's children" in st["message"]
    # one Warning per refused child, none per held pod; the NetworkPolicy is not one the pods need
    warned = sorted(m.split(" refused")[0] for t, r, m in h.events if r == "FailedCreate")
    assert warned == ["create ConfigMap j-spec", "create NetworkPolicy j", "create ServiceAccount j-status"]
    assert st["restarts"] == 0 and st["phase"] == "Initializing"

    h.kube.refuse.clear()  # the server has loaded the mapping
    before = len(h.kube.calls)
    st = h.reconcile(after=10, children=False)  # the backoff's timed retry (pods only, before): children too
    made = [(k, n) for v, k, n in h.kube.calls[before:] if v == "create"]
    assert ("ConfigMap", "j-spec") in made and ("ServiceAccount", "j-status") in made and ("NetworkPolicy", "j") in made
    assert max(i for i, (k, _) in enumerate(made) if k != "Pod") < min(i for i, (k, _) in enumerate(made) if k == "Pod")
    assert h.pods() == ALL and h.cond("FailedCreate")["status"] == "False" and st["restarts"] == 0
    before = len(h.kube.calls)
    h.reconcile(after=11, children=False)  # nothing was refused in the last pass: a pod event reads pods only
    assert not [c for c in h.kube.calls[before:] if c[0] == "get"]


def test_a_refused_network_policy_alone_holds_no_pod_back(h: Harness) -> None:
    h.kube.refuse[("create", "NetworkPolicy", "j")] = api_error(403, "networkpolicies is forbidden: quota")
    h.reconcile()
    assert h.pods() == ALL and h.cond("FailedCreate")["message"].startswith("create NetworkPolicy j: 403")


def test_name_held_by_a_foreign_pod_is_a_conflict_and_the_pod_is_left_alone(h: Harness) -> None:
    h.kube.objects[("Pod", "j-driver-0")] = {"metadata": {"name": "j-driver-0", "labels": {"app": "mine"}}}
    h.reconcile()
    assert h.cond("ChildConflict")["status"] == "True"
    assert "Pod/j-driver-0 exists and is owned by nobody (no ownerReferences)" in h.cond("ChildConflict")["message"]
    assert h.kube.objects[("Pod", "j-driver-0")]["metadata"]["labels"] == {"app": "mine"}
    st = h.reconcile(after=3, children=False)
    assert st["restarts"] == 0 and st["phase"] == "Initializing"  # the missing driver is not a lost pod
    assert ("delete", "Pod", "j-driver-0") not in h.kube.calls


def test_foreign_config_map_is_not_patched_and_no_pod_starts(h: Harness) -> None:
    h.kube.objects[("ConfigMap", "j-spec")] = {"metadata": {"name": "j-spec", "ownerReferences": [
        {"kind": "AsyncRLJob", "name": "j", "uid": "uid-of-a-deleted-job"}]}, "data": {"job.yaml": "old"}}
    st = h.reconcile()
    assert st["phase"] == "Pending" and not h.pods()
    assert h.kube.objects[("ConfigMap", "j-spec")]["data"] == {"job.yaml": "old"}
    assert [r for t, r, _ in h.events if t == "Warning"] == ["ChildConflict"]


def test_a_pod_that_vanished_after_a_disruption_counts_as_preempted(h: Harness) -> None:
    h.reconcile()
    h.kube.run_pods()
    assert h.reconcile(after=1)["phase"] == "Running"
    last = h.kube.objects.pop(("Pod", "j-driver-0"))  # preempted and gone before any reconcile listed it
    last["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                         "reason": "PreemptionByScheduler"})
    h.now = T0 + dt.timedelta(seconds=2)
    h.reconciler.pod_event("ns", "j", last)  # the DELETED event carries the pod's last state
    st = h.kube.job["status"]
    assert (st["phase"], st["reason"], st["preemptions"], st["restarts"]) == ("Restarting", "Preempted", 1, 0)


def test_a_disruption_survives_an_operator_restart_through_the_status(h: Harness) -> None:
    h.reconcile()
    h.kube.run_pods()
    h.reconcile(after=1)
    h.kube.objects[("Pod", "j-actor-0")]["status"]["conditions"].append(
        {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"})
    assert h.reconcile(after=2)["disruptedPods"] == ["j-actor-0@0"]  # still running: only written down
    h.reconciler.close()
    # the operator restarts (empty memory); the pod is gone before the new one lists anything
    h.reconciler = Reconciler(CFG, cast(Kube, h.kube), create_metrics(CollectorRegistry()),
                              lambda body, t, r, m: h.events.append((t, r, m)), clock=lambda: h.now)
    h.kube.objects.pop(("Pod", "j-actor-0"))
    st = h.reconcile(after=3)
    assert (st["phase"], st["reason"], st["preemptions"], st["restarts"]) == ("Restarting", "Preempted", 1, 0)


def test_a_pod_that_vanished_without_a_disruption_is_counted(h: Harness) -> None:
    h.reconcile()
    h.kube.run_pods()
    h.reconcile(after=1)
    last = h.kube.objects.pop(("Pod", "j-driver-0"))
    h.now = T0 + dt.timedelta(seconds=2)
    h.reconciler.pod_event("ns", "j", last)
    assert h.kube.job["status"]["phase"] == "Running"  # its DELETED event may still be coming: not yet
    st = h.reconcile(after=2 + VANISHED_SETTLE_SECONDS)
    assert (st["phase"], st["preemptions"], st["restarts"]) == ("Restarting", 0, 1)


def test_a_list_ahead_of_the_deleted_event_still_sees_the_preemption(h: Harness) -> None:
    """Another pod's event lists the pods after the driver is gone but before the driver's DELETED
    event (with its disruption) arrives: judged then, it would be a failure; it is a preemption."""
    h.reconcile()
    h.kube.run_pods()
    assert h.reconcile(after=1)["phase"] == "Running"
    rollout = h.kube.objects[("Pod", "j-rollout-0")]
    rollout["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "Preempted"})
    last = h.kube.objects.pop(("Pod", "j-driver-0"))
    last["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": "Preempted"})
    h.now = T0 + dt.timedelta(seconds=2)
    h.reconciler.pod_event("ns", "j", rollout)  # lists: the driver is missing, its cause unknown
    st = h.kube.job["status"]
    assert (st["phase"], st.get("restarts", 0), st.get("preemptions", 0)) == ("Running", 0, 0)
    h.now = T0 + dt.timedelta(seconds=3)
    h.reconciler.pod_event("ns", "j", last)  # the driver's DELETED event arrives
    st = h.kube.job["status"]
    assert (st["phase"], st["reason"], st["preemptions"], st["restarts"]) == ("Restarting", "Preempted", 1, 0)


def test_other_failures_still_raise_for_a_retry(h: Harness) -> None:
    h.reconcile()
    h.kube.run_pods()
    h.reconcile(after=1)
    h.kube.objects[("Pod", "j-actor-0")]["status"]["phase"] = "Failed"
    h.kube.refuse[("delete", "Pod", "j-driver-0")] = api_error(500, "etcdserver: request timed out")
    with pytest.raises(ReconcileError, match="etcdserver: request timed out"):
        h.reconcile(after=2)
    assert ("Warning", "FailedToDeletePod", "delete Pod j-driver-0 failed: 500 etcdserver: request timed out") \
        in h.events


# ---------------------------------------------------------------- timers keep kopf's context

def kopf_context(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Any]) -> contextvars.Context:
    """The context kopf gives a sync handler's thread: its settings and event queue (see posting.py)."""
    ctx = contextvars.copy_context()

    def enter() -> None:
        posting.settings_var.set(kopf.OperatorSettings())
        posting.event_queue_var.set(queue)
        posting.event_queue_loop_var.set(loop)
    ctx.run(enter)
    return ctx


JOB = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "j", "namespace": "ns",
                                                                                 "uid": "uid-1"}}


def test_event_posted_from_a_timer_scheduled_reconcile_arrives() -> None:
    loop = asyncio.new_event_loop()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    errors: list[BaseException] = []

    def fire(namespace: str, name: str) -> None:  # what Reconciler._fire does: reconcile, post events
        try:
            post_event(JOB, "Normal", "CreatedPod", f"created pod {name}-driver-0")
        except LookupError as exc:
            errors.append(exc)

    later = Later(fire)
    try:
        kopf_context(loop, queue).run(later.schedule, ("ns", "j"), 0.01)  # scheduled from a handler
        event = loop.run_until_complete(asyncio.wait_for(queue.get(), 5))
        assert (event.type, event.reason, event.message) == ("Normal", "CreatedPod", "created pod j-driver-0")
        assert event.ref["name"] == "j" and not errors
        # the control: a bare threading.Timer starts with an empty context and kopf.event fails there
        bare = threading.Timer(0.01, fire, ("ns", "j"))
        bare.start()
        bare.join()
        assert len(errors) == 1 and isinstance(errors[0], LookupError)
    finally:
        later.close()
        loop.close()


def test_later_keeps_the_earliest_timer_per_key_and_stops_on_close() -> None:
    fired: list[tuple[str, str]] = []
    done = threading.Event()

    def record(namespace: str, name: str) -> None:
        fired.append((namespace, name))
        done.set()

    later = Later(record)
    later.schedule(("ns", "a"), 30.0)
    later.schedule(("ns", "a"), 0.01)  # earlier: replaces the 30 s timer
    later.schedule(("ns", "a"), 20.0)  # later than the pending one: ignored
    assert done.wait(5) and fired == [("ns", "a")]
    later.schedule(("ns", "b"), 0.2)
    later.close()
    later.schedule(("ns", "c"), 0.01)  # closed: nothing is scheduled any more
    threading.Event().wait(0.4)
    assert fired == [("ns", "a")]


# -------------------------------------------------------------------- status fields written by the driver

def test_operator_fields_the_driver_rewrote_are_restored_and_never_decide(h: Harness) -> None:
    h.reconcile()
    h.kube.run_pods()
    assert h.reconcile(after=1)["phase"] == "Running"
    copy_before = h.kube.job["metadata"]["annotations"]["asyncrl.io/operator-status"]
    # what the driver's token can do: a merge patch of the whole status (RBAC cannot narrow it)
    h.kube.patch_job_status("ns", "j", {"restarts": 5, "phase": "Succeeded", "completionTime": T0.isoformat(),
                                        "startTime": None, "training": {"policyVersion": 3}})
    st = h.reconcile(after=2)
    # restored from the operator's own copy; the driver's own field stays
    assert (st["phase"], st["restarts"], "completionTime" in st) == ("Running", 0, False)
    assert st["startTime"] and st["training"] == {"policyVersion": 3}
    assert h.pods() == ALL  # a faked Succeeded deleted nothing
    (warning,) = [m for t, r, m in h.events if r == "StatusOverwritten"]
    assert warning.startswith("status field(s) phase, restarts, startTime, completionTime differed")
    kept = json.loads(h.kube.job["metadata"]["annotations"]["asyncrl.io/operator-status"])
    assert (kept["phase"], kept["restarts"], kept["startTime"]) == ("Running", 0, json.loads(copy_before)["startTime"])
    # and the next decision counts from the operator's copy: backoffLimit 2, first real failure
    h.kube.patch_job_status("ns", "j", {"restarts": 2})
    h.kube.objects[("Pod", "j-driver-0")]["status"] = {"phase": "Failed", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
    st = h.reconcile(after=3)
    assert (st["phase"], st["restarts"]) == ("Restarting", 1)  # not Failed (BackoffLimitExceeded at 3 > 2)


def test_a_job_without_a_copy_starts_from_its_status_once() -> None:
    from asyncrl.operator.status_guard import copy_patch, trusted_status

    old = {"metadata": {"name": "j"}, "status": {"restarts": 1, "phase": "Running", "training": {"x": 1}}}
    guard = trusted_status(old)  # a job from before this version: nothing to compare with yet
    assert guard.status == old["status"] and guard.overwritten == () and guard.copy is None
    patch = copy_patch(guard, {"restarts": 1, "phase": "Running", "training": {"x": 1}})
    assert patch == {"metadata": {"annotations": {
        "asyncrl.io/operator-status": '{"phase":"Running","restarts":1}'}}}  # training is not the operator's
    stored = {**old, "metadata": {"annotations": patch["metadata"]["annotations"]}}
    assert copy_patch(trusted_status(stored), {"restarts": 1, "phase": "Running"}) is None  # unchanged: no write
    broken = {"metadata": {"annotations": {"asyncrl.io/operator-status": "{not json"}}, "status": {"restarts": 0}}
    assert trusted_status(broken).status == {} and trusted_status(broken).overwritten == ("restarts",)


def test_writing_the_status_copy_is_no_change_of_the_job_for_kopf() -> None:
    # kopf runs the update handler when the job's essence changes, annotations included: the operator's
    # own copy must not count, or every status change would cost one more reconcile.
    settings = kopf.OperatorSettings()
    from asyncrl.operator.handlers import configure_kopf

    configure_kopf(settings)
    job = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
           "metadata": {"name": "j", "annotations": {"team": "rl"}}, "spec": {"train": {"steps": 3}}}
    copied = copy.deepcopy(job)
    copied["metadata"]["annotations"]["asyncrl.io/operator-status"] = '{"restarts":1}'
    storage = settings.persistence.diffbase_storage
    assert storage.build(body=kopf.Body(copied)) == storage.build(body=kopf.Body(job))
    copied["metadata"]["annotations"]["team"] = "other"  # any other annotation still counts
    assert storage.build(body=kopf.Body(copied)) != storage.build(body=kopf.Body(job))
