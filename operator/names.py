"""Every name, label, annotation and key the operator writes, from one place.

Children are named deterministically (``<job>-<role>-<index>``), so a restarted operator finds
what it created before and a create that races a previous one gets ``409 Conflict`` instead of a
duplicate. ``asyncrl.api.metadata.MAX_NAME_LENGTH`` (40) keeps every name below 63 characters.
"""

from enum import StrEnum

from asyncrl.api import constants as C
from asyncrl.api.constants import GROUP

FINALIZER = f"{GROUP}/finalizer"
KOPF_PREFIX = f"kopf.{GROUP}"  # progress/diff-base annotations of kopf

LABEL_JOB = f"{GROUP}/job"
LABEL_ROLE = f"{GROUP}/role"
LABEL_INDEX = f"{GROUP}/replica-index"
ANNOTATION_EPOCH = f"{GROUP}/epoch"
# Hash of the pod-shaping part of the spec the pod was built from: a spec edit while running
# changes it, and the operator restarts the gang deliberately instead of ignoring the edit.
ANNOTATION_SPEC_HASH = f"{GROUP}/spec-hash"
# On the job itself: the operator's copy of the status fields it owns (asyncrl.operator.status_guard).
ANNOTATION_STATUS = f"{GROUP}/operator-status"

MANAGED_BY = "asyncrl-operator"
APP_NAME = "asyncrl"


class Role(StrEnum):
    """A kind of pod in a job. The gang roles restart the whole job when lost; rollout does not."""

    DRIVER = "driver"
    ROLLOUT = "rollout"
    ACTOR = "actor"
    OLD_LOGIT = "oldlogit"

    @property
    def ray_resource(self) -> str:
        """The custom Ray resource a pod of this role advertises (``ray start --resources``)."""
        return {Role.DRIVER: C.RESOURCE_DRIVER, Role.ROLLOUT: C.RESOURCE_ROLLOUT, Role.ACTOR: C.RESOURCE_ACTOR,
                Role.OLD_LOGIT: C.RESOURCE_OLD_LOGITS}[self]

    @property
    def gang(self) -> bool:
        """Losing a pod of this role restarts the job from its checkpoint."""
        return self is not Role.ROLLOUT


def pod_name(job: str, role: Role, index: int) -> str:
    return f"{job}-{role.value}-{index}"


def service_name(job: str) -> str:
    """The headless Service; pods resolve as ``<pod>.<job>.<namespace>.svc``."""
    return job


def configmap_name(job: str) -> str:
    return f"{job}-spec"


def status_account_name(job: str) -> str:
    """ServiceAccount, Role and RoleBinding that let the driver patch this job's status only."""
    return f"{job}-status"


def ray_token_secret_name(job: str) -> str:
    """Secret holding the job's Ray auth token (every pod of the job mounts it)."""
    return f"{job}-ray-token"


def network_policy_name(job: str) -> str:
    """NetworkPolicy admitting only the job's own pods (and Prometheus on the metrics port)."""
    return job


def agent_service_name(job: str) -> str:
    """ClusterIP Service in front of the rollout pods' agent endpoint (only with ``spec.task.agent``):
    an external harness opens sessions at ``http://<job>-agent.<namespace>.svc:<endpoint.port>``."""
    return f"{job}-agent"


def agent_network_policy_name(job: str) -> str:
    """NetworkPolicy admitting ``spec.task.endpoint.allowFrom`` to the rollout pods' agent port (only with
    ``spec.task.agent`` and a non-empty ``allowFrom``)."""
    return f"{job}-agent"


def agent_key_secret_name(job: str) -> str:
    """Secret the operator makes for an external agent (``spec.task.agent: external``) without
    ``spec.task.endpoint.sessionKeyFrom``: key :data:`AGENT_KEY_KEY` holds the key a harness sends to take a
    session (created once, never rotated; it goes with the job)."""
    return f"{job}-agent-key"


AGENT_KEY_KEY = "key"  # the key's entry in that Secret


def pod_group_name(job: str) -> str:
    """PodGroup of the gang scheduler (volcano or coscheduling): all pods or none."""
    return job


def selector(job: str) -> dict[str, str]:
    """Label selector of every child of ``job``."""
    return {LABEL_JOB: job}


def role_selector(job: str, role: Role) -> dict[str, str]:
    """Label selector of the pods of one role of ``job``."""
    return {LABEL_JOB: job, LABEL_ROLE: role.value}


def selector_string(job: str) -> str:
    return ",".join(f"{k}={v}" for k, v in selector(job).items())


def labels(job: str, role: Role | None = None, index: int | None = None) -> dict[str, str]:
    """Labels of a child: ``app.kubernetes.io/*`` plus ours (and KubeRay's node type for pods)."""
    out = {
        "app.kubernetes.io/name": APP_NAME,
        "app.kubernetes.io/instance": job,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/part-of": APP_NAME,
        LABEL_JOB: job,
    }
    if role is not None:
        out["app.kubernetes.io/component"] = role.value
        out[LABEL_ROLE] = role.value
        out["ray.io/cluster"] = job
        out["ray.io/node-type"] = "head" if role is Role.DRIVER else "worker"
    if index is not None:
        out[LABEL_INDEX] = str(index)
    return out
