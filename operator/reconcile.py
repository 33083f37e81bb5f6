"""Glue between the API and the pure planner: read, plan, apply, write status, post events.

One writer per job: every path (create/update/resume handlers, the resync timer, pod events)
goes through :meth:`Reconciler.reconcile`, serialised by a per-job lock, so the status and its
conditions are always written by one place from one fresh read.
"""

import contextvars
import datetime as dt
import logging
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable
from typing import Any

from kubernetes.client import ApiException

from asyncrl.api.constants import API_VERSION, KIND
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.status import OPERATOR_FIELDS, Phase
from asyncrl.api.validation import SpecError, validate_job
from asyncrl.operator import agent_endpoint, builders, names
from asyncrl.operator.admission import admission_problems
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.kube import Kube, server_message
from asyncrl.operator.lifecycle import (
    PREREQUISITE_KINDS,
    Action,
    CreateFailure,
    Plan,
    children_first,
    fold_create_failures,
    hold_pods,
    plan,
    plan_deletion,
)
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.observed import JobView, Observed, PodView, observe_pods, owned_by, owner_of
from asyncrl.operator.status_guard import TAMPER_REASON, copy_patch, trusted_status

log = logging.getLogger("asyncrl.operator")
EventSink = Callable[[dict[str, Any], str, str, str], None]  # (job body, type, reason, message)


class ReconcileError(Exception):
    """Some API calls failed; the rest of the plan was applied. Retry later."""


def parse_spec(body: dict[str, Any]) -> AsyncRLJobSpec | SpecError:
    meta = body.get("metadata") or {}
    doc = {"apiVersion": API_VERSION, "kind": KIND,
           "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                        "labels": meta.get("labels") or {}},
           "spec": body.get("spec") or {}}
    try:
        return validate_job(doc).spec
    except SpecError as err:
        return err


def job_ref(body: dict[str, Any]) -> builders.JobRef:
    meta = body["metadata"]
    return builders.JobRef(meta["name"], meta["namespace"], meta["uid"], dict(meta.get("labels") or {}))


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Merge patch of the operator's fields (None deletes); empty when nothing changed. Both are the
    status as the API server holds it: ``old`` as read, ``new`` as ``JobStatus.to_status_dict`` writes it."""
    patch = {k: v for k, v in new.items() if k in OPERATOR_FIELDS and old.get(k) != v}
    patch.update({k: None for k in OPERATOR_FIELDS if k in old and k not in new})
    return patch


class Later:
    """Calls ``callback(*key)`` once after a delay; one pending timer per key, the earliest wins.

    The callback runs in a copy of the context that scheduled it. kopf keeps its event queue in
    context variables (``kopf._core.engines.posting``) and copies them into the threads of sync
    handlers; a bare ``threading.Timer`` thread starts with an empty context, where ``kopf.event``
    raises ``LookupError`` and a timer-scheduled reconcile (restart backoff) would post no event.
    """

    def __init__(self, callback: Callable[..., None]) -> None:
        self.callback = callback
        self._lock = threading.Lock()
        self._timers: dict[Hashable, tuple[float, threading.Timer]] = {}
        self._closed = False

    def schedule(self, key: tuple[Any, ...], delay: float) -> None:
        delay = max(delay, 0.05)
        due = time.monotonic() + delay
        context = contextvars.copy_context()
        with self._lock:
            if self._closed:
                return
            pending = self._timers.get(key)
            if pending is not None and pending[0] <= due:
                return
            if pending is not None:
                pending[1].cancel()
            timer = threading.Timer(delay, self._run, (key, context))
            timer.daemon = True
            self._timers[key] = (due, timer)
        timer.start()

    def _run(self, key: tuple[Any, ...], context: contextvars.Context) -> None:
        with self._lock:
            pending = self._timers.get(key)
            if pending is not None and pending[1] is threading.current_thread():
                del self._timers[key]
        context.run(self.callback, *key)

    def cancel(self, key: tuple[Any, ...]) -> None:
        with self._lock:
            pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()

    def close(self) -> None:
        """Cancel everything; nothing is scheduled any more (operator shutdown)."""
        with self._lock:
            self._closed = True
            timers, self._timers = list(self._timers.values()), {}
        for _, timer in timers:
            timer.cancel()


class Reconciler:
    def __init__(self, cfg: OperatorSettings, kube: Kube, metrics: OperatorMetrics, events: EventSink,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.cfg, self.kube, self.metrics, self.events, self.clock = cfg, kube, metrics, events, clock
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()
        self._waiting: set[tuple[str, str]] = set()
        self._full: dict[tuple[str, str], bool] = {}
        self._full_retry: set[tuple[str, str]] = set()  # jobs whose last pass had a non-pod child refused
        self._later = Later(self._fire)
        # job uid -> {(pod name, epoch)} seen with DisruptionTarget=True: a pod event can carry the last
        # state of a pod that is gone by the time its reconcile lists the pods. The planner persists what
        # it was told in status.disruptedPods, read back here, so an operator restart forgets nothing.
        self._disrupted: defaultdict[str, set[tuple[str, int]]] = defaultdict(set)
        # job uid -> (pod name, epoch) of the last list, and -> (pod name, epoch) -> when first found missing
        # from a later list (Observed.vanished: the planner waits a moment for its DELETED event)
        self._listed: defaultdict[str, set[tuple[str, int]]] = defaultdict(set)
        self._missing_since: defaultdict[str, dict[tuple[str, int], dt.datetime]] = defaultdict(dict)

    def note_pod(self, body: dict[str, Any]) -> None:
        """Remember a disrupted pod from its event body (DELETED events carry the last state)."""
        view = PodView.from_manifest(body)
        if view.disrupted:
            with self._guard:
                for uid in view.owner_uids:
                    self._disrupted[uid].add((view.name, view.epoch))

    def pod_event(self, namespace: str, job: str, body: dict[str, Any]) -> Plan | None:
        """A pod of ``job`` changed or went away: remember a disruption, then reconcile (pods only)."""
        self.note_pod(body)
        return self.reconcile(namespace, job, children=False)

    def observe(self, ref: builders.JobRef, desired: builders.Desired | None, children: bool = True,
                remembered: list[str] | None = None) -> Observed:
        """List the job's pods and, when ``children``, read each desired child and each unwanted one
        (one GET each).
        ``remembered``: ``status.disruptedPods`` (``<pod>@<epoch>``) as the last reconcile wrote it."""
        manifests = self.kube.list_pods(ref.namespace, names.selector_string(ref.name))
        for m in manifests:
            self.note_pod(m)
        pods, foreign = observe_pods(manifests, ref.uid)
        now = self.clock()
        with self._guard:
            disrupted = frozenset(self._disrupted.get(ref.uid, ())) | frozenset(
                (pod, int(epoch)) for pod, _, epoch in (e.rpartition("@") for e in remembered or ())
                if epoch.isdigit())
            listed = {(p.name, p.epoch) for p in pods.values()}
            missing = self._missing_since[ref.uid]
            for key in self._listed[ref.uid] - listed:
                missing.setdefault(key, now)
            for key in listed:
                missing.pop(key, None)  # back (a rollout pod replaced under its name)
            self._listed[ref.uid] = listed
            vanished = {key: (now - since).total_seconds() for key, since in missing.items()}
        if not children or desired is None:
            return Observed(pods, None, foreign, disrupted, vanished)
        found: dict[tuple[str, str], dict[str, Any]] = {}
        # the desired children, and the optional ones this spec does not want (an earlier spec's: deleted)
        wanted = [(c.kind, c.name, c.manifest.get("apiVersion", "v1")) for c in desired.children]
        for kind, name, api_version in [*wanted, *((u.kind, u.name, u.api_version) for u in desired.unwanted)]:
            obj = self.kube.get(kind, ref.namespace, name, api_version)
            if obj is not None:
                found[(kind, name)] = obj
        return Observed(pods, found, foreign, disrupted, vanished)

    def reconcile(self, namespace: str, name: str, children: bool = True) -> Plan | None:
        """Bring one job one step closer to its desired state. None if the job is gone or deleting,
        or if another call for the same job is already waiting (it will read the newer state: a
        burst of pod events costs one reconcile, not one each).

        ``children=False`` (pod events, training reports) skips reading the non-pod children;
        the create/update/resume handlers and the resync timer check them.
        """
        key = (namespace, name)
        with self._guard:
            if key in self._waiting:
                self._full[key] = self._full.get(key, False) or children
                return None
            self._waiting.add(key)
            self._full[key] = children
            lock = self._locks[key]
        with lock:
            with self._guard:
                self._waiting.discard(key)
                full = self._full.pop(key, children)
            return self._timed(namespace, name, full)

    def _timed(self, namespace: str, name: str, full: bool) -> Plan | None:
        with self.metrics.reconcile_seconds.time():
            try:
                return self._reconcile(namespace, name, full)
            except (ApiException, ReconcileError):
                self.metrics.reconcile_errors.labels("api").inc()
                raise
            except Exception:
                self.metrics.reconcile_errors.labels("unexpected").inc()
                raise

    def _reconcile(self, namespace: str, name: str, full: bool) -> Plan | None:
        with self._guard:  # a child refused in the last pass: whatever triggers this pass, read the children
            if (namespace, name) in self._full_retry:
                self._full_retry.discard((namespace, name))
                full = True
        body = self.kube.get_job(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        ref = job_ref(body)
        guard = trusted_status(body)  # the operator's fields from its own copy, never the driver's
        view = JobView.read(ref, int(body["metadata"].get("generation") or 1), guard.status)  # typed from here on
        if unreadable := {k: v for k, v in view.unreadable.items() if k != "training"}:  # training: Degraded says it
            log.warning("status of %s/%s: left out unreadable field(s) %s", namespace, name, unreadable)
        status = view.status
        spec = parse_spec(body)
        # Fresh values each time: each is used only if its Secret is missing (created once, never patched).
        desired = None if isinstance(spec, SpecError) else builders.desired(
            ref, spec, self.cfg, status.epoch, ray_token=secrets.token_urlsafe(32),
            agent_key=secrets.token_urlsafe(agent_endpoint.KEY_BYTES))
        if desired is not None and isinstance(spec, AsyncRLJobSpec) and (
                inadmissible := admission_problems(spec, namespace, self.cfg, desired.pods)):
            spec, desired = SpecError(inadmissible), None  # ValidationFailed: nothing is created
        observed = self.observe(ref, desired, children=full, remembered=status.disrupted_pods)
        now = self.clock()
        p = plan(view, spec, desired, observed, now, self.cfg)
        failures: list[str] = []
        refused: list[CreateFailure] = []
        missing: list[str] = []  # children the pods refer to that this pass could not create
        for a in children_first(p.actions):  # the pod creates last: ``missing`` is whole when they come
            if a.kind == "Pod" and a.verb == "create" and missing:
                refused += hold_pods([a], missing)
                continue
            outcome = self._apply(body, ref, a)
            if isinstance(outcome, CreateFailure):
                refused.append(outcome)
            elif outcome:
                failures.append(outcome)
            if outcome and a.verb == "create" and a.kind in PREREQUISITE_KINDS:
                missing.append(f"{a.kind} {a.name}")
        if any(f.kind != "Pod" for f in refused) or missing:
            # the timed retry of a refused create (pods only, otherwise) reads and creates the other children too:
            # right after the CRD is installed the server refuses owner references to the job for ~30 s (its
            # REST mapping of the new kind is not loaded yet), and those children would wait for the resync
            with self._guard:
                self._full_retry.add((namespace, name))
        p = fold_create_failures(status, p, refused, now, self.cfg)  # refused creates: a condition, retried
        for ev in p.events:
            self.events(body, ev.type, ev.reason, ev.message)
        if guard.overwritten:
            self.events(body, "Warning", TAMPER_REASON, guard.message())
        written = p.status.to_status_dict()  # the one serialisation: the copy and the status patch carry it
        if (own := copy_patch(guard, written)) is not None:
            self.kube.patch_job(namespace, name, own)  # first: a failed status write leaves the copy ahead
        patch = status_patch(body.get("status") or {}, written)  # also rewrites what someone else changed
        if patch:
            self.kube.patch_job_status(namespace, name, patch)
        self._forget_disruptions(ref.uid, p.status.epoch)
        self.metrics.observe_phase(namespace, name, (p.status.phase or Phase.PENDING).value)
        self.metrics.restarted(namespace, name, "failure", p.counted_restarts)
        self.metrics.restarted(namespace, name, "preemption", p.preemptions)
        self.metrics.restarted(namespace, name, "spec_change", p.spec_restarts)
        self.metrics.sync_phases_stuck(namespace, name, p.sync_stuck)
        if p.requeue_after is not None and p.requeue_after < self.cfg.resync_seconds:
            self._later.schedule((namespace, name), p.requeue_after)
        if failures:
            raise ReconcileError("; ".join(failures))
        return p

    def _forget_disruptions(self, uid: str, epoch: int) -> None:
        """Disruptions of pods of earlier epochs were acted on (or never mattered)."""
        with self._guard:
            kept = {(n, e) for n, e in self._disrupted.get(uid, ()) if e >= epoch}
            if kept:
                self._disrupted[uid] = kept
            else:
                self._disrupted.pop(uid, None)
            missing = {k: t for k, t in self._missing_since.pop(uid, {}).items() if k[1] >= epoch}
            if missing:
                self._missing_since[uid] = missing

    def _fire(self, namespace: str, name: str) -> None:
        """Reconcile again after a short wait (a restart backoff, a deadline, a create retry) whatever
        triggered the last one: pod events cannot ask kopf to retry."""
        try:
            self.reconcile(namespace, name, children=False)
        except Exception as exc:  # the resync timer retries
            log.warning("scheduled reconcile of %s/%s failed: %s", namespace, name, exc)

    def close(self) -> None:
        """Cancel every scheduled reconcile (operator shutdown)."""
        self._later.close()

    def _apply(self, body: dict[str, Any], ref: builders.JobRef, a: Action) -> str | CreateFailure | None:
        """Run one action; post its event. A create the server refuses comes back as a CreateFailure
        (folded into the status), any other failure as a message; nothing raises."""
        ns = ref.namespace
        try:
            if a.kind == "AsyncRLJob":
                if a.verb == "delete":
                    self.kube.delete_job(ns, a.name)
                else:
                    self.kube.patch_job(ns, a.name, a.body or {})
            elif a.verb == "create":
                self.kube.create(a.kind, ns, a.body or {})
            elif a.verb == "patch":
                self.kube.patch(a.kind, ns, a.name, a.body or {}, a.api_version)
            else:
                grace = (a.body or {}).get("gracePeriodSeconds")
                self.kube.delete(a.kind, ns, a.name, grace, a.api_version)
        except ApiException as exc:
            if a.verb == "delete" and exc.status == 404:
                return None  # already gone
            if a.verb == "create" and exc.status == 409:
                return self._taken(ref, a)
            if a.verb == "create" and a.kind != "AsyncRLJob" and 400 <= (exc.status or 0) < 500 \
                    and exc.status != 429:  # quota, admission, RBAC: the server said no, retrying now won't help
                return CreateFailure(a.kind, a.name, int(exc.status or 0), server_message(exc))
            msg = f"{a.verb} {a.kind} {a.name} failed: {exc.status} {server_message(exc)}"
            self.events(body, "Warning", f"FailedTo{a.verb.capitalize()}{a.kind}", msg)
            return msg
        self.events(body, "Normal", a.reason, a.message)
        return None

    def _taken(self, ref: builders.JobRef, a: Action) -> CreateFailure | None:
        """A create answered 409: fine if the object is ours (another reconcile made it), else its
        name is taken by an owner that is not this job, and it is never adopted."""
        obj = self.kube.get(a.kind, ref.namespace, a.name, a.api_version)
        if obj is None or owned_by(obj, ref.uid):
            return None
        return CreateFailure(a.kind, a.name, 409, f"{a.kind}/{a.name} exists and is owned by {owner_of(obj)}; "
                             "rename the job or delete it", conflict=True)

    def finalize(self, body: dict[str, Any]) -> bool:
        """Delete handler: True when the finalizer may go (pods gone, or the timeout passed)."""
        ref = job_ref(body)
        with self._locks[(ref.namespace, ref.name)]:
            deleting = body["metadata"].get("deletionTimestamp")
            started = dt.datetime.fromisoformat(deleting.replace("Z", "+00:00")) if deleting else self.clock()
            pods, _ = observe_pods(self.kube.list_pods(ref.namespace, names.selector_string(ref.name)), ref.uid)
            dp = plan_deletion(Observed(pods), (self.clock() - started).total_seconds(),
                               self.cfg.finalizer_timeout_seconds)
            failures = [msg for a in dp.actions if isinstance(msg := self._apply(body, ref, a), str)]
            if dp.timed_out:
                self.events(body, "Warning", "FinalizerTimeout",
                            f"pods still terminating after {self.cfg.finalizer_timeout_seconds:g} s; "
                            "finalizer removed")
            if dp.done:
                self._later.cancel((ref.namespace, ref.name))
                with self._guard:
                    self._disrupted.pop(ref.uid, None)
                    self._listed.pop(ref.uid, None)
                    self._missing_since.pop(ref.uid, None)
                self.metrics.forget(ref.namespace, ref.name)
                self._locks.pop((ref.namespace, ref.name), None)
            elif failures:
                raise ReconcileError("; ".join(failures))
            return dp.done
