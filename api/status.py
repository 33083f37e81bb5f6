"""The AsyncRLJob ``status``: what the operator writes, and the training summary the driver reports.

Two writers, disjoint fields (so JSON merge patches never lose each other's data):

- the **operator** writes every field of :class:`JobStatus` except ``training`` (phase, reason,
  message, conditions, replicas, restarts, the agent endpoint's address, ...), always the whole
  ``conditions`` list from one place (``asyncrl.operator.lifecycle``);
- the **driver** (inside the job) writes only ``status.training``, a :class:`TrainingSummary`.

Status-patch contract for the driver (the in-job status reporter):

1. ``PATCH /apis/asyncrl.io/v1alpha1/namespaces/{ns}/asyncrljobs/{name}/status`` with
   ``Content-Type: application/merge-patch+json`` and the body :func:`training_patch` returns.
   Credentials: the pod's ServiceAccount ``<job>-status`` (only the driver pod mounts its token),
   whose Role allows ``get``/``patch`` on ``asyncrljobs/status`` for this job's name only.
2. At most one patch every :data:`MIN_REPORT_INTERVAL_SECONDS` (30 s); use :class:`ReportThrottle`.
   Per-step numbers go to Prometheus, never to the API server. One exception: a sync phase that
   has lasted :data:`SYNC_PHASE_REPORT_AFTER_SECONDS` (a phase that may be stuck: no further step
   record would carry it) is sent then, throttle or not, and so is the return from such a phase;
   phases shorter than that ride along with the next throttled report.
3. ``syncPhase``/``syncPhaseSince`` carry the interrupt-sync phase current at report time;
   the operator copies them to ``status.syncPhase``; a phase other than ``Idle`` older than
   ``oldLogits.interruptSync.phaseTimeoutSeconds`` sets the ``SyncStuck`` condition (reason
   ``SyncPhaseTimeout``) with one Warning event, until the phase changes.
4. ``keepRatio`` is the train–inference keep ratio over the report window (kept / valid tokens),
   the value ``monitoring.maskGuard`` compares with its thresholds; ``keepPercent`` is derived.

The operator reads the status once per reconcile with :func:`read_status` (the boundary: a
mapping in, a :class:`JobStatus` out), plans on the typed record, and writes it back with
:meth:`JobStatus.to_status_dict` (the one serialisation).

This module imports nothing heavy: the driver imports it, so does the operator.
"""

import datetime as dt
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator
from pydantic.alias_generators import to_camel

MIN_REPORT_INTERVAL_SECONDS = 30.0
SYNC_PHASE_REPORT_AFTER_SECONDS = 5.0


class Phase(StrEnum):
    """Lifecycle phase of an AsyncRLJob (``status.phase``)."""

    PENDING = "Pending"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    VALIDATION_FAILED = "ValidationFailed"

    @property
    def terminal(self) -> bool:
        """Succeeded and Failed never change again (children deleted by hand stay deleted)."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class SyncPhase(StrEnum):
    """Interrupt-sync phase of the update ``v -> v+1`` (docs/architecture.md, notation, strategy interruptSync).

    ``Idle`` between updates; ``Interrupt`` (rollout workers stop and return their partial
    trajectories), ``Score`` (they score the partial tokens of version v with the training-side
    model), ``Update`` (the optimizer step and the weight sync), ``Resume`` (engines re-acquired,
    generation continues). The driver's ``asyncrl_sync_phase{phase}`` labels are these names in
    lower case (:attr:`metric_label`).
    """

    IDLE = "Idle"
    INTERRUPT = "Interrupt"
    SCORE = "Score"
    UPDATE = "Update"
    RESUME = "Resume"

    @property
    def metric_label(self) -> str:
        """The ``phase`` label value of the driver's sync-phase metrics."""
        return self.value.lower()

    @classmethod
    def parse(cls, name: str) -> "SyncPhase":
        """The phase named by its status value (``Score``) or its metric label (``score``)."""
        for phase in cls:
            if name in (phase.value, phase.metric_label):
                return phase
        raise ValueError(f"unknown sync phase {name!r}; valid: {', '.join(p.value for p in cls)} "
                         f"(or in lower case: {', '.join(p.metric_label for p in cls)})")


# Validation context of read_status: keys a model does not know are dropped, not refused.
_TOLERANT = "asyncrl.status.tolerant"


class _StatusModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: object, info: ValidationInfo) -> object:
        # Only under read_status: a copy written by another version may name a field this one lacks.
        if isinstance(data, dict) and info.context is not None and info.context.get(_TOLERANT):
            known = {f.alias or name for name, f in cls.model_fields.items()}
            return {k: v for k, v in data.items() if k in known}
        return data

    def to_status_dict(self) -> dict[str, Any]:
        """The section as written into ``status`` (camelCase, unset optional fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class TrainingSummary(_StatusModel):
    """``status.training``: the throttled training summary the driver reports."""

    policy_version: int = Field(ge=0, description="Current policy version (optimizer steps done).")
    keep_ratio: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Train–inference mask keep ratio over the report window."
    )
    keep_percent: float | None = Field(
        default=None, ge=0.0, le=100.0, description="keepRatio in percent, one decimal (printer column)."
    )
    clip_fraction: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Share of tokens whose staleness ratio was clipped."
    )
    ewma_resets: int = Field(default=0, ge=0, description="EWMA reference resets so far.")
    ewma_resets_recovered: int | None = Field(
        default=None, ge=0, description="ewma reference only: of the EWMA resets, those whose in-bounds ratio of r_d reached the reset's "
        "threshold within async.maxStaleness versions (counted when decided, W versions after the reset).")
    ewma_resets_unrecovered: int | None = Field(
        default=None, ge=0, description="ewma reference only: of the EWMA resets, those that did not recover within async.maxStaleness "
        "versions (AsyncRLEwmaResetStorm counts these).")
    env_errors: int = Field(
        default=0, ge=0, description="Episodes the task's environment code aborted so far (exception, timeout, "
        "non-finite reward, garbage messages; asyncrl_env_errors_total by reason); the job goes on without them."
    )
    staleness_max: int = Field(
        default=0, ge=0, description="Observed: the largest version gap of a token trained on in the last report "
        "window (the steps' staleness_max); the bound it never exceeds is spec.async.maxStaleness (W)."
    )
    sync_phase: SyncPhase | None = Field(default=None, description="Interrupt-sync phase at report time.")
    sync_phase_since: str | None = Field(default=None, description="When syncPhase began (RFC 3339).")
    last_checkpoint: str | None = Field(default=None, description="URI or path of the newest checkpoint.")
    last_checkpoint_version: int | None = Field(default=None, ge=0, description="Policy version it holds.")
    last_export: str | None = Field(
        default=None,
        description="Path of the newest Hugging Face export (checkpoint.exportEverySteps); at the end, the final one.",
    )
    last_export_version: int | None = Field(default=None, ge=0, description="Policy version the export holds.")
    reported_at: str | None = Field(default=None, description="When the driver sent this summary (RFC 3339).")

    @model_validator(mode="after")
    def _derive_percent(self) -> "TrainingSummary":
        if self.keep_ratio is not None and self.keep_percent is None:
            object.__setattr__(self, "keep_percent", round(100.0 * self.keep_ratio, 1))
        return self


class Condition(_StatusModel):
    """A standard Kubernetes condition (``metav1.Condition``)."""

    type: str = Field(description="Condition type, e.g. Running, Degraded.")
    status: str = Field(pattern=r"^(True|False|Unknown)$", description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason of the last transition.")
    message: str = Field(default="", description="Human-readable details.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="metadata.generation this was based on.")


class ReplicaCounts(_StatusModel):
    """``status.replicas``: ready/desired pods per role."""

    rollout: str = Field(default="0/0", description="Rollout pods ready/desired (printer column).")
    actor: str = Field(default="0/0", description="Actor pods ready/desired (printer column).")
    rollout_ready: int = Field(default=0, ge=0, description="Rollout pods ready.")
    rollout_desired: int = Field(default=0, ge=0, description="Rollout pods desired.")
    actor_ready: int = Field(default=0, ge=0, description="Actor pods ready.")
    actor_desired: int = Field(default=0, ge=0, description="Actor pods desired.")
    driver_ready: bool = Field(default=False, description="Whether the driver pod is ready.")


class SyncPhaseStatus(_StatusModel):
    """``status.syncPhase``: the driver's interrupt-sync phase, as the operator surfaces it."""

    phase: SyncPhase = Field(description="Current interrupt-sync phase.")
    since: str | None = Field(default=None, description="When it began (RFC 3339).")
    timed_out: bool = Field(default=False, description="Whether it exceeded phaseTimeoutSeconds.")


class JobStatus(_StatusModel):
    """The whole ``status`` of an AsyncRLJob (the CRD's status schema is generated from it).

    Not frozen, unlike its parts: the planner brings its own copy up to date field by field (each
    assignment validated) and hands it on; a part (a condition, the replica counts) is replaced whole.
    """

    model_config = ConfigDict(frozen=False, validate_assignment=True)

    phase: Phase | None = Field(default=None, description="Lifecycle phase.")
    reason: str | None = Field(default=None, description="Reason of the last phase change.")
    message: str | None = Field(default=None, description="Details of the last phase change.")
    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")
    replicas: ReplicaCounts | None = Field(default=None, description="Ready/desired pods per role.")
    restarts: int = Field(default=0, ge=0, description="Restarts from checkpoint counted against backoffLimit.")
    preemptions: int = Field(default=0, ge=0, description="Restarts caused by preemption (not counted).")
    rollout_replacements: int = Field(default=0, ge=0, description="Rollout pods replaced alone.")
    epoch: int = Field(default=0, ge=0, description="Pod generation: incremented on every gang restart.")
    start_time: str | None = Field(default=None, description="When the job started or resumed (RFC 3339).")
    attempt_start_time: str | None = Field(default=None, description="When the current pods were created.")
    completion_time: str | None = Field(default=None, description="When the job became Succeeded or Failed.")
    restart_after: str | None = Field(
        default=None,
        description="Earliest time of the pending gang restart or of the retry of a refused pod create.")
    disrupted_pods: list[str] = Field(
        default_factory=list,
        description="Pods of the current epoch seen with DisruptionTarget=True, as <pod>@<epoch>: a preemption is "
        "recognised after the pod is gone, even across operator restarts.")
    sync_phase: SyncPhaseStatus | None = Field(default=None, description="Interrupt-sync phase (surfaced).")
    agent_endpoint: str | None = Field(
        default=None,
        description="Base URL of the job's OpenAI-compatible agent endpoint inside the cluster, "
        "http://<job>-agent.<namespace>.svc:<spec.task.endpoint.port>/v1 (a harness of spec.task.agent: external "
        "opens sessions at <agentEndpoint>/sessions): set once the operator sees the Service <job>-agent, absent "
        "without spec.task.agent and once the job has succeeded or failed.")
    training: TrainingSummary | None = Field(default=None, description="Training summary (written by the driver).")

    def to_status_dict(self) -> dict[str, Any]:
        """The status as written to the API server: camelCase, None left out, and an empty list left
        out too (``disruptedPods`` with no pod is no field: a merge patch of the operator deletes it)."""
        empty = {name for name in ("conditions", "disrupted_pods") if not getattr(self, name)}
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude=empty)


# Every field of JobStatus but ``training``, in the order a tamper warning names them (status_guard).
OPERATOR_FIELDS = ("phase", "reason", "message", "observedGeneration", "conditions", "replicas", "restarts",
                   "preemptions", "rolloutReplacements", "epoch", "startTime", "attemptStartTime",
                   "completionTime", "restartAfter", "syncPhase", "disruptedPods", "agentEndpoint")


def read_status(raw: Mapping[str, Any]) -> tuple[JobStatus, dict[str, str]]:
    """A job's ``status`` as the API server (or the operator's copy) holds it, typed; and what was left out.

    The boundary of the operator's planner, tolerant because a status that cannot be read must not
    stop the job: (1) a key no model knows is dropped, at any depth (the CRD prunes unknown fields,
    so only a copy written by another operator version can hold one); (2) an operator field whose
    value does not validate is left out as if absent (an unknown phase reads as none, i.e. Pending)
    and named in the second value, field -> pydantic's words; (3) ``training`` is validated as the
    driver's :class:`TrainingSummary`, strictly: a malformed report is left out and named the same
    way (the planner reports it: ``Degraded``/``BadTrainingReport``); an empty one is no report.
    """
    unreadable: dict[str, str] = {}
    training: TrainingSummary | None = None
    if raw.get("training"):
        try:
            training = TrainingSummary.model_validate(raw["training"])
        except ValidationError as exc:
            unreadable["training"] = str(exc)
    own = {k: v for k, v in raw.items() if k in OPERATOR_FIELDS}
    for _ in OPERATOR_FIELDS:  # each round leaves out at least one field, or ends
        try:
            status = JobStatus.model_validate(own, context={_TOLERANT: True})
            break
        except ValidationError as exc:
            bad: dict[str, list[str]] = {}
            for err in exc.errors():
                field = str(err["loc"][0]) if err["loc"] else ""
                bad.setdefault(field, []).append(f"{'.'.join(str(part) for part in err['loc'])}: {err['msg']}")
            if "" in bad or not bad.keys() <= own.keys():
                raise  # not one field's fault: nothing to leave out
            unreadable.update({k: "; ".join(msgs) for k, msgs in bad.items()})
            own = {k: v for k, v in own.items() if k not in bad}
    else:
        status = JobStatus()
    status.training = training
    return status, unreadable


def rfc3339(t: dt.datetime) -> str:
    """A UTC timestamp as Kubernetes writes it: ``2026-01-01T12:00:00Z``."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(s: str | None) -> dt.datetime | None:
    """Parse an RFC 3339 timestamp (``Z`` or offset); None stays None."""
    if not s:
        return None
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def training_patch(summary: TrainingSummary) -> dict[str, Any]:
    """The merge-patch body the driver sends to ``.../asyncrljobs/{name}/status``."""
    return {"status": {"training": summary.to_status_dict()}}


class ReportThrottle:
    """Lets a report through at most every ``min_interval`` seconds (pure: the caller passes time)."""

    def __init__(self, min_interval: float = MIN_REPORT_INTERVAL_SECONDS) -> None:
        if min_interval < MIN_REPORT_INTERVAL_SECONDS:
            raise ValueError(
                f"min_interval {min_interval} s is below the contract's {MIN_REPORT_INTERVAL_SECONDS} s; "
                "training numbers at a finer grain belong in Prometheus"
            )
        self.min_interval = min_interval
        self._last: float | None = None

    def ready(self, now: float) -> bool:
        """Whether a report may be sent at monotonic time ``now`` (seconds)."""
        return self._last is None or now - self._last >= self.min_interval

    def sent(self, now: float) -> None:
        """Record that a report was sent at ``now``."""
        self._last = now
