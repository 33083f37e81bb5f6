"""The pure planner: ``(job, desired, observed, now) -> Plan`` (actions, status, events).

Phases: ``Pending -> Initializing -> Running -> Succeeded | Failed``, plus ``Suspended``,
``Restarting`` and ``ValidationFailed``. The operator is the single writer of every status field
except ``training`` (the driver's; see ``asyncrl.api.status``); conditions are recomputed here
as a whole list on every reconcile, keeping ``lastTransitionTime`` when a status does not change.

Failure policy:
- a lost or failed **rollout** pod is replaced alone (not counted);
- a lost or failed **driver, actor or old-logit** pod restarts the whole job from its last
  checkpoint after a backoff, counted against ``runPolicy.backoffLimit``, unless the pod carries
  the ``DisruptionTarget`` condition (preemption, eviction): then it is counted in ``preemptions``;
- ``Succeeded``/``Failed`` are final: nothing is ever created again, running pods are deleted
  (GPUs freed), finished pods stay for their logs until ``ttlSecondsAfterFinished``.
"""

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.pods import MaskGuardAction
from asyncrl.api.status import Phase, SyncPhase, TrainingSummary, parse_time, rfc3339
from asyncrl.api.validation import SpecError
from asyncrl.operator import names
from asyncrl.operator.builders import Desired, JobRef
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.names import Role

ACTIVE = (Phase.PENDING, Phase.INITIALIZING, Phase.RUNNING, Phase.RESTARTING)
PRE_RUNNING = (Phase.PENDING, Phase.INITIALIZING, Phase.RESTARTING)
CONDITION_TYPES = ("SpecValid", "PodsReady", "Running", "Suspended", "Restarting", "Degraded",
                   "Succeeded", "Failed")


# ---------------------------------------------------------------- inputs

@dataclass(frozen=True)
class PodView:
    """What the planner needs to know about one observed pod."""

    name: str
    role: Role | None
    index: int
    epoch: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool
    terminating: bool
    disrupted: bool  # DisruptionTarget=True: preempted or evicted, not the job's fault
    reason: str = ""

    @classmethod
    def from_manifest(cls, pod: dict[str, Any]) -> "PodView":
        meta, status = pod.get("metadata", {}), pod.get("status") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        try:
            role: Role | None = Role(labels.get(names.LABEL_ROLE, ""))
        except ValueError:
            role = None
        reason = status.get("reason") or ""
        for cs in status.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term.get("exitCode"):
                reason = reason or f"exit code {term['exitCode']} ({term.get('reason', 'Error')})"
        return cls(
            name=meta.get("name", ""),
            role=role,
            index=int(labels.get(names.LABEL_INDEX, "0") or 0),
            epoch=int(annotations.get(names.ANNOTATION_EPOCH, "0") or 0),
            phase=status.get("phase") or "Pending",
            ready=(conds.get("Ready") or {}).get("status") == "True",
            terminating=bool(meta.get("deletionTimestamp")),
            disrupted=(conds.get("DisruptionTarget") or {}).get("status") == "True",
            reason=reason,
        )


@dataclass(frozen=True)
class Observed:
    """The job's children as listed from the API server."""

    pods: dict[str, PodView] = field(default_factory=dict)
    # (kind, name) -> object; None when not read this time (then children are not checked)
    children: dict[tuple[str, str], dict[str, Any]] | None = field(default_factory=dict)


@dataclass(frozen=True)
class JobView:
    """The AsyncRLJob as read from the API server."""

    ref: JobRef
    generation: int
    status: dict[str, Any]


# ---------------------------------------------------------------- outputs

@dataclass(frozen=True)
class Action:
    """One API call. ``kind`` ``AsyncRLJob`` means the job itself (suspend patch, TTL delete)."""

    verb: Literal["create", "delete", "patch"]
    kind: str
    name: str
    body: dict[str, Any] | None = None
    reason: str = ""  # event reason on success; "FailedTo<reason>" on failure
    message: str = ""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    counted_restarts: int = 0
    preemptions: int = 0

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


# ---------------------------------------------------------------- the planner

OPERATOR_FIELDS = ("phase", "reason", "message", "observedGeneration", "conditions", "replicas", "restarts",
                   "preemptions", "rolloutReplacements", "epoch", "startTime", "attemptStartTime",
                   "completionTime", "restartAfter", "syncPhase")


def plan(
    job: JobView,
    spec: AsyncRLJobSpec | SpecError,
    desired: Desired | None,
    observed: Observed,
    now: dt.datetime,
    settings: OperatorSettings,
) -> Plan:
    """Everything to do for one job now. ``desired`` is None exactly when ``spec`` is a SpecError."""
    return _Planner(job, spec, desired, observed, now, settings).run()


class _Planner:
    def __init__(self, job: JobView, spec: AsyncRLJobSpec | SpecError, desired: Desired | None,
                 observed: Observed, now: dt.datetime, settings: OperatorSettings) -> None:
        self.job, self.spec, self.desired, self.obs, self.now, self.cfg = job, spec, desired, observed, now, settings
        self.prev = job.status or {}
        self.st: dict[str, Any] = {k: self.prev[k] for k in OPERATOR_FIELDS if k in self.prev}
        self.st.setdefault("restarts", 0)
        self.st.setdefault("preemptions", 0)
        self.st.setdefault("rolloutReplacements", 0)
        self.st.setdefault("epoch", 0)
        self.out = Plan()
        self.degraded: tuple[str, str, str] = ("False", "NoTrainingReport", "the driver has not reported yet")
        self.restart_cause = ""

    # -- helpers
    @property
    def phase(self) -> Phase:
        try:
            return Phase(self.st.get("phase") or Phase.PENDING)
        except ValueError:
            return Phase.PENDING

    def _set_phase(self, phase: Phase, reason: str, message: str) -> None:
        if phase is not self.phase or not self.st.get("phase"):
            warn = phase in (Phase.FAILED, Phase.RESTARTING, Phase.VALIDATION_FAILED)
            self.out.events.append(Event("Warning" if warn else "Normal", reason, message))
        self.st.update(phase=phase.value, reason=reason, message=message)

    def _now(self) -> str:
        return rfc3339(self.now)

    def _elapsed(self, key: str) -> float | None:
        t = parse_time(self.st.get(key))
        return None if t is None else (self.now - t).total_seconds()

    def _delete_pod(self, p: PodView, reason: str, message: str) -> None:
        if not p.terminating:
            self.out.actions.append(Action("delete", "Pod", p.name, reason=reason, message=message))

    def _create_pod(self, name: str, reason: str, message: str) -> None:
        assert self.desired is not None
        self.out.actions.append(Action("create", "Pod", name, self.desired.pods[name].manifest, reason, message))

    def _fail(self, reason: str, message: str) -> None:
        self._set_phase(Phase.FAILED, reason, message)
        self.st["completionTime"] = self._now()
        self.st.pop("restartAfter", None)

    # -- main
    def run(self) -> Plan:
        if self.phase.terminal:
            self._terminal()
        elif isinstance(self.spec, SpecError):
            self._invalid(self.spec)
        else:
            self._ensure_children()
            self._training(self.spec)
            if not self.phase.terminal:
                self._active(self.spec)
            if self.phase.terminal:
                self._terminal()
        self._replicas()
        self.st["observedGeneration"] = self.job.generation
        self.st["conditions"] = self._conditions()
        self.out.status = self.st
        return self.out

    def _invalid(self, err: SpecError) -> None:
        paths = "; ".join(str(p) for p in err.problems)
        self._set_phase(Phase.VALIDATION_FAILED, "ValidationFailed", f"spec refused, no pod created: {paths}")
        for p in self.obs.pods.values():
            self._delete_pod(p, "DeletedPod", f"spec is invalid: {paths}")

    def _terminal(self) -> None:
        # Final: never create. Free GPUs now; keep finished pods for their logs until the TTL.
        for p in self.obs.pods.values():
            if p.phase not in ("Succeeded", "Failed"):
                self._delete_pod(p, "DeletedPod", f"job is {self.phase.value}; freeing its resources")
        ttl = None if isinstance(self.spec, SpecError) else self.spec.run_policy.ttl_seconds_after_finished
        done = self._elapsed("completionTime")
        if ttl is not None and done is not None:
            if done >= ttl:
                self.out.actions.append(Action("delete", "AsyncRLJob", self.job.ref.name, reason="DeletedJob",
                                               message=f"ttlSecondsAfterFinished={ttl} elapsed"))
            else:
                self.out.requeue(ttl - done)

    def _ensure_children(self) -> None:
        assert self.desired is not None
        if self.obs.children is None:
            return
        for child in self.desired.children:
            seen = self.obs.children.get((child.kind, child.name))
            if seen is None:
                self.out.actions.append(Action("create", child.kind, child.name, child.manifest,
                                               f"Created{child.kind}", f"created {child.kind} {child.name}"))
            elif child.kind == "ConfigMap" and seen.get("data") != child.manifest["data"]:
                self.out.actions.append(Action("patch", child.kind, child.name, {"data": child.manifest["data"]},
                                               f"Updated{child.kind}", "job spec changed"))

    # -- training summary: mask guard and sync phase
    def _training(self, spec: AsyncRLJobSpec) -> None:
        raw = self.prev.get("training")
        if not raw:
            return
        try:
            tr = TrainingSummary.model_validate(raw)
        except ValueError as exc:
            self.degraded = ("Unknown", "BadTrainingReport", f"status.training is malformed: {exc}"[:300])
            return
        self._mask_guard(spec, tr)
        self._sync_phase(spec, tr)

    def _mask_guard(self, spec: AsyncRLJobSpec, tr: TrainingSummary) -> None:
        guard = spec.monitoring.mask_guard
        self.degraded = ("False", "Healthy", "keep ratio within bounds")
        if not guard.enabled or tr.keep_ratio is None:
            return
        prev = _condition(self.prev, "Degraded")
        was = prev.get("reason") if prev.get("status") == "True" else None
        k = tr.keep_ratio
        if k < guard.critical_keep_ratio:
            msg = (f"keep ratio {k:.3f} < criticalKeepRatio {guard.critical_keep_ratio} at policy version "
                   f"{tr.policy_version}; action {guard.action.value}")
            self.degraded = ("True", "MaskCollapse", msg)
            if was != "MaskCollapse":
                self.out.events.append(Event("Warning", "MaskCollapseDetected", msg))
                if guard.action is MaskGuardAction.SUSPEND and not spec.run_policy.suspend:
                    self.out.actions.append(Action("patch", "AsyncRLJob", self.job.ref.name,
                                                   {"spec": {"runPolicy": {"suspend": True}}},
                                                   "SuspendedByMaskGuard", msg))
            if guard.action is MaskGuardAction.FAIL and self.phase in ACTIVE:
                self._fail("MaskCollapse", msg)
        elif k < guard.warn_keep_ratio:
            msg = f"keep ratio {k:.3f} < warnKeepRatio {guard.warn_keep_ratio} at policy version {tr.policy_version}"
            self.degraded = ("True", "MaskDegrading", msg)
            if was not in ("MaskDegrading", "MaskCollapse"):
                self.out.events.append(Event("Warning", "MaskDegrading", msg))
        elif was is not None:
            self.out.events.append(Event("Normal", "MaskRecovered", f"keep ratio {k:.3f} back above thresholds"))

    def _sync_phase(self, spec: AsyncRLJobSpec, tr: TrainingSummary) -> None:
        if tr.sync_phase is None:
            self.st.pop("syncPhase", None)
            return
        prev = self.prev.get("syncPhase") or {}
        timed_out = bool(prev.get("timedOut")) and prev.get("since") == tr.sync_phase_since \
            and prev.get("phase") == tr.sync_phase.value
        since = parse_time(tr.sync_phase_since)
        limit = spec.old_logits.interrupt_sync.phase_timeout_seconds
        if tr.sync_phase is not SyncPhase.IDLE and since is not None and not timed_out:
            took = (self.now - since).total_seconds()
            if took > limit:
                timed_out = True
                self.out.events.append(Event("Warning", "SyncPhaseTimeout",
                                             f"interrupt-sync phase {tr.sync_phase.value} running for {took:.0f} s "
                                             f"> phaseTimeoutSeconds {limit}"))
        sp: dict[str, Any] = {"phase": tr.sync_phase.value, "timedOut": timed_out}
        if tr.sync_phase_since:
            sp["since"] = tr.sync_phase_since
        self.st["syncPhase"] = sp

    # -- the active state machine
    def _active(self, spec: AsyncRLJobSpec) -> None:
        assert self.desired is not None
        pods = self.obs.pods
        rp = spec.run_policy
        if rp.suspend:
            if self.phase is not Phase.SUSPENDED:
                self._set_phase(Phase.SUSPENDED, "Suspended", "runPolicy.suspend is true: pods deleted, "
                                "checkpoint kept")
                self.st.pop("restartAfter", None)
            for p in pods.values():
                self._delete_pod(p, "DeletedPod", "job suspended")
            return
        if self.phase is Phase.VALIDATION_FAILED:
            self._set_phase(Phase.PENDING, "Validated", "the corrected spec was accepted")
        if self.phase is Phase.SUSPENDED:
            self._set_phase(Phase.PENDING, "Resumed", "runPolicy.suspend is false: resuming from the last checkpoint")
            self.st.pop("startTime", None)  # activeDeadlineSeconds counts from the resume

        if self._deadlines(rp.active_deadline_seconds, rp.pre_running_deadline_seconds):
            return

        if self.phase is Phase.PENDING:
            self._start_pods("creating the job's pods")
            return
        if self.phase is Phase.RESTARTING:
            self._restarting()
            return

        # Initializing / Running: watch every desired pod.
        epoch = int(self.st["epoch"])
        driver = pods.get(names.pod_name(self.job.ref.name, Role.DRIVER, 0))
        if driver is not None and driver.phase == "Succeeded" and driver.epoch == epoch:
            self._set_phase(Phase.SUCCEEDED, "Completed", "the driver finished training")
            self.st["completionTime"] = self._now()
            return
        lost = [(n, s) for n, s in self.desired.pods.items() if s.role.gang
                and (n not in pods or pods[n].phase == "Failed" or pods[n].epoch != epoch)]
        if lost:
            self._gang_failure(lost)
            return
        for name in self.desired.pods:  # only rollout pods can be missing here: replace alone
            seen = pods.get(name)
            if seen is None:
                self.st["rolloutReplacements"] = int(self.st["rolloutReplacements"]) + 1
                self._create_pod(name, "ReplacedRolloutPod", f"rollout pod {name} was lost; replaced alone")
            elif seen.phase == "Failed" or seen.epoch != epoch:
                self._delete_pod(seen, "DeletedFailedRolloutPod",
                                 f"rollout pod {name} failed ({seen.reason or seen.phase}); it is replaced alone")
                self.out.requeue(1.0)
        for extra in pods.values():  # scaled down, or not ours any more
            if extra.name not in self.desired.pods:
                self._delete_pod(extra, "DeletedPod", f"pod {extra.name} is not desired (spec changed)")
        ready = all(pods.get(n) is not None and pods[n].phase == "Running" and pods[n].ready
                    for n in self.desired.pods)
        if ready and self.phase is Phase.INITIALIZING:
            self._set_phase(Phase.RUNNING, "PodsReady", "all pods are running and ready")

    def _deadlines(self, active: int | None, pre_running: int | None) -> bool:
        started = self._elapsed("startTime")
        if active is not None and started is not None and started > active:
            self._fail("DeadlineExceeded", f"activeDeadlineSeconds={active} exceeded ({started:.0f} s)")
            return True
        attempt = self._elapsed("attemptStartTime")
        if pre_running is not None and self.phase in PRE_RUNNING and attempt is not None and attempt > pre_running:
            waiting = sorted({p.reason for p in self.obs.pods.values() if p.reason and p.phase != "Running"})
            detail = f"; pod reasons: {', '.join(waiting)}" if waiting else ""
            self._fail("PreRunningDeadlineExceeded",
                       f"pods not all running {attempt:.0f} s after creation > preRunningDeadlineSeconds="
                       f"{pre_running}{detail}")
            return True
        if active is not None and started is not None:
            self.out.requeue(active - started)
        if pre_running is not None and attempt is not None and self.phase in PRE_RUNNING:
            self.out.requeue(pre_running - attempt)
        return False

    def _start_pods(self, message: str) -> None:
        assert self.desired is not None
        for name, p in self.obs.pods.items():
            if name not in self.desired.pods:
                self._delete_pod(p, "DeletedPod", f"pod {name} is not desired")
        for name in self.desired.pods:
            if name not in self.obs.pods:
                self._create_pod(name, "CreatedPod", f"created pod {name}")
        self.st.setdefault("startTime", self._now())
        self.st["attemptStartTime"] = self._now()
        self.st.pop("restartAfter", None)
        self._set_phase(Phase.INITIALIZING, "PodsCreated", message)

    def _gang_failure(self, lost: list[tuple[str, Any]]) -> None:
        pods = self.obs.pods
        lines, preempted = [], False
        for name, _slot in lost:
            p = pods.get(name)
            if p is None:
                lines.append(f"{name} was deleted")
            else:
                preempted = preempted or p.disrupted
                lines.append(f"{name} {p.phase}{' (preempted)' if p.disrupted else ''}"
                             f"{': ' + p.reason if p.reason else ''}")
        what = "; ".join(lines)
        if preempted:
            self.st["preemptions"] = int(self.st["preemptions"]) + 1
            self.out.preemptions += 1
            delay = self.cfg.restart_delay(1)
            cause, msg = "Preempted", f"{what}; restarting from the last checkpoint (preemption, not counted)"
        else:
            restarts = int(self.st["restarts"]) + 1
            limit = self.spec.run_policy.backoff_limit if isinstance(self.spec, AsyncRLJobSpec) else 0
            if restarts > limit:
                self._fail("BackoffLimitExceeded", f"{what}; backoffLimit={limit} reached")
                return
            self.st["restarts"] = restarts
            self.out.counted_restarts += 1
            delay = self.cfg.restart_delay(restarts)
            cause = "PodFailed"
            msg = f"{what}; restart {restarts}/{limit} from the last checkpoint in {delay:g} s"
        self.restart_cause = cause
        self.st["epoch"] = int(self.st["epoch"]) + 1
        self.st["restartAfter"] = rfc3339(self.now + dt.timedelta(seconds=delay))
        self._set_phase(Phase.RESTARTING, cause, msg)
        for p in pods.values():
            self._delete_pod(p, "DeletedPod", f"gang restart: {what}")
        self.out.requeue(delay)

    def _restarting(self) -> None:
        leftover = [p for p in self.obs.pods.values()]
        for p in leftover:
            self._delete_pod(p, "DeletedPod", "gang restart: old pods go first")
        if leftover:
            self.out.requeue(1.0)
            return
        after = parse_time(self.st.get("restartAfter"))
        if after is not None and after > self.now:
            self.out.requeue((after - self.now).total_seconds())
            return
        self._start_pods(f"restart (epoch {self.st['epoch']}): resuming from the last checkpoint")

    # -- status pieces
    def _replicas(self) -> None:
        if self.desired is None:
            return
        counts = {Role.ROLLOUT: [0, 0], Role.ACTOR: [0, 0]}
        driver_ready = False
        for name, slot in self.desired.pods.items():
            p = self.obs.pods.get(name)
            ok = p is not None and p.phase == "Running" and p.ready and not p.terminating
            if slot.role in counts:
                counts[slot.role][1] += 1
                counts[slot.role][0] += int(ok)
            elif slot.role is Role.DRIVER:
                driver_ready = ok
        (rr, rd), (ar, ad) = counts[Role.ROLLOUT], counts[Role.ACTOR]
        self.st["replicas"] = {"rollout": f"{rr}/{rd}", "actor": f"{ar}/{ad}", "rolloutReady": rr,
                               "rolloutDesired": rd, "actorReady": ar, "actorDesired": ad,
                               "driverReady": driver_ready}

    def _conditions(self) -> list[dict[str, Any]]:
        ph, reason, message = self.phase, self.st.get("reason", ""), self.st.get("message", "")
        all_ready = bool(self.desired) and all(
            (p := self.obs.pods.get(n)) is not None and p.ready and p.phase == "Running"
            for n in (self.desired.pods if self.desired else {}))

        def flag(on: bool, off_reason: str) -> tuple[str, str, str]:
            return ("True", reason, message) if on else ("False", off_reason, "")

        want: dict[str, tuple[str, str, str]] = {
            "SpecValid": ("False", "ValidationFailed", message) if ph is Phase.VALIDATION_FAILED
            else ("True", "Validated", "spec accepted"),
            "PodsReady": ("True", "AllPodsReady", "") if all_ready and not ph.terminal
            else ("False", "PodsNotReady", ""),
            "Running": flag(ph is Phase.RUNNING, "NotRunning"),
            "Suspended": flag(ph is Phase.SUSPENDED, "NotSuspended"),
            "Restarting": flag(ph is Phase.RESTARTING, "NotRestarting"),
            "Degraded": self.degraded,
            "Succeeded": flag(ph is Phase.SUCCEEDED, "NotSucceeded"),
            "Failed": flag(ph in (Phase.FAILED,), "NotFailed"),
        }
        out = []
        for ctype in CONDITION_TYPES:
            status, why, msg = want[ctype]
            old = _condition(self.prev, ctype)
            changed = old.get("status") != status
            out.append({
                "type": ctype,
                "status": status,
                "reason": why or ctype,
                "message": msg or "",
                "lastTransitionTime": self._now() if changed or not old.get("lastTransitionTime")
                else old["lastTransitionTime"],
                "observedGeneration": self.job.generation,
            })
        return out


def _condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return {}


# ---------------------------------------------------------------- deletion (finalizer)

@dataclass(frozen=True)
class DeletionPlan:
    actions: list[Action]
    done: bool  # the finalizer may go
    timed_out: bool  # it goes although pods remain (force-deleted)


def plan_deletion(observed: Observed, deleting_for: float, timeout: float) -> DeletionPlan:
    """Delete pods at once (GPUs); other children follow by owner reference. Give up after ``timeout``."""
    remaining = list(observed.pods.values())
    if not remaining:
        return DeletionPlan([], done=True, timed_out=False)
    if deleting_for >= timeout:
        force = [Action("delete", "Pod", p.name, {"gracePeriodSeconds": 0}, "ForceDeletedPod",
                        f"finalizer timeout {timeout:g} s: force-deleting") for p in remaining]
        return DeletionPlan(force, done=True, timed_out=True)
    acts = [Action("delete", "Pod", p.name, None, "DeletedPod", "job deleted") for p in remaining if not p.terminating]
    return DeletionPlan(acts, done=False, timed_out=False)
