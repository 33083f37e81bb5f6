"""The ``restricted`` Pod Security Standard over a role's template, in the model and in CEL.

A job author may not switch the operator's pod hardening off: everything the Kubernetes
``restricted`` level forbids (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
is refused by ``asyncrl validate``, by the CRD's CEL rules and again by the operator. The only way
past it is two keys, turned by two people: the template asks with ``podSecurityLevel: privileged``
(the CRD then lets the fields through), and the operator honours that only in a namespace the
cluster admin lists in the chart value ``podSecurity.privilegedNamespaces``; anywhere else the job
is ``ValidationFailed`` and nothing is created (``asyncrl.operator.pod_policy.admission_problems``).

Each :class:`Check` is one rule: the place it names (a path below the template), the CEL of a
violation there (``v`` is the value at that place) and the same test in Python over the template as
JSON (``template.model_dump(by_alias=True)``): the two are written side by side so they stay equal,
and ``tests/support/bad_inputs.py`` has a case for every one.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from asyncrl.api.cel import CelRule
from asyncrl.api.constants import (
    RESERVED_ANNOTATION_KEYS,
    RESERVED_ANNOTATION_PREFIXES,
    RESERVED_LABEL_KEYS,
    RESERVED_LABEL_PREFIXES,
)
from asyncrl.api.kube_types import OTHER_VOLUME_TYPES


class PodSecurityLevel(StrEnum):
    """What a role's template asks of the Pod Security Standards."""

    RESTRICTED = "restricted"
    PRIVILEGED = "privileged"


ADMIN_VALUE = "podSecurity.privilegedNamespaces"
OPT_IN = (f"; only a namespace the cluster admin lists in the chart value {ADMIN_VALUE} may run it, and the "
          "template must then set podSecurityLevel: privileged")
# https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline "Sysctls", as of 1.32)
SAFE_SYSCTLS = ("kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes")
SELINUX_TYPES = ("container_t", "container_init_t", "container_kvm_t", "container_engine_t")
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"

PRIVILEGED_MESSAGE = "the restricted Pod Security level forbids privileged containers: remove privileged" + OPT_IN
ESCALATION_MESSAGE = ("the restricted Pod Security level forbids privilege escalation: remove "
                      "allowPrivilegeEscalation (the operator sets false)" + OPT_IN)
NON_ROOT_MESSAGE = ("the restricted Pod Security level requires runAsNonRoot: remove runAsNonRoot: false (the "
                    "operator sets true)" + OPT_IN)
ROOT_USER_MESSAGE = ("the restricted Pod Security level forbids runAsUser 0 (root): use the image's user 10001 or "
                     "another non-zero uid" + OPT_IN)
CAPABILITIES_ADD_MESSAGE = ("the restricted Pod Security level allows adding only the capability NET_BIND_SERVICE: "
                            "remove the others from capabilities.add" + OPT_IN)
CAPABILITIES_DROP_MESSAGE = ("the restricted Pod Security level requires dropping ALL capabilities: capabilities.drop "
                             "replaces the operator's [ALL], so keep ALL in it or leave drop out" + OPT_IN)
SECCOMP_MESSAGE = ("the restricted Pod Security level forbids seccomp Unconfined: use RuntimeDefault (the "
                   "operator's default) or Localhost with a localhostProfile" + OPT_IN)
APPARMOR_MESSAGE = ("the restricted Pod Security level forbids AppArmor Unconfined: use RuntimeDefault or "
                    "Localhost" + OPT_IN)
APPARMOR_ANNOTATION_MESSAGE = (f"the restricted Pod Security level allows {APPARMOR_ANNOTATION}* annotations only "
                               "with runtime/default or localhost/<profile>" + OPT_IN)
PROC_MOUNT_MESSAGE = "the restricted Pod Security level forbids procMount Unmasked: remove procMount" + OPT_IN
SYSCTLS_MESSAGE = (f"the restricted Pod Security level allows only the safe sysctls ({', '.join(SAFE_SYSCTLS)})"
                   + OPT_IN)
SELINUX_MESSAGE = (f"the restricted Pod Security level allows seLinuxOptions.type only {', '.join(SELINUX_TYPES)} "
                   "and never user or role" + OPT_IN)
HOST_PROCESS_MESSAGE = ("the restricted Pod Security level forbids Windows HostProcess containers: remove "
                        "windowsOptions.hostProcess" + OPT_IN)
VOLUME_TYPE_MESSAGE = ("the restricted Pod Security level allows only configMap, csi, downwardAPI, emptyDir, "
                       "ephemeral, persistentVolumeClaim, projected and secret volumes (never hostPath: it opens "
                       "the node's files, e.g. / or the container runtime's socket); use a persistentVolumeClaim"
                       + OPT_IN)
RESERVED_LABEL_MESSAGE = (
    f"label keys {', '.join(RESERVED_LABEL_KEYS)} and every key under {', '.join(RESERVED_LABEL_PREFIXES)} are the "
    "operator's (it finds a job's pods and Ray cluster by them): use a key of your own, e.g. example.com/team"
)
RESERVED_ANNOTATION_MESSAGE = (
    f"annotation keys {', '.join(RESERVED_ANNOTATION_KEYS)} and every key under "
    f"{', '.join(RESERVED_ANNOTATION_PREFIXES)} are the operator's: use a key of your own, e.g. example.com/note"
)
MOUNT_NEEDS_VOLUME_MESSAGE = "every volumeMounts[].name must be the name of one of the template's volumes"

_Test = Callable[[Any], bool]


@dataclass(frozen=True)
class Check:
    """A rule of the restricted level at ``path`` (below the template): ``cel`` and ``test`` say
    whether the value ``v`` there violates it."""

    path: str
    cel: str
    test: _Test
    message: str


_ASKS_PRIVILEGED = f"(has(self.podSecurityLevel) && self.podSecurityLevel == '{PodSecurityLevel.PRIVILEGED.value}')"


def _sub(cel: str, ref: str) -> str:
    """``cel`` with the placeholder ``@`` replaced by ``ref``."""
    return cel.replace("@", ref)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _both(field: str, cel: str, test: _Test, message: str) -> list[Check]:
    """The same rule on the pod's and the container's security context."""
    return [Check(f"{ctx}.{field}", cel, test, message) for ctx in ("podSecurityContext", "securityContext")]


def _selinux_bad(v: Mapping[str, Any]) -> bool:
    return "user" in v or "role" in v or ("type" in v and v["type"] not in SELINUX_TYPES)


def _apparmor_annotation_bad(annotations: Mapping[str, str]) -> bool:
    return any(k.startswith(APPARMOR_ANNOTATION) and v != "runtime/default" and not v.startswith("localhost/")
               for k, v in annotations.items())


CHECKS: tuple[Check, ...] = (
    Check("securityContext.privileged", "@ == true", lambda v: v is True, PRIVILEGED_MESSAGE),
    Check("securityContext.allowPrivilegeEscalation", "@ == true", lambda v: v is True, ESCALATION_MESSAGE),
    *_both("runAsNonRoot", "@ == false", lambda v: v is False, NON_ROOT_MESSAGE),
    *_both("runAsUser", "@ == 0", lambda v: v == 0, ROOT_USER_MESSAGE),
    Check("securityContext.capabilities.add", "@.exists(c, c != 'NET_BIND_SERVICE')",
          lambda v: any(c != "NET_BIND_SERVICE" for c in v), CAPABILITIES_ADD_MESSAGE),
    Check("securityContext.capabilities.drop", "!('ALL' in @)", lambda v: "ALL" not in v, CAPABILITIES_DROP_MESSAGE),
    *_both("seccompProfile.type", "@ == 'Unconfined'", lambda v: v == "Unconfined", SECCOMP_MESSAGE),
    *_both("appArmorProfile.type", "@ == 'Unconfined'", lambda v: v == "Unconfined", APPARMOR_MESSAGE),
    *_both("seLinuxOptions", f"has(@.user) || has(@.role) || (has(@.type) && !(@.type in {_cel_list(SELINUX_TYPES)}))",
           _selinux_bad, SELINUX_MESSAGE),
    *_both("windowsOptions.hostProcess", "@ == true", lambda v: v is True, HOST_PROCESS_MESSAGE),
    Check("securityContext.procMount", "@ == 'Unmasked'", lambda v: v == "Unmasked", PROC_MOUNT_MESSAGE),
    Check("podSecurityContext.sysctls", f"@.exists(s, !(s.name in {_cel_list(SAFE_SYSCTLS)}))",
          lambda v: any(s["name"] not in SAFE_SYSCTLS for s in v), SYSCTLS_MESSAGE),
    Check("volumes", "@.exists(x, " + " || ".join(f"has(x.{t})" for t in OTHER_VOLUME_TYPES) + ")",
          lambda v: any(t in x for x in v for t in OTHER_VOLUME_TYPES), VOLUME_TYPE_MESSAGE),
    Check("annotations", f"@.exists(k, k.startsWith('{APPARMOR_ANNOTATION}') && @[k] != 'runtime/default' && "
          "!@[k].startsWith('localhost/'))", _apparmor_annotation_bad, APPARMOR_ANNOTATION_MESSAGE),
)


def _at(doc: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, Mapping) or node.get(part) is None:
            return False, None
        node = node[part]
    return True, node


def restricted_problems(template: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(path below the template, message)`` of everything in ``template`` (its JSON form) that the
    restricted level forbids; empty for a template that asks for the privileged level."""
    if template.get("podSecurityLevel") == PodSecurityLevel.PRIVILEGED.value:
        return []
    problems = []
    for check in CHECKS:
        present, value = _at(template, check.path)
        if present and check.test(value):
            problems.append((check.path, f"{check.message} (got {value!r})"))
    return problems


def cel_rules() -> tuple[CelRule, ...]:
    """The CEL rules of :data:`CHECKS` on the template object (with the fields they name)."""
    out = []
    for check in CHECKS:
        parts = check.path.split(".")
        present = " && ".join(f"has(self.{'.'.join(parts[:i + 1])})" for i in range(len(parts)))
        out.append(CelRule(f"{_ASKS_PRIVILEGED} || !({present} && ({_sub(check.cel, 'self.' + check.path)}))",
                           check.message, "." + check.path))
    return tuple(out)


def _reserved_keys_cel(keys: tuple[str, ...], prefixes: tuple[str, ...]) -> str:
    # Exact keys by map lookup, outside the loop: a list test per key cost 1.1x the API server's
    # budget for a 64-entry map (kube-apiserver 1.36 refused the CRD).
    absent = " && ".join(f"!('{k}' in self)" for k in keys)
    loop = " && ".join(f"!k.startsWith('{p}')" for p in prefixes)
    return f"{absent} && self.all(k, {loop})"


def reserved_label_cel() -> str:
    """CEL on a labels map: no key is one of the operator's."""
    return _reserved_keys_cel(RESERVED_LABEL_KEYS, RESERVED_LABEL_PREFIXES)


def reserved_annotation_cel() -> str:
    """CEL on an annotations map: no key is one of the operator's."""
    return _reserved_keys_cel(RESERVED_ANNOTATION_KEYS, RESERVED_ANNOTATION_PREFIXES)


def reserved_annotation(key: str) -> bool:
    return key in RESERVED_ANNOTATION_KEYS or key.startswith(RESERVED_ANNOTATION_PREFIXES)
