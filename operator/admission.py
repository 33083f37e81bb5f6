"""The operator's own re-check of a job before it creates anything: pod hardening cannot be switched off.

The CRD's CEL rules and ``asyncrl validate`` refuse every template field the ``restricted`` Pod
Security level forbids (``asyncrl.api.pod_security``), but the operator may create pods in any
namespace, also one without Pod Security enforcement, and must not become a confused deputy for
an object that slipped past the CRD (stored before the rules existed, an older CRD installed by
hand). So before every reconcile that would create something it checks, as pure functions:

1. a template's ``podSecurityLevel: privileged`` is honoured only in a namespace the cluster admin
   listed in ``OperatorSettings.privileged_namespaces`` (chart: ``podSecurity.privilegedNamespaces``);
2. every pod it built, as it would be created, passes the restricted level (:func:`pod_violations`),
   unless it belongs to such an admitted template.

Any problem makes the job ``ValidationFailed`` (``asyncrl.operator.lifecycle``): nothing is created
and pods it had are deleted.
"""

from collections.abc import Mapping
from typing import Any

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.kube_types import RESTRICTED_VOLUME_TYPES
from asyncrl.api.pod_security import ADMIN_VALUE, SAFE_SYSCTLS, PodSecurityLevel
from asyncrl.api.pods import PodOverrides
from asyncrl.api.validation import SpecProblem
from asyncrl.operator.builders import PodSlot
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.names import Role

_SECCOMP_OK = ("RuntimeDefault", "Localhost")


def templates(spec: AsyncRLJobSpec) -> dict[str, PodOverrides]:
    """The job's pod templates by their field path."""
    return {"spec.rollout.template": spec.rollout.template, "spec.actor.template": spec.actor.template}


def template_of(role: Role) -> str:
    """Path of the template a role's pods are built from (the driver runs the actor's image and contexts)."""
    return "spec.rollout.template" if role is Role.ROLLOUT else "spec.actor.template"


def admission_problems(spec: AsyncRLJobSpec, namespace: str, settings: OperatorSettings,
                       pods: Mapping[str, PodSlot]) -> list[SpecProblem]:
    """Everything that keeps the operator from creating this job's pods in ``namespace``."""
    allowed = namespace in settings.privileged_namespaces
    listed = ", ".join(settings.privileged_namespaces) or "none"
    problems = []
    admitted = set()
    for path, template in templates(spec).items():
        if template.pod_security_level is not PodSecurityLevel.PRIVILEGED:
            continue
        if allowed:
            admitted.add(path)
        else:
            problems.append(SpecProblem(
                f"{path}.podSecurityLevel",
                f"podSecurityLevel privileged is not allowed in namespace {namespace!r}: the cluster admin allows it "
                f"only in the namespaces of the chart value {ADMIN_VALUE} (now: {listed}); remove podSecurityLevel "
                "and every field the restricted Pod Security level forbids, or ask the cluster admin"))
    for name, slot in sorted(pods.items()):
        if template_of(slot.role) in admitted:
            continue
        problems += [SpecProblem(f"pod {name}", f"{v} (the restricted Pod Security level forbids it; the operator "
                                 "creates no pod that fails it)") for v in pod_violations(slot.manifest)]
    return problems


def pod_violations(pod: Mapping[str, Any]) -> list[str]:
    """What in a Pod manifest the ``restricted`` Pod Security level forbids (the operator's backstop:
    the manifest as it would be created, after every default and override was merged)."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    out = [f"spec.{k}: true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k) is True]
    out += [f"spec.volumes[{v.get('name')}]: volume type {t}" for v in spec.get("volumes") or []
            for t in v if t != "name" and t not in RESTRICTED_VOLUME_TYPES]
    out += [f"spec.securityContext.sysctls: {s.get('name')}" for s in psc.get("sysctls") or []
            if s.get("name") not in SAFE_SYSCTLS]
    if psc.get("runAsUser") == 0:
        out.append("spec.securityContext.runAsUser: 0")
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        sc = c.get("securityContext") or {}
        where = f"container {c.get('name')}"
        caps = sc.get("capabilities") or {}
        if sc.get("privileged") is True:
            out.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation is not false")
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: capabilities.drop lacks ALL")
        if extra := [a for a in caps.get("add") or [] if a != "NET_BIND_SERVICE"]:
            out.append(f"{where}: capabilities.add {extra}")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            out.append(f"{where}: runAsNonRoot is not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{where}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in _SECCOMP_OK:
            out.append(f"{where}: seccompProfile.type {seccomp}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount {sc.get('procMount')}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{where}: hostPort")
    return out
