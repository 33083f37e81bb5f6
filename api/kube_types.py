"""Kubernetes objects a role's template may carry, typed so that validation and CEL can see inside.

A free-form map (``x-kubernetes-preserve-unknown-fields``) is invisible to the API server's CEL
(``asyncrl.api.cel``), so the security contexts and the volumes are modelled field by field, with
Kubernetes' own names (``kubectl explain pod.spec.securityContext``). Every field is optional and
an unset field is left out when dumped, as Kubernetes writes them: the operator merges what is set
over its hardened defaults (``asyncrl.operator.pod_policy``). The rules of the ``restricted`` Pod
Security level over these objects live in :mod:`asyncrl.api.pod_security`.
"""

import posixpath
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, create_model, field_validator, model_serializer, model_validator
from pydantic_core.core_schema import SerializerFunctionWrapHandler

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule, RuleError, on_field
from asyncrl.api.constants import OPERATOR_VOLUMES

RESERVED_VOLUMES = tuple(OPERATOR_VOLUMES)
RESERVED_PATHS = tuple(OPERATOR_VOLUMES.values())
RESERVED_VOLUME_MESSAGE = (
    f"volume names {', '.join(RESERVED_VOLUMES)} and mount paths {', '.join(RESERVED_PATHS)} (and paths below "
    "them) are the operator's own (the job spec, shared memory, checkpoints, the driver's status relay and its "
    "ServiceAccount token); pick another name or path"
)
MOUNT_PATH_MESSAGE = (
    "mountPath must be an absolute, normalised path: it starts with /, has no empty, '.' or '..' segment and no "
    "trailing slash (write /data/cache, not data/cache, /data//cache, /data/./cache or /data/cache/)"
)
SUB_PATH_MESSAGE = "subPath must be a relative path inside the volume without '..' segments (e.g. models/base)"
ONE_SOURCE_MESSAGE = "a volume needs exactly one volume source, e.g. {name: data, persistentVolumeClaim: {claimName: d}}"
PROFILE_MESSAGE = "localhostProfile is required with type Localhost and only allowed with it"
ESCALATION_CONFLICT_MESSAGE = (
    "allowPrivilegeEscalation: false cannot go with privileged: true or the capability SYS_ADMIN (Kubernetes "
    "refuses such a pod): remove allowPrivilegeEscalation"
)
SYS_ADMIN = ("SYS_ADMIN", "CAP_SYS_ADMIN")

# Volume sources the restricted Pod Security level allows, and every other source Kubernetes knows.
RESTRICTED_VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                           "projected", "secret")
OTHER_VOLUME_TYPES = ("awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "fc", "flexVolume",
                      "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath", "image", "iscsi", "nfs",
                      "photonPersistentDisk", "portworxVolume", "quobyte", "rbd", "scaleIO", "storageos",
                      "vsphereVolume")
VOLUME_TYPES = RESTRICTED_VOLUME_TYPES + OTHER_VOLUME_TYPES

_NORMAL_ABSOLUTE = r"^(/[^/]+)+$"  # absolute, no empty segment, no trailing slash
_DOT_SEGMENT = r"/\.\.?(/|$)"  # a '.' or '..' segment
_PARENT_SEGMENT = r"(^|/)\.\.(/|$)"  # a '..' segment of a relative path


def _cel_regex(pattern: str) -> str:
    """``pattern`` inside a single-quoted CEL string (backslashes escaped)."""
    return pattern.replace("\\", "\\\\")


def mount_path_ok(path: str) -> bool:
    """``path`` is absolute and normalised (what :data:`MOUNT_PATH_MESSAGE` asks for)."""
    return re.fullmatch(_NORMAL_ABSOLUTE, path) is not None and re.search(_DOT_SEGMENT, path) is None


def reserved_path(path: str) -> bool:
    """``path`` is one of the operator's mount paths or below one."""
    return any(path == p or path.startswith(p + "/") for p in RESERVED_PATHS)


def _not_in(values: tuple[str, ...]) -> str:
    return " && ".join(f"self != '{v}'" for v in values)


MAX_ID = 2**31 - 1  # the API server's bound on a user or group id (IsValidUserID/IsValidGroupID)


class KubeModel(SpecModel):
    """A Kubernetes object inside the spec: unset fields are left out when dumped."""

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


_PROFILE_RULE = CelRule("(self.type == 'Localhost') == has(self.localhostProfile)", PROFILE_MESSAGE)


class _Profile(KubeModel):
    type: Literal["RuntimeDefault", "Localhost", "Unconfined"] = Field(
        description="RuntimeDefault, Localhost (a profile on the node) or Unconfined.")
    localhost_profile: str | None = Field(default=None, description="The profile on the node (type Localhost).")

    cel_rules: ClassVar[tuple[CelRule, ...]] = (_PROFILE_RULE,)

    @model_validator(mode="after")
    def _localhost_has_a_profile(self) -> "_Profile":
        if (self.type == "Localhost") != (self.localhost_profile is not None):
            raise ValueError(f"{PROFILE_MESSAGE} (got {self.model_dump(by_alias=True)})")
        return self


class SeccompProfile(_Profile):
    """A seccomp profile (the restricted level allows RuntimeDefault and Localhost)."""


class AppArmorProfile(_Profile):
    """An AppArmor profile (the restricted level allows RuntimeDefault and Localhost)."""


class SELinuxOptions(KubeModel):
    """SELinux labels (the restricted level allows only the container types, never user or role)."""

    user: str | None = Field(default=None, description="SELinux user label.")
    role: str | None = Field(default=None, description="SELinux role label.")
    type: str | None = Field(default=None, description="SELinux type label, e.g. container_t.")
    level: str | None = Field(default=None, description="SELinux level label.")


class WindowsOptions(KubeModel):
    """Windows-specific settings."""

    gmsa_credential_spec_name: str | None = Field(default=None, description="Name of the GMSA credential spec.")
    gmsa_credential_spec: str | None = Field(default=None, description="GMSA credential spec contents.")
    run_as_user_name: str | None = Field(default=None, description="Windows user name of the entrypoint.")
    host_process: bool | None = Field(default=None, description="Run as a Windows HostProcess container.")


class Capabilities(KubeModel):
    """Linux capabilities added to and dropped from the container's default set."""

    add: list[str] | None = Field(default=None, max_length=64, description="Capabilities to add.")
    drop: list[str] | None = Field(default=None, max_length=64, description="Capabilities to drop (replaces the "
                                                                             "operator's [ALL]: keep ALL in it).")


class Sysctl(KubeModel):
    """One namespaced kernel parameter of the pod."""

    name: str = Field(min_length=1, max_length=253, description="Name of the sysctl.")
    value: str = Field(max_length=1024, description="Value of the sysctl.")


class PodSecurityContext(KubeModel):
    """Kubernetes PodSecurityContext; what is set here replaces the operator's default of that field."""

    fs_group: int | None = Field(default=None, ge=0, le=MAX_ID, description="Group owning fresh volumes (default 10001).")
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] | None = Field(
        default=None, description="When the volume ownership is changed: OnRootMismatch or Always.")
    run_as_group: int | None = Field(default=None, ge=0, le=MAX_ID, description="Group of the processes (default 10001).")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start as root (default true).")
    run_as_user: int | None = Field(default=None, ge=0, le=MAX_ID, description="User of the processes (default 10001; "
                                                                             "not 0).")
    se_linux_options: SELinuxOptions | None = Field(default=None, description="SELinux labels.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp profile (default "
                                                                             "RuntimeDefault).")
    app_armor_profile: AppArmorProfile | None = Field(default=None, description="AppArmor profile.")
    supplemental_groups: list[int] | None = Field(default=None, max_length=64, description="Extra groups.")
    supplemental_groups_policy: Literal["Merge", "Strict"] | None = Field(
        default=None, description="How supplementalGroups combine with the image's: Merge or Strict.")
    se_linux_change_policy: Literal["MountOption", "Recursive"] | None = Field(
        default=None, description="How volumes get their SELinux label: MountOption or Recursive.")
    sysctls: list[Sysctl] | None = Field(default=None, max_length=64, description="Namespaced sysctls (the "
                                                                                  "restricted level's safe set).")
    windows_options: WindowsOptions | None = Field(default=None, description="Windows settings.")


class SecurityContext(KubeModel):
    """Kubernetes SecurityContext of the container; what is set here replaces the operator's default
    (nested objects merge key by key: ``capabilities: {add: [...]}`` keeps ``drop: [ALL]``)."""

    allow_privilege_escalation: bool | None = Field(default=None, description="no_new_privs off (default false).")
    app_armor_profile: AppArmorProfile | None = Field(default=None, description="AppArmor profile.")
    capabilities: Capabilities | None = Field(default=None, description="Capabilities (default drop: [ALL]).")
    privileged: bool | None = Field(default=None, description="Run privileged (the restricted level forbids it).")
    proc_mount: Literal["Default", "Unmasked"] | None = Field(default=None, description="Default or Unmasked.")
    read_only_root_filesystem: bool | None = Field(default=None, description="Mount the image read-only.")
    run_as_group: int | None = Field(default=None, ge=0, le=MAX_ID, description="Group of the process.")
    run_as_non_root: bool | None = Field(default=None, description="Refuse to start as root.")
    run_as_user: int | None = Field(default=None, ge=0, le=MAX_ID, description="User of the process (not 0).")
    se_linux_options: SELinuxOptions | None = Field(default=None, description="SELinux labels.")
    seccomp_profile: SeccompProfile | None = Field(default=None, description="Seccomp profile.")
    windows_options: WindowsOptions | None = Field(default=None, description="Windows settings.")

    cel_rules: ClassVar[tuple[CelRule, ...]] = (CelRule(
        "!has(self.allowPrivilegeEscalation) || self.allowPrivilegeEscalation || !((has(self.privileged) && "
        "self.privileged) || (has(self.capabilities) && has(self.capabilities.add) && "
        f"self.capabilities.add.exists(c, c in [{', '.join(repr(c) for c in SYS_ADMIN)}])))",
        ESCALATION_CONFLICT_MESSAGE),)

    @model_validator(mode="after")
    def _escalation_fits(self) -> "SecurityContext":
        if self.allow_privilege_escalation is False and self.escalates():
            raise ValueError(f"{ESCALATION_CONFLICT_MESSAGE} (got {self.model_dump(by_alias=True)})")
        return self

    def escalates(self) -> bool:
        """Privileged or with SYS_ADMIN: Kubernetes then requires privilege escalation."""
        added = (self.capabilities.add if self.capabilities else None) or []
        return self.privileged is True or any(c in SYS_ADMIN for c in added)


_VolumeSources = create_model(  # type: ignore[call-overload]  # one typed open object per source (CEL: has())
    "_VolumeSources",
    __base__=KubeModel,
    **{t: (dict[str, Any] | None, Field(default=None, alias=t, description=f"Kubernetes {t} volume source."))
       for t in VOLUME_TYPES},
)


class Volume(_VolumeSources):  # type: ignore[misc,valid-type]
    """A Kubernetes Volume: a name and exactly one source (the restricted level allows
    configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected and secret)."""

    name: str = Field(min_length=1, max_length=63,
                      description="Name of the volume (not spec, dshm, checkpoints, status-relay or status-token).",
                      json_schema_extra=on_field(CelRule(_not_in(RESERVED_VOLUMES), RESERVED_VOLUME_MESSAGE)))

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(f"[{', '.join(f'has(self.{t})' for t in VOLUME_TYPES)}].filter(x, x).size() == 1",
                ONE_SOURCE_MESSAGE),
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v in RESERVED_VOLUMES:
            raise ValueError(f"{RESERVED_VOLUME_MESSAGE} (got volume {v!r})")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> "Volume":
        sources = self.sources()
        if len(sources) != 1:
            raise ValueError(f"{ONE_SOURCE_MESSAGE} (volume {self.name!r} has {sources or 'none'})")
        return self

    def sources(self) -> list[str]:
        """The volume sources set (exactly one once validated)."""
        return [t for t in VOLUME_TYPES if getattr(self, t) is not None]


class VolumeMount(SpecModel):
    """Where one of ``volumes`` is mounted in the role's container."""

    name: str = Field(min_length=1, max_length=63, description="Name of the volume (from volumes) to mount.",
                      json_schema_extra=on_field(CelRule(_not_in(RESERVED_VOLUMES), RESERVED_VOLUME_MESSAGE)))
    mount_path: str = Field(
        min_length=1, max_length=1024,
        description="Absolute, normalised path inside the container (not /etc/asyncrl, /dev/shm, /checkpoints, "
        "/var/run/asyncrl, /var/run/secrets/kubernetes.io/serviceaccount or below them).",
        json_schema_extra=on_field(
            CelRule(f"self.matches('{_NORMAL_ABSOLUTE}') && !self.matches('{_cel_regex(_DOT_SEGMENT)}')",
                    MOUNT_PATH_MESSAGE),
            CelRule(" && ".join(f"self != '{p}' && !self.startsWith('{p}/')" for p in RESERVED_PATHS),
                    RESERVED_VOLUME_MESSAGE),
        ),
    )
    read_only: bool = Field(default=False, description="Mount read-only.")
    sub_path: str | None = Field(
        default=None, max_length=1024, description="Relative path inside the volume to mount instead of its root.",
        json_schema_extra=on_field(CelRule(
            f"!self.startsWith('/') && !self.matches('{_cel_regex(_PARENT_SEGMENT)}')", SUB_PATH_MESSAGE)),
    )

    @model_validator(mode="after")
    def _checked(self) -> "VolumeMount":
        problems = []
        if self.name in RESERVED_VOLUMES:
            problems.append(("name", f"{RESERVED_VOLUME_MESSAGE} (got {self.name!r})"))
        if not mount_path_ok(self.mount_path):
            normal = posixpath.normpath(self.mount_path)
            problems.append(("mountPath", f"{MOUNT_PATH_MESSAGE} (got {self.mount_path!r}"
                             + (f"; normalised that is {normal!r})" if normal.startswith("/") else ")")))
        elif reserved_path(self.mount_path):
            problems.append(("mountPath", f"{RESERVED_VOLUME_MESSAGE} (got {self.mount_path!r})"))
        if self.sub_path is not None and (self.sub_path.startswith("/") or re.search(_PARENT_SEGMENT, self.sub_path)):
            problems.append(("subPath", f"{SUB_PATH_MESSAGE} (got {self.sub_path!r})"))
        if problems:
            raise RuleError(problems)
        return self
