"""The operator's status fields stay the operator's, although the driver may patch the status.

The driver reports ``status.training`` with its job's ServiceAccount, whose Role allows ``patch`` on
``asyncrljobs/status`` for that one job; RBAC cannot narrow a patch to one field, so the same token
can rewrite ``restarts``, ``startTime``, ``phase``, ``epoch`` or ``conditions`` and, were they read
back, steer the operator: restarts past ``backoffLimit``, a deadline that never passes, a phase
``Succeeded`` that deletes the pods. Code inside the job (a task plug-in, a reward function) runs
with that token.

So the operator keeps its own copy of every field it owns (``asyncrl.api.status.OPERATOR_FIELDS``) in the
annotation :data:`ANNOTATION` on the job object, which the driver cannot write (its Role has no verb
on ``asyncrljobs`` itself). Each reconcile plans from that copy (:func:`trusted_status`), never from
the status' own values of those fields; a status field that differs from the copy is rewritten
with the copy's value, and a ``StatusOverwritten`` Warning event names it. Only ``status.training``
is read from the status, validated as :class:`asyncrl.api.status.TrainingSummary`. The copy is
written before the status (:func:`copy_patch`), so a status write that fails leaves the copy ahead,
never behind. A job without a copy (new, or created before this version) starts from its status once.
kopf ignores the annotation in its diff (``handlers.configure_kopf``): writing it triggers no handler.
"""

import json
from dataclasses import dataclass
from typing import Any

from asyncrl.api.status import OPERATOR_FIELDS
from asyncrl.operator import names

ANNOTATION = names.ANNOTATION_STATUS
TAMPER_REASON = "StatusOverwritten"


@dataclass(frozen=True)
class TrustedStatus:
    """What the planner may read of a job's status, and what it found changed behind its back."""

    status: dict[str, Any]
    """The operator's copy of its own fields, plus every other status field (``training``)."""
    copy: dict[str, Any] | None
    """The copy as stored in the annotation (None: none yet)."""
    overwritten: tuple[str, ...] = ()
    """Operator fields whose status value differs from the copy (someone else wrote them)."""

    def message(self) -> str:
        return (f"status field(s) {', '.join(self.overwritten)} differed from the operator's own record and were "
                "restored; only the operator writes them (the driver's ServiceAccount may patch status, and the "
                "operator reads only status.training from it)")


def own_fields(status: dict[str, Any]) -> dict[str, Any]:
    """The operator's fields of ``status`` (what the copy holds)."""
    return {k: status[k] for k in OPERATOR_FIELDS if k in status}


def trusted_status(body: dict[str, Any]) -> TrustedStatus:
    """The status of job ``body`` as the operator may trust it (see the module docstring)."""
    status = dict(body.get("status") or {})
    raw = ((body.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    if raw is None:
        return TrustedStatus(status, None)
    try:
        copy = json.loads(raw)
    except ValueError:
        copy = None
    if not isinstance(copy, dict):  # unreadable: nothing the driver wrote can be trusted instead
        copy = {}
    trusted = {k: v for k, v in status.items() if k not in OPERATOR_FIELDS} | own_fields(copy)
    overwritten = tuple(k for k in OPERATOR_FIELDS if status.get(k) != copy.get(k))
    return TrustedStatus(trusted, copy, overwritten)


def copy_patch(trusted: TrustedStatus, new_status: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch of the job's metadata that stores the operator's fields of ``new_status``;
    None when the stored copy already equals them."""
    copy = own_fields(new_status)
    if trusted.copy == copy:
        return None
    return {"metadata": {"annotations": {ANNOTATION: json.dumps(copy, sort_keys=True, separators=(",", ":"))}}}
