"""What the operator reads about a job: its pods (as :class:`PodView`), its other children, its own object.

Pure: manifests in, frozen views out. The planner (``asyncrl.operator.lifecycle``) decides from these;
nothing here calls the API. Ownership is by owner-reference uid: a pod listed by the job's label but
owned by someone else is never the job's (never deleted, never counted).
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.api.status import JobStatus, read_status
from asyncrl.operator import names
from asyncrl.operator.builders import JobRef
from asyncrl.operator.names import Role

MESSAGE_LIMIT = 1000  # characters of a status message or event built from many pods
# Waiting reasons every healthy pod passes through; anything else is worth telling the user.
ROUTINE_WAITING = frozenset({"ContainerCreating", "PodInitializing"})
# The kubelet alternates these while it retries a pull: one event per family, not per flip.
WAITING_FAMILY = {"ErrImagePull": "ImagePull", "ImagePullBackOff": "ImagePull",
                  "CrashLoopBackOff": "Crash", "RunContainerError": "Crash"}


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
    uid: str = ""
    owner_uids: tuple[str, ...] = ()
    spec_hash: str = ""  # names.ANNOTATION_SPEC_HASH; "" on pods built before spec hashes
    exit_code: int | None = None  # of the role's container, once terminated
    termination_message: str = ""  # of that container (its last log lines with FallbackToLogsOnError)
    waiting_reason: str = ""  # Unschedulable, ImagePullBackOff, CreateContainerConfigError, ...
    waiting_message: str = ""

    @classmethod
    def from_manifest(cls, pod: dict[str, Any]) -> "PodView":
        meta, status = pod.get("metadata", {}), pod.get("status") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        conds = {c.get("type"): c for c in status.get("conditions") or []}
        try:
            role: Role | None = Role(labels.get(names.LABEL_ROLE, ""))
        except ValueError:
            role = None
        containers = status.get("containerStatuses") or []
        reason = status.get("reason") or ""
        for cs in containers:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term.get("exitCode"):
                reason = reason or f"exit code {term['exitCode']} ({term.get('reason', 'Error')})"
        main = next((cs for cs in containers if role is not None and cs.get("name") == role.value),
                    containers[0] if containers else {})
        main_term = (main.get("state") or {}).get("terminated") or {}
        waiting_reason, waiting_message = _waiting(conds.get("PodScheduled") or {},
                                                   [*(status.get("initContainerStatuses") or []), *containers])
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
            uid=meta.get("uid") or "",
            owner_uids=tuple(o.get("uid", "") for o in meta.get("ownerReferences") or []),
            spec_hash=annotations.get(names.ANNOTATION_SPEC_HASH, ""),
            exit_code=main_term.get("exitCode") if main_term else None,
            termination_message=main_term.get("message") or "",
            waiting_reason=waiting_reason,
            waiting_message=waiting_message,
        )


def _waiting(scheduled: dict[str, Any], statuses: list[dict[str, Any]]) -> tuple[str, str]:
    """The first reason a pod is stuck: not schedulable, else a container (init first) waiting."""
    if scheduled.get("status") == "False" and scheduled.get("reason"):
        return scheduled["reason"], scheduled.get("message") or ""
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in ROUTINE_WAITING:
            return waiting["reason"], f"container {cs.get('name', '?')}: {waiting.get('message') or ''}".rstrip(": ")
    return "", ""


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    """Whether ``obj`` has an owner reference to the object with ``uid``."""
    return any(o.get("uid") == uid for o in (obj.get("metadata") or {}).get("ownerReferences") or [])


def owner_of(obj: dict[str, Any]) -> str:
    """Who owns ``obj``, for a message: ``AsyncRLJob j (uid ...)`` or ``nobody (no ownerReferences)``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    if not refs:
        return "nobody (no ownerReferences)"
    return ", ".join(f"{o.get('kind', '?')} {o.get('name', '?')} (uid {o.get('uid', '?')})" for o in refs)


def observe_pods(manifests: list[dict[str, Any]], job_uid: str) -> tuple[dict[str, "PodView"], dict[str, str]]:
    """Split the pods listed by the job's label into the job's own (by owner uid) and the others
    (name -> owner): those are never deleted, never counted, only reported if they take a pod's name."""
    own: dict[str, PodView] = {}
    foreign: dict[str, str] = {}
    for m in manifests:
        view = PodView.from_manifest(m)
        if job_uid in view.owner_uids:
            own[view.name] = view
        else:
            foreign[view.name] = owner_of(m)
    return own, foreign


@dataclass(frozen=True)
class Observed:
    """The job's children as listed from the API server."""

    pods: dict[str, PodView] = field(default_factory=dict)  # owned by the job
    # (kind, name) -> object; None when not read this time (then children are not checked)
    children: dict[tuple[str, str], dict[str, Any]] | None = field(default_factory=dict)
    foreign_pods: dict[str, str] = field(default_factory=dict)  # listed by label, owned by others: name -> owner
    # (pod name, epoch) seen with DisruptionTarget=True before: the pod may be gone by now
    disrupted: frozenset[tuple[str, int]] = frozenset()
    # (pod name, epoch) listed by an earlier reconcile and missing now -> seconds since first found missing:
    # its DELETED event (the last state, a disruption included) may still be on its way
    vanished: dict[tuple[str, int], float] = field(default_factory=dict)


@dataclass(frozen=True)
class JobView:
    """The AsyncRLJob as read from the API server."""

    ref: JobRef
    generation: int
    status: JobStatus
    # status fields read_status left out, field -> why (``training``: a malformed driver report)
    unreadable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, ref: JobRef, generation: int, status: Mapping[str, Any]) -> "JobView":
        """The job with its ``status`` as the API server holds it (the one parse: ``read_status``)."""
        typed, unreadable = read_status(status)
        return cls(ref, generation, typed, unreadable)


def stuck_pods(pods: dict[str, PodView]) -> list[tuple[str, str, str]]:
    """(pod, reason, message) of every pod not running for a reason worth telling, by name."""
    return [(p.name, p.waiting_reason, p.waiting_message) for p in sorted(pods.values(), key=lambda p: p.name)
            if p.waiting_reason and p.phase != "Running" and not p.terminating]


def by_reason(stuck: list[tuple[str, str, str]]) -> list[tuple[str, list[str], str]]:
    """(reason, its pods, the first pod's message), reasons in the order of their first pod."""
    groups: dict[str, tuple[list[str], str]] = {}
    for pod, reason, message in stuck:
        groups.setdefault(reason, ([], message))[0].append(pod)
    return [(reason, pods, message) for reason, (pods, message) in groups.items()]


def reason_text(reason: str, pods: list[str], message: str) -> str:
    """``<Reason>: <pod>, <pod>, <pod> and N more (<message>)``: bounded however many pods wait."""
    who = ", ".join(pods[:3]) + (f" and {len(pods) - 3} more" if len(pods) > 3 else "")
    # "; " separates reasons in the PodsReady message (read back by STUCK_REASON): not inside one
    detail = message.replace(";", ",")[:240]
    return f"{reason}: {who}" + (f" ({detail})" if detail else "")


# One reason of the PodsReady message as stuck_text writes it: "<Reason>: <pods> (<message>)".
STUCK_REASON = re.compile(r"(?:^|; )([A-Za-z]+): ")


def stuck_text(stuck: list[tuple[str, str, str]]) -> str:
    return "; ".join(reason_text(*group) for group in by_reason(stuck))[:MESSAGE_LIMIT]


