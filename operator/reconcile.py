"""Glue between the API and the pure planner: read, plan, apply, write status, post events.

One writer per job: every path (create/update/resume handlers, the resync timer, pod events)
goes through :meth:`Reconciler.reconcile`, serialised by a per-job lock, so the status and its
conditions are always written by one place from one fresh read.
"""

import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from kubernetes.client import ApiException

from asyncrl.api.constants import API_VERSION, KIND
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.validation import SpecError, validate_job
from asyncrl.operator import builders, names
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.kube import Kube
from asyncrl.operator.lifecycle import (
    OPERATOR_FIELDS,
    Action,
    JobView,
    Observed,
    Plan,
    PodView,
    plan,
    plan_deletion,
)
from asyncrl.operator.metrics import OperatorMetrics

log = logging.getLogger("asyncrl.operator")
EventSink = Callable[[dict[str, Any], str, str, str], None]  # (job body, type, reason, message)
CHILD_KINDS = ("ConfigMap", "Service", "ServiceAccount", "Role", "RoleBinding")


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
    """Merge patch of the operator's fields (None deletes); empty when nothing changed."""
    patch = {k: v for k, v in new.items() if k in OPERATOR_FIELDS and old.get(k) != v}
    patch.update({k: None for k in OPERATOR_FIELDS if k in old and k not in new})
    return patch


class Reconciler:
    def __init__(self, cfg: OperatorSettings, kube: Kube, metrics: OperatorMetrics, events: EventSink,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.cfg, self.kube, self.metrics, self.events, self.clock = cfg, kube, metrics, events, clock
        self._locks: defaultdict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
        self._guard = threading.Lock()
        self._waiting: set[tuple[str, str]] = set()
        self._full: dict[tuple[str, str], bool] = {}
        self._later: dict[tuple[str, str], tuple[float, threading.Timer]] = {}
        self._closed = False

    def observe(self, ref: builders.JobRef, children: bool = True) -> Observed:
        """List the job's pods and, when ``children``, read its other children (five GETs)."""
        pods = [PodView.from_manifest(p) for p in self.kube.list_pods(ref.namespace, names.selector_string(ref.name))]
        if not children:
            return Observed(pods={p.name: p for p in pods}, children=None)
        wanted = {"ConfigMap": names.configmap_name(ref.name), "Service": names.service_name(ref.name),
                  "ServiceAccount": names.status_account_name(ref.name), "Role": names.status_account_name(ref.name),
                  "RoleBinding": names.status_account_name(ref.name)}
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for kind in CHILD_KINDS:
            obj = self.kube.get(kind, ref.namespace, wanted[kind])
            if obj is not None:
                found[(kind, wanted[kind])] = obj
        return Observed(pods={p.name: p for p in pods}, children=found)

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
            except ApiException:
                self.metrics.reconcile_errors.labels("api").inc()
                raise
            except ReconcileError:
                self.metrics.reconcile_errors.labels("api").inc()
                raise
            except Exception:
                self.metrics.reconcile_errors.labels("unexpected").inc()
                raise

    def _reconcile(self, namespace: str, name: str, full: bool) -> Plan | None:
        body = self.kube.get_job(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        ref = job_ref(body)
        status = body.get("status") or {}
        spec = parse_spec(body)
        desired = None if isinstance(spec, SpecError) else builders.desired(
            ref, spec, self.cfg, int(status.get("epoch") or 0))
        observed = self.observe(ref, children=full)
        view = JobView(ref, int(body["metadata"].get("generation") or 1), status)
        p = plan(view, spec, desired, observed, self.clock(), self.cfg)
        failures = [msg for a in p.actions if (msg := self._apply(body, a))]
        for ev in p.events:
            self.events(body, ev.type, ev.reason, ev.message)
        patch = status_patch(status, p.status)
        if patch:
            self.kube.patch_job_status(namespace, name, patch)
        self.metrics.observe_phase(namespace, name, p.status.get("phase", "Pending"))
        self.metrics.restarted(namespace, name, "failure", p.counted_restarts)
        self.metrics.restarted(namespace, name, "preemption", p.preemptions)
        if p.requeue_after is not None and p.requeue_after < self.cfg.resync_seconds:
            self._schedule(namespace, name, p.requeue_after)
        if failures:
            raise ReconcileError("; ".join(failures))
        return p

    def _schedule(self, namespace: str, name: str, delay: float) -> None:
        """Reconcile again after ``delay`` s (a restart backoff, a deadline) whatever triggered this
        one: pod events cannot ask kopf to retry. One pending timer per job, the earliest wins."""
        key = (namespace, name)
        due = time.monotonic() + max(delay, 0.05)
        with self._guard:
            if self._closed:
                return
            pending = self._later.get(key)
            if pending is not None and pending[0] <= due:
                return
            if pending is not None:
                pending[1].cancel()
            timer = threading.Timer(max(delay, 0.05), self._fire, (namespace, name))
            timer.daemon = True
            self._later[key] = (due, timer)
        timer.start()

    def _fire(self, namespace: str, name: str) -> None:
        with self._guard:
            self._later.pop((namespace, name), None)
        try:
            self.reconcile(namespace, name, children=False)
        except Exception as exc:  # the resync timer retries
            log.warning("scheduled reconcile of %s/%s failed: %s", namespace, name, exc)

    def close(self) -> None:
        """Cancel every scheduled reconcile (operator shutdown)."""
        with self._guard:
            self._closed = True
            for _, timer in self._later.values():
                timer.cancel()
            self._later.clear()

    def _apply(self, body: dict[str, Any], a: Action) -> str | None:
        """Run one action; post its event. Returns an error message instead of raising."""
        ns = body["metadata"]["namespace"]
        try:
            if a.kind == "AsyncRLJob":
                if a.verb == "delete":
                    self.kube.delete_job(ns, a.name)
                else:
                    self.kube.patch_job(ns, a.name, a.body or {})
            elif a.verb == "create":
                self.kube.create(a.kind, ns, a.body or {})
            elif a.verb == "patch":
                self.kube.patch(a.kind, ns, a.name, a.body or {})
            else:
                grace = (a.body or {}).get("gracePeriodSeconds")
                self.kube.delete(a.kind, ns, a.name, grace)
        except ApiException as exc:
            if (a.verb == "create" and exc.status == 409) or (a.verb == "delete" and exc.status == 404):
                return None  # already done (e.g. by an operator instance before a restart)
            msg = f"{a.verb} {a.kind} {a.name} failed: {exc.status} {exc.reason}"
            self.events(body, "Warning", f"FailedTo{a.verb.capitalize()}{a.kind}", msg)
            return msg
        self.events(body, "Normal", a.reason, a.message)
        return None

    def finalize(self, body: dict[str, Any]) -> bool:
        """Delete handler: True when the finalizer may go (pods gone, or the timeout passed)."""
        ref = job_ref(body)
        with self._locks[(ref.namespace, ref.name)]:
            deleting = body["metadata"].get("deletionTimestamp")
            started = dt.datetime.fromisoformat(deleting.replace("Z", "+00:00")) if deleting else self.clock()
            observed = Observed(pods={p.name: p for p in map(
                PodView.from_manifest, self.kube.list_pods(ref.namespace, names.selector_string(ref.name)))})
            dp = plan_deletion(observed, (self.clock() - started).total_seconds(), self.cfg.finalizer_timeout_seconds)
            failures = [msg for a in dp.actions if (msg := self._apply(body, a))]
            if dp.timed_out:
                self.events(body, "Warning", "FinalizerTimeout",
                            f"pods still terminating after {self.cfg.finalizer_timeout_seconds:g} s; "
                            "finalizer removed")
            if dp.done:
                with self._guard:
                    pending = self._later.pop((ref.namespace, ref.name), None)
                if pending is not None:
                    pending[1].cancel()
                self.metrics.forget(ref.namespace, ref.name)
                self._locks.pop((ref.namespace, ref.name), None)
            elif failures:
                raise ReconcileError("; ".join(failures))
            return dp.done
