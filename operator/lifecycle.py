"""The pure planner: ``(job, desired, observed, now) -> Plan`` (actions, status, events).

Phases: ``Pending -> Initializing -> Running -> Succeeded | Failed``, plus ``Suspended``,
``Restarting`` and ``ValidationFailed``. The operator is the single writer of every status field
except ``training`` (the driver's; see ``asyncrl.api.status``), and the ``job.status`` it plans from
holds its own copy of those fields, not what the driver's token may have written there
(``asyncrl.operator.status_guard``), read as a typed :class:`~asyncrl.api.status.JobStatus`
(``asyncrl.api.status.read_status``); the plan's status is one too, serialised by the reconciler.
Conditions are recomputed here as a whole list on every reconcile, keeping ``lastTransitionTime``
when a status does not change.

Failure policy:
- a lost or failed **rollout** pod is replaced alone (not counted);
- a lost or failed **driver, actor or old-logit** pod restarts the whole job from its last
  checkpoint (from scratch without a checkpoint volume) after a backoff, counted against
  ``runPolicy.backoffLimit``, unless the pod was preempted or evicted (``DisruptionTarget``, also
  when the pod is already terminating or gone): then it is counted in ``preemptions`` against
  ``runPolicy.preemptionLimit``. A pod that vanished from the list with no disruption known is judged
  ``VANISHED_SETTLE_SECONDS`` later, once its DELETED event (its last state) has had time to arrive;
- a driver that exits with code 2 refused its spec: the job fails at once (``InvalidSpec``);
- a pod-shaping spec edit (the pods' spec-hash annotation differs) restarts the gang on purpose
  (``SpecChanged``, not counted); ``runPolicy`` and ``monitoring.maskGuard`` edits restart nothing;
- a create the API server refuses (quota, admission) is the ``FailedCreate`` condition, retried
  with backoff (:func:`fold_create_failures`), never a lost pod;
- a child of the job's name owned by someone else is never adopted, patched or deleted: the
  ``ChildConflict`` condition names it and no pod is started while it lasts;
- ``status.agentEndpoint`` is the agent endpoint's in-cluster base URL while the job has
  ``spec.task.agent: external``, its Service ``<job>-agent`` exists and the job is not final
  (``asyncrl.operator.agent_endpoint``); an external agent's session key Secret is created once and never
  patched (as every Secret: :func:`_child_patch`);
- ``Succeeded``/``Failed`` are final: nothing is ever created again, running pods are deleted
  (GPUs freed), finished pods stay for their logs until ``ttlSecondsAfterFinished``;
- an interrupt-sync phase (other than ``Idle``) the driver reported longer ago than
  ``oldLogits.interruptSync.phaseTimeoutSeconds`` is ``SyncStuck`` (one Warning event, counted in
  ``Plan.sync_stuck``) until the driver reports another phase; a running phase is requeued for the
  moment it would time out, since a hung driver sends nothing that would wake the operator.
"""

import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Literal

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.pods import MaskGuardAction
from asyncrl.api.status import (
    Condition,
    JobStatus,
    Phase,
    ReplicaCounts,
    SyncPhase,
    SyncPhaseStatus,
    TrainingSummary,
    parse_time,
    rfc3339,
)
from asyncrl.api.validation import SpecError
from asyncrl.operator import agent_endpoint, names
from asyncrl.operator.builders import Child, Desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.names import Role
from asyncrl.operator.observed import (
    MESSAGE_LIMIT,
    STUCK_REASON,
    WAITING_FAMILY,
    JobView,
    Observed,
    PodView,
    by_reason,
    owned_by,
    owner_of,
    reason_text,
    stuck_pods,
    stuck_text,
)

ACTIVE = (Phase.PENDING, Phase.INITIALIZING, Phase.RUNNING, Phase.RESTARTING)
CONDITION_TYPES = ("SpecValid", "PodsReady", "Running", "Suspended", "Restarting", "Degraded", "FailedCreate",
                   "ChildConflict", "SyncStuck", "Succeeded", "Failed")
SYNC_STUCK_REASON = "SyncPhaseTimeout"
# A gang pod gone from the list, with no disruption known, is judged after this long: its DELETED event
# (the pod's last state) may trail the list, and it tells a preemption from a deletion.
VANISHED_SETTLE_SECONDS = 5.0
INVALID_SPEC_EXIT_CODE = 2  # ``asyncrl driver`` (trainer/cli/commands.py): the spec is refused, retrying cannot help


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
    api_version: str = "v1"


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    status: JobStatus = field(default_factory=JobStatus)  # the operator's fields (training: None, the driver's)
    events: list[Event] = field(default_factory=list)
    requeue_after: float | None = None
    counted_restarts: int = 0
    preemptions: int = 0
    spec_restarts: int = 0
    sync_stuck: int = 0  # interrupt-sync phases found stuck now (operator counter)

    def requeue(self, seconds: float) -> None:
        seconds = max(seconds, 0.0)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)


@dataclass(frozen=True)
class CreateFailure:
    """A create the API server refused: ``code`` is the HTTP status, ``message`` the server's own words.
    ``conflict``: the name is taken by an object this job does not own (409 after a read). ``held``: a pod
    create not sent because a child it needs was refused in the same pass (:func:`hold_pods`); ``code`` is
    then 0 and ``message`` names what it waits for."""

    kind: str
    name: str
    code: int
    message: str
    conflict: bool = False
    held: bool = False

    def describe(self) -> str:
        return f"{self.kind} {self.name}: {self.message}" if self.held else \
            f"{self.kind} {self.name}: {self.code} {self.message}"


# The children a pod of the job refers to: the spec ConfigMap (a volume), the Ray token Secret (an env
# secretKeyRef), the driver's ServiceAccount and the Role and RoleBinding its status sidecar writes with, the
# headless Service whose DNS names Ray joins through. A pod created while one of them is missing cannot start:
# the server refuses it (no ServiceAccount), or the kubelet retries its mount with a backoff that reaches
# minutes. (A NetworkPolicy or a PodGroup is not one: a pod runs without it.)
PREREQUISITE_KINDS = frozenset({"ConfigMap", "Secret", "ServiceAccount", "Role", "RoleBinding", "Service"})


def children_first(actions: list[Action]) -> list[Action]:
    """``actions`` with the pod creates moved to the end (a stable order otherwise): a pass creates the
    children its pods refer to before the pods."""
    return sorted(actions, key=lambda a: a.kind == "Pod" and a.verb == "create")


def hold_pods(pod_creates: list[Action], missing: list[str]) -> list[CreateFailure]:
    """The pod creates of a pass in which the children ``missing`` (``"<Kind> <name>"``, each of
    :data:`PREREQUISITE_KINDS`) were refused or failed: none is sent, each comes back as a held
    :class:`CreateFailure`, so the pass's ``FailedCreate`` condition and backoff retry them with those children
    (a missing pod is then a create still to make, never a lost pod)."""
    if not missing:
        return []
    waits = f"not sent until {', '.join(missing)} can be created (refused or failed in the same pass)"
    return [CreateFailure(a.kind, a.name, 0, waits, held=True) for a in pod_creates]


# ---------------------------------------------------------------- the planner


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


def resume_point(spec: AsyncRLJobSpec) -> str:
    """Where a (re)started gang continues: only a checkpoint volume survives the pods."""
    return "from the last checkpoint" if spec.checkpoint.volume_claim_name else "from scratch (no checkpoint volume)"


class _Planner:
    def __init__(self, job: JobView, spec: AsyncRLJobSpec | SpecError, desired: Desired | None,
                 observed: Observed, now: dt.datetime, settings: OperatorSettings) -> None:
        self.job, self.spec, self.desired, self.obs, self.now, self.cfg = job, spec, desired, observed, now, settings
        self.prev = job.status
        # The status to write: the operator's fields of the last one, brought up to date below.
        self.st = job.status.model_copy(update={"training": None}, deep=True)
        self.out = Plan()
        self.degraded: tuple[str, str, str] = ("False", "NoTrainingReport", "the driver has not reported yet")
        self.conflicts: list[str] | None = None  # None: children not read this time (keep the last verdict)
        self.waiting: list[tuple[str, str, str]] = []  # (pod, reason, message) of pods stuck before running
        # The last pod create failed (quota, admission): missing pods are not-yet-created, not lost.
        self.create_failing = _is_true(_condition(self.prev, "FailedCreate"))
        self.create_retry_due = False  # missing pods still wait for the create backoff
        self.sync_stuck: str | None = None  # the SyncStuck message, when a phase timed out now

    # -- helpers
    @property
    def phase(self) -> Phase:
        return self.st.phase or Phase.PENDING  # none yet (or one read_status could not read): Pending

    def _set_phase(self, phase: Phase, reason: str, message: str) -> None:
        if phase is not self.phase or self.st.phase is None:
            warn = phase in (Phase.FAILED, Phase.RESTARTING, Phase.VALIDATION_FAILED)
            self.out.events.append(Event("Warning" if warn else "Normal", reason, message))
        self.st.phase, self.st.reason, self.st.message = phase, reason, message

    def _now(self) -> str:
        return rfc3339(self.now)

    def _elapsed(self, since: str | None) -> float | None:
        t = parse_time(since)
        return None if t is None else (self.now - t).total_seconds()

    def _delete_pod(self, p: PodView, reason: str, message: str) -> None:
        if not p.terminating:
            self.out.actions.append(Action("delete", "Pod", p.name, reason=reason, message=message))

    def _create_pod(self, name: str, reason: str, message: str) -> None:
        assert self.desired is not None
        self.out.actions.append(Action("create", "Pod", name, self.desired.pods[name].manifest, reason, message))

    def _fail(self, reason: str, message: str) -> None:
        self._set_phase(Phase.FAILED, reason, message)
        self.st.completion_time = self._now()
        self.st.restart_after = None

    def _resume_point(self) -> str:
        return resume_point(self.spec) if isinstance(self.spec, AsyncRLJobSpec) else "from scratch"

    # -- main
    def run(self) -> Plan:
        if self.phase.terminal:
            self._terminal()
        elif isinstance(self.spec, SpecError):
            self._invalid(self.spec)
        else:
            self._ensure_children()
            self._agent_endpoint(self.spec)
            self._training(self.spec)
            if not self.phase.terminal:
                self._active(self.spec)
            if self.phase.terminal:
                self._terminal()
        self._replicas()
        self._waiting_reasons()
        self._remember_disruptions()
        if not self.create_retry_due and self.phase is not Phase.RESTARTING:
            self.st.restart_after = None  # no create backoff pending any more
        self.st.observed_generation = self.job.generation
        self.st.conditions = self._conditions()
        self.out.status = self.st
        return self.out

    def _remember_disruptions(self) -> None:
        """Persist the disruptions of the current epoch's pods (a pod seen with DisruptionTarget may be gone
        by the next look, and the operator may restart in between): ``status.disruptedPods``."""
        epoch = self.st.epoch
        seen = set(self.obs.disrupted) | {(p.name, p.epoch) for p in self.obs.pods.values() if p.disrupted}
        self.st.disrupted_pods = sorted(f"{name}@{e}" for name, e in seen if e >= epoch)  # none: no field

    def _invalid(self, err: SpecError) -> None:
        paths = "; ".join(str(p) for p in err.problems)
        self._set_phase(Phase.VALIDATION_FAILED, "ValidationFailed", f"spec refused, no pod created: {paths}")
        for p in self.obs.pods.values():
            self._delete_pod(p, "DeletedPod", f"spec is invalid: {paths}")

    def _terminal(self) -> None:
        # Final: never create. Free GPUs now; keep finished pods for their logs until the TTL.
        self.st.agent_endpoint = None  # no worker serves it any more (the Service stays until the job goes)
        for p in self.obs.pods.values():
            if p.phase not in ("Succeeded", "Failed"):
                self._delete_pod(p, "DeletedPod", f"job is {self.phase.value}; freeing its resources")
        ttl = None if isinstance(self.spec, SpecError) else self.spec.run_policy.ttl_seconds_after_finished
        done = self._elapsed(self.st.completion_time)
        if ttl is not None and done is not None:
            if done >= ttl:
                self.out.actions.append(Action("delete", "AsyncRLJob", self.job.ref.name, reason="DeletedJob",
                                               message=f"ttlSecondsAfterFinished={ttl} elapsed"))
            else:
                self.out.requeue(ttl - done)

    def _ensure_children(self) -> None:
        """Create missing children; patch only our own (never a Secret); report names taken by others;
        delete our own children the spec no longer wants (another owner's object of that name is left alone)."""
        assert self.desired is not None
        if self.obs.children is None:
            return
        uid = self.job.ref.uid
        self.conflicts = [f"Pod/{n} exists and is owned by {owner}; rename the job or delete that pod"
                          for n, owner in sorted(self.obs.foreign_pods.items()) if n in self.desired.pods]
        for child in self.desired.children:
            seen = self.obs.children.get((child.kind, child.name))
            api_version = child.manifest.get("apiVersion", "v1")
            if seen is None:
                note = f": {child.note}" if child.note else ""
                self.out.actions.append(Action("create", child.kind, child.name, child.manifest,
                                               f"Created{child.kind}", f"created {child.kind} {child.name}{note}",
                                               api_version))
            elif not owned_by(seen, uid):
                self.conflicts.append(f"{child.kind}/{child.name} exists and is owned by {owner_of(seen)}; "
                                      "rename the job or delete it")
            elif (patch := _child_patch(child, seen)) is not None:
                self.out.actions.append(Action("patch", child.kind, child.name, patch,
                                               f"Updated{child.kind}", "job spec changed", api_version))
        for gone in self.desired.unwanted:
            seen = self.obs.children.get((gone.kind, gone.name))
            if seen is not None and owned_by(seen, uid) and not (seen.get("metadata") or {}).get("deletionTimestamp"):
                self.out.actions.append(Action("delete", gone.kind, gone.name, None, f"Deleted{gone.kind}",
                                               f"deleted {gone.kind} {gone.name}: {gone.why}", gone.api_version))

    def _agent_endpoint(self, spec: AsyncRLJobSpec) -> None:
        """``status.agentEndpoint``: the endpoint's base URL while the job has an agent and its Service
        ``<job>-agent`` is there (ours, not being deleted); none without an agent, nor while the Service is
        missing (created in this plan: the next reconcile sees it) or another owner's. Children not read
        this time: the last value stands (an agent the spec dropped clears it at once)."""
        ref = self.job.ref
        if not agent_endpoint.exposed(spec):  # no agent, or an in-process one (loopback, no Service)
            self.st.agent_endpoint = None
        elif self.obs.children is not None:
            seen = self.obs.children.get(("Service", names.agent_service_name(ref.name)))
            there = (seen is not None and owned_by(seen, ref.uid)
                     and not (seen.get("metadata") or {}).get("deletionTimestamp"))
            self.st.agent_endpoint = agent_endpoint.api_base(ref.name, ref.namespace, spec) if there else None

    @property
    def conflicted(self) -> bool:
        if self.conflicts is None:  # not read this time: the last full reconcile's verdict holds
            return _is_true(_condition(self.prev, "ChildConflict"))
        return bool(self.conflicts)

    # -- training summary: mask guard and sync phase
    def _training(self, spec: AsyncRLJobSpec) -> None:
        problem = self.job.unreadable.get("training")
        if problem is not None:  # read_status left a malformed report out
            self.degraded = ("Unknown", "BadTrainingReport", f"status.training is malformed: {problem}"[:300])
            return
        tr = self.prev.training
        if tr is None:
            return
        self._mask_guard(spec, tr)
        self._sync_phase(spec, tr)

    def _mask_guard(self, spec: AsyncRLJobSpec, tr: TrainingSummary) -> None:
        guard = spec.monitoring.mask_guard
        self.degraded = ("False", "Healthy", "keep ratio within bounds")
        if not guard.enabled or tr.keep_ratio is None:
            return
        prev = _condition(self.prev, "Degraded")
        was = prev.reason if prev is not None and prev.status == "True" else None
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
        """Surface the driver's interrupt-sync phase; one that outlives phaseTimeoutSeconds is stuck
        (``SyncStuck`` condition, one Warning event, counted) until the driver reports another phase."""
        if tr.sync_phase is None:
            self.st.sync_phase = None
            return
        prev = self.prev.sync_phase
        same = prev is not None and prev.since == tr.sync_phase_since and prev.phase is tr.sync_phase
        timed_out = prev is not None and prev.timed_out and same
        since = parse_time(tr.sync_phase_since)
        limit = spec.old_logits.interrupt_sync.phase_timeout_seconds
        if (tr.sync_phase is not SyncPhase.IDLE and since is not None and not timed_out
                and self.phase is Phase.RUNNING and self._from_this_attempt(tr)):
            took = (self.now - since).total_seconds()
            if took > limit:
                timed_out = True
                self.sync_stuck = (f"interrupt-sync phase {tr.sync_phase.value} running since "
                                   f"{tr.sync_phase_since}: {took:.0f} s > phaseTimeoutSeconds {limit}")
                self.out.events.append(Event("Warning", SYNC_STUCK_REASON, self.sync_stuck))
                self.out.sync_stuck += 1
            else:  # no other event may come while a phase hangs: look again when it would time out
                self.out.requeue(limit - took + 1.0)
        self.st.sync_phase = SyncPhaseStatus(phase=tr.sync_phase, since=tr.sync_phase_since or None,
                                             timed_out=timed_out)

    def _from_this_attempt(self, tr: TrainingSummary) -> bool:
        """Whether the summary was sent by the current pods' driver (after a gang restart, the dead
        driver's last phase stays in status.training until the new driver reports)."""
        reported, attempt = parse_time(tr.reported_at), parse_time(self.st.attempt_start_time)
        return reported is None or attempt is None or reported >= attempt

    def _sync_stuck_condition(self) -> tuple[str, str, str]:
        sp = self.st.sync_phase
        if sp is None or not sp.timed_out or self.phase is not Phase.RUNNING:
            return "False", "NoSyncPhaseTimeout", ""
        if self.sync_stuck is None:  # detected by an earlier reconcile: keep its words
            prev = _condition(self.prev, "SyncStuck")
            self.sync_stuck = prev.message if prev is not None and prev.status == "True" else \
                f"interrupt-sync phase {sp.phase.value} running since {sp.since} > phaseTimeoutSeconds"
        return "True", SYNC_STUCK_REASON, self.sync_stuck or ""

    # -- the active state machine
    def _active(self, spec: AsyncRLJobSpec) -> None:
        assert self.desired is not None
        pods = self.obs.pods
        rp = spec.run_policy
        if rp.suspend:
            if self.phase is not Phase.SUSPENDED:
                kept = "checkpoint kept" if spec.checkpoint.volume_claim_name else \
                    f"a resume starts {resume_point(spec)}"
                self._set_phase(Phase.SUSPENDED, "Suspended", f"runPolicy.suspend is true: pods deleted; {kept}")
            for p in pods.values():
                self._delete_pod(p, "DeletedPod", "job suspended")
            return
        if self.phase is Phase.VALIDATION_FAILED:
            self._set_phase(Phase.PENDING, "Validated", "the corrected spec was accepted")
        if self.phase is Phase.SUSPENDED:
            self._set_phase(Phase.PENDING, "Resumed", f"runPolicy.suspend is false: resuming {resume_point(spec)}")
            self.st.start_time = None  # activeDeadlineSeconds counts from the resume

        if self._deadlines(rp.active_deadline_seconds, rp.pre_running_deadline_seconds):
            return

        if self.phase is Phase.PENDING:
            self._start_pods("creating the job's pods")
            return
        if self.phase is Phase.RESTARTING:
            self._restarting()
            return

        # Initializing / Running: watch every desired pod of the current epoch.
        epoch = self.st.epoch
        driver = pods.get(names.pod_name(self.job.ref.name, Role.DRIVER, 0))
        if driver is not None and driver.epoch == epoch:
            # A driver stopped by SIGTERM (preemption, drain) checkpoints and exits 0 too: a terminating
            # driver pod is a lost gang pod (restart from that checkpoint), not a finished job.
            if driver.phase == "Succeeded" and not driver.terminating:
                self._set_phase(Phase.SUCCEEDED, "Completed", "the driver finished training")
                self.st.completion_time = self._now()
                return
            if driver.phase == "Failed" and driver.exit_code == INVALID_SPEC_EXIT_CODE:
                said = driver.termination_message.strip() or f"see `kubectl logs {driver.name}`"
                self._fail("InvalidSpec", f"the driver refused the spec (exit code {INVALID_SPEC_EXIT_CODE}, "
                           f"not retried): {said}"[:MESSAGE_LIMIT])
                return
        # A gang pod that failed or is terminating is lost now, not once it is gone (a disrupted one is a
        # preemption at once). While creates fail, a missing pod is one not created yet (before Running).
        not_created = self.create_failing and self.phase is Phase.INITIALIZING
        # A pod that vanished moments ago without a known disruption: a list can be ahead of the pod's
        # DELETED event, which carries its last state (preempted or not). Wait for it, briefly.
        settling = {n: VANISHED_SETTLE_SECONDS - age for n, s in self.desired.pods.items()
                    if s.role.gang and n not in pods and (n, epoch) not in self.obs.disrupted
                    and (age := self.obs.vanished.get((n, epoch), VANISHED_SETTLE_SECONDS)) < VANISHED_SETTLE_SECONDS}
        if settling:
            self.out.requeue(max(0.1, min(settling.values())))
            return
        lost = [n for n, s in self.desired.pods.items() if s.role.gang and (
            (n not in pods and not not_created)
            or (n in pods and (pods[n].phase == "Failed" or pods[n].epoch != epoch or pods[n].terminating)))]
        if lost:
            self._gang_failure(spec, lost)
            return
        stale = sorted(p.name for p in pods.values()
                       if p.epoch == epoch and p.spec_hash and p.spec_hash != self.desired.spec_hash)
        if stale:
            self._spec_restart(spec, stale)
            return
        self._keep_pods_alive(epoch)
        ready = all(pods.get(n) is not None and pods[n].phase == "Running" and pods[n].ready
                    for n in self.desired.pods)
        if ready and self.phase is Phase.INITIALIZING:
            self._set_phase(Phase.RUNNING, "PodsReady", "all pods are running and ready")

    def _keep_pods_alive(self, epoch: int) -> None:
        """Create missing pods (rollout pods lost alone, or creates to retry), delete failed rollout pods
        and pods that are not desired (scaled down)."""
        assert self.desired is not None
        pods = self.obs.pods
        missing = [n for n in self.desired.pods if n not in pods]
        if missing and self.create_failing:
            after = parse_time(self.st.restart_after)
            if after is not None and after > self.now:
                self.create_retry_due = True  # the backoff of the failed create is not over yet
                self.out.requeue((after - self.now).total_seconds())
            else:
                for name in missing:
                    self._create_pod(name, "CreatedPod", f"created pod {name} (retry after a failed create)")
            missing = []
        for name in missing:  # only rollout pods can be missing here: replace alone
            self.st.rollout_replacements += 1
            self._create_pod(name, "ReplacedRolloutPod", f"rollout pod {name} was lost; replaced alone")
        for name, seen in pods.items():
            if name in self.desired.pods and (seen.phase == "Failed" or seen.epoch != epoch):
                self._delete_pod(seen, "DeletedFailedRolloutPod",
                                 f"rollout pod {name} failed ({seen.reason or seen.phase}); it is replaced alone")
                self.out.requeue(1.0)
            elif name not in self.desired.pods:  # scaled down
                self._delete_pod(seen, "DeletedPod", f"pod {name} is not desired (spec changed)")

    def _deadlines(self, active: int | None, pre_running: int | None) -> bool:
        started = self._elapsed(self.st.start_time)
        if active is not None and started is not None and started > active:
            self._fail("DeadlineExceeded", f"activeDeadlineSeconds={active} exceeded ({started:.0f} s)")
            return True
        if active is not None and started is not None:
            self.out.requeue(active - started)
        # Per attempt: only the Initializing of the current pods counts. A restart after hours of
        # training starts a fresh clock, and the backoff wait (Restarting) or a Pending start
        # waiting for old pods to go is not "stuck initializing".
        attempt = self._elapsed(self.st.attempt_start_time)
        if pre_running is None or attempt is None or self.phase is not Phase.INITIALIZING:
            return False
        if attempt > pre_running:
            stuck = stuck_text(stuck_pods(self.obs.pods))
            self._fail("PreRunningDeadlineExceeded",
                       f"pods not all running {attempt:.0f} s after this attempt's pods were created > "
                       f"preRunningDeadlineSeconds={pre_running}{'; waiting: ' + stuck if stuck else ''}")
            return True
        self.out.requeue(pre_running - attempt)
        return False

    def _start_pods(self, message: str) -> None:
        """Create every pod of the current epoch, once no pod of an earlier attempt is left (same names)."""
        assert self.desired is not None
        if self.conflicted:
            self._set_phase(Phase.PENDING, "ChildConflict",
                            "no pod is created while a child's name is taken by another owner: see the "
                            "ChildConflict condition")
            return
        old = list(self.obs.pods.values())
        if old:
            for p in old:
                self._delete_pod(p, "DeletedPod", "old pods go before new ones are created")
            self._set_phase(Phase.PENDING, "WaitingForOldPods",
                            f"waiting for {len(old)} old pod(s) to terminate before creating new ones: "
                            f"{', '.join(sorted(p.name for p in old))}")
            self.out.requeue(1.0)
            return
        for name in self.desired.pods:
            self._create_pod(name, "CreatedPod", f"created pod {name}")
        if self.st.start_time is None:
            self.st.start_time = self._now()
        self.st.attempt_start_time = self._now()
        self._set_phase(Phase.INITIALIZING, "PodsCreated", message)
        if isinstance(self.spec, AsyncRLJobSpec) and self.spec.run_policy.pre_running_deadline_seconds is not None:
            self.out.requeue(self.spec.run_policy.pre_running_deadline_seconds)  # this attempt's own clock

    def _gang_failure(self, spec: AsyncRLJobSpec, lost: list[str]) -> None:
        pods, epoch = self.obs.pods, self.st.epoch
        lines, preempted = [], False
        for name in lost:
            p = pods.get(name)
            if p is None:
                seen_disrupted = (name, epoch) in self.obs.disrupted
                preempted = preempted or seen_disrupted
                lines.append(f"{name} was {'preempted and is gone' if seen_disrupted else 'deleted'}")
            else:
                preempted = preempted or p.disrupted
                state = "terminating" if p.terminating and p.phase != "Failed" else p.phase
                lines.append(f"{name} {state}{' (preempted)' if p.disrupted else ''}"
                             f"{': ' + p.reason if p.reason else ''}")
        what = "; ".join(lines)
        rp = spec.run_policy
        if preempted:
            n = self.st.preemptions + 1
            if n > rp.preemption_limit:
                self._fail("PreemptionLimitExceeded", f"{what}; preemptionLimit={rp.preemption_limit} reached")
                return
            self.st.preemptions = n
            self.out.preemptions += 1
            delay = self.cfg.restart_delay(1)
            cause = "Preempted"
            msg = (f"{what}; preemption {n}/{rp.preemption_limit} (not counted against backoffLimit), "
                   f"restarting {resume_point(spec)} in {delay:g} s")
        else:
            restarts = self.st.restarts + 1
            if restarts > rp.backoff_limit:
                self._fail("BackoffLimitExceeded", f"{what}; backoffLimit={rp.backoff_limit} reached")
                return
            self.st.restarts = restarts
            self.out.counted_restarts += 1
            delay = self.cfg.restart_delay(restarts)
            cause = "PodFailed"
            msg = f"{what}; restart {restarts}/{rp.backoff_limit} {resume_point(spec)} in {delay:g} s"
        self._restart_gang(cause, msg[:MESSAGE_LIMIT], delay)

    def _spec_restart(self, spec: AsyncRLJobSpec, stale: list[str]) -> None:
        """The running pods were built from an older spec: restart every pod with the new one (not counted)."""
        self.out.spec_restarts += 1
        self._restart_gang("SpecChanged", f"spec changed (generation {self.job.generation}): {len(stale)} pod(s) "
                           f"built from an earlier spec; restarting every pod with the new spec "
                           f"{resume_point(spec)} (not counted against backoffLimit)", 0.0)

    def _restart_gang(self, cause: str, message: str, delay: float) -> None:
        self.st.epoch += 1
        self.st.restart_after = rfc3339(self.now + dt.timedelta(seconds=delay))
        self._set_phase(Phase.RESTARTING, cause, message)
        for p in self.obs.pods.values():
            self._delete_pod(p, "DeletedPod", f"gang restart ({cause})")
        self.out.requeue(max(delay, 1.0))

    def _restarting(self) -> None:
        leftover = list(self.obs.pods.values())
        for p in leftover:
            self._delete_pod(p, "DeletedPod", "gang restart: old pods go first")
        if leftover:
            self.out.requeue(1.0)
            return
        after = parse_time(self.st.restart_after)
        if after is not None and after > self.now:
            self.out.requeue((after - self.now).total_seconds())
            return
        self._start_pods(f"restart (epoch {self.st.epoch}): resuming {self._resume_point()}")

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
        self.st.replicas = ReplicaCounts(rollout=f"{rr}/{rd}", actor=f"{ar}/{ad}", rollout_ready=rr,
                                         rollout_desired=rd, actor_ready=ar, actor_desired=ad,
                                         driver_ready=driver_ready)

    def _waiting_reasons(self) -> None:
        """While Initializing, why pods are not running yet goes to ``status.message``, the PodsReady
        condition, and one Warning event per new reason (family), naming its pods."""
        if self.phase is not Phase.INITIALIZING:
            return
        self.waiting = stuck_pods(self.obs.pods)
        prev = _condition(self.prev, "PodsReady")
        before = {WAITING_FAMILY.get(r, r) for r in STUCK_REASON.findall(prev.message if prev is not None else "")}
        for reason, pods, message in by_reason(self.waiting):
            if WAITING_FAMILY.get(reason, reason) not in before:
                self.out.events.append(Event("Warning", reason, reason_text(reason, pods, message)))
        if self.waiting:
            self.st.message = f"waiting for pods: {stuck_text(self.waiting)}"
        elif self.prev.phase is Phase.INITIALIZING and not self.create_retry_due:
            # The phase did not change now: say where the start-up stands instead of a stale reason.
            assert self.desired is not None
            ready = sum(1 for n in self.desired.pods if (p := self.obs.pods.get(n)) is not None and p.ready)
            self.st.message = f"{ready}/{len(self.desired.pods)} pods running and ready"

    def _conditions(self) -> list[Condition]:
        ph, reason, message = self.phase, self.st.reason or "", self.st.message or ""
        all_ready = bool(self.desired) and all(
            (p := self.obs.pods.get(n)) is not None and p.ready and p.phase == "Running"
            for n in (self.desired.pods if self.desired else {}))

        def flag(on: bool, off_reason: str) -> tuple[str, str, str]:
            return ("True", reason, message) if on else ("False", off_reason, "")

        pods_ready = ("True", "AllPodsReady", "") if all_ready and not ph.terminal else \
            ("False", self.waiting[0][1], stuck_text(self.waiting)) if self.waiting else \
            ("False", "PodsNotReady", "")
        want: dict[str, tuple[str, str, str]] = {
            "SpecValid": ("False", "ValidationFailed", message) if ph is Phase.VALIDATION_FAILED
            else ("True", "Validated", "spec accepted"),
            "PodsReady": pods_ready,
            "Running": flag(ph is Phase.RUNNING, "NotRunning"),
            "Suspended": flag(ph is Phase.SUSPENDED, "NotSuspended"),
            "Restarting": flag(ph is Phase.RESTARTING, "NotRestarting"),
            "Degraded": self.degraded,
            # Set True by fold_create_failures; kept while the retry of a failed create waits.
            "FailedCreate": _triple(_condition(self.prev, "FailedCreate")) if self.create_retry_due
            else ("False", "NoFailedCreate", ""),
            "ChildConflict": self._conflict_condition(),
            "SyncStuck": self._sync_stuck_condition(),
            "Succeeded": flag(ph is Phase.SUCCEEDED, "NotSucceeded"),
            "Failed": flag(ph in (Phase.FAILED,), "NotFailed"),
        }
        return [self._condition(ctype, *want[ctype]) for ctype in CONDITION_TYPES]

    def _conflict_condition(self) -> tuple[str, str, str]:
        if self.conflicts is None:
            prev = _condition(self.prev, "ChildConflict")
            return _triple(prev) if prev is not None else ("False", "NoConflict", "")
        if not self.conflicts:
            return "False", "NoConflict", ""
        text = "; ".join(self.conflicts)[:MESSAGE_LIMIT]
        if (prev := _condition(self.prev, "ChildConflict")) is None or prev.message != text:
            self.out.events.append(Event("Warning", "ChildConflict", text))
        return "True", "ChildConflict", text

    def _condition(self, ctype: str, status: str, why: str, msg: str) -> Condition:
        old = _condition(self.prev, ctype)
        kept = old.last_transition_time if old is not None and old.status == status else ""
        return Condition(type=ctype, status=status, reason=why or ctype, message=msg or "",
                         last_transition_time=kept or self._now(), observed_generation=self.job.generation)


def _condition(status: JobStatus, ctype: str) -> Condition | None:
    return next((c for c in status.conditions if c.type == ctype), None)


def _is_true(cond: Condition | None) -> bool:
    return cond is not None and cond.status == "True"


def _triple(cond: Condition | None) -> tuple[str, str, str]:
    return ("Unknown", "", "") if cond is None else (cond.status, cond.reason, cond.message)


def _child_patch(child: Child, seen: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that brings one of our children up to date, or None. A Secret is never
    patched (nor its data read); a PodGroup follows the gang's size, a ``follows_spec`` child (the agent
    endpoint's Service and NetworkPolicy) every field of ``spec`` it sets; others are created once."""
    kind, want = child.kind, child.manifest
    if kind == "ConfigMap" and seen.get("data") != want.get("data"):
        return {"data": want.get("data")}
    if kind == "PodGroup" or child.follows_spec:
        have = seen.get("spec") or {}
        if any(have.get(k) != v for k, v in (want.get("spec") or {}).items()):
            return {"spec": want.get("spec")}
    return None


# ---------------------------------------------------------------- failed creates (after apply)

def fold_create_failures(prev_status: JobStatus, planned: Plan, failures: list[CreateFailure],
                         now: dt.datetime, settings: OperatorSettings) -> Plan:
    """The plan's status and events once some of its creates were refused by the API server.

    A refused create is never a lost pod: ``FailedCreate`` becomes True with the server's messages,
    one Warning event per failure, and the next attempt waits until ``restartAfter``: as long as
    the creates have been failing already, at least ``restartBackoffSeconds``, at most the cap (so
    the waits double without a counter). A name taken by another owner is also ``ChildConflict``.
    """
    if not failures:
        return planned
    st = planned.status.model_copy(deep=True)
    conds = {c.type: c for c in st.conditions}
    events = list(planned.events)

    def since(ctype: str) -> dt.datetime | None:
        was = _condition(prev_status, ctype)
        return parse_time(was.last_transition_time) if was is not None and was.status == "True" else None

    def set_true(ctype: str, message: str) -> None:
        planned_cond = conds.get(ctype)
        generation = st.observed_generation if planned_cond is None else planned_cond.observed_generation
        conds[ctype] = Condition(type=ctype, status="True", reason=ctype, message=message,
                                 last_transition_time=rfc3339(since(ctype) or now), observed_generation=generation)

    first = since("FailedCreate")
    failing_for = 0.0 if first is None else (now - first).total_seconds()
    delay = min(max(failing_for, settings.restart_backoff_seconds), settings.restart_backoff_max_seconds)
    text = "; ".join(f"create {f.describe()}" for f in failures)[:MESSAGE_LIMIT]
    set_true("FailedCreate", text)
    st.restart_after = rfc3339(now + dt.timedelta(seconds=delay))
    if st.phase is Phase.INITIALIZING:  # recomputed there each reconcile (never left stale)
        what = "pods" if all(f.kind == "Pod" for f in failures) else "the job's children"
        st.message = f"the API server refused to create {what}, retrying in {delay:g} s: {text}"[:MESSAGE_LIMIT]
    # one Warning per refusal; the pods held back for them are in the condition, not an event each
    events += [Event("Warning", "FailedCreate", f"create {f.kind} {f.name} refused: {f.code} {f.message}"
                     [:MESSAGE_LIMIT]) for f in failures if not f.held]
    taken = "; ".join(f.message for f in failures if f.conflict)[:MESSAGE_LIMIT]
    if taken:
        if (was := _condition(prev_status, "ChildConflict")) is None or was.message != taken:
            events.append(Event("Warning", "ChildConflict", taken))
        set_true("ChildConflict", taken)
    st.conditions = [conds[c.type] for c in st.conditions]
    out = dataclasses.replace(planned, status=st, events=events)
    out.requeue(delay)
    return out


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
