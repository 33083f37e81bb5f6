"""``metadata`` of an AsyncRLJob: the Kubernetes object metadata a job file sets, and the job name's rule.

The job's children are named after it (:mod:`asyncrl.operator.names`), hence the name's length limit; the
CRD checks it with :data:`NAME_RULE` (a root-level rule: only the root may read ``metadata.name``).
"""

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from asyncrl.api.cel import CelRule

# Children are named "<job>-<role>-<index>"; 40 leaves room for the longest suffix under the
# 63-character label-value and DNS-label limits. RFC 1035 (a letter first), because the job's
# Service is named after it.
MAX_NAME_LENGTH = 40
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_MESSAGE = (
    f"a job name is an RFC 1035 label: a lower-case letter first, then lower-case letters, digits or '-', "
    f"ending with a letter or digit, at most {MAX_NAME_LENGTH} characters (e.g. 'calc-ewma')"
)
# A root-level CEL rule of the CRD (root rules may read metadata.name).
NAME_RULE = CelRule(
    f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && self.metadata.name.matches('{NAME_PATTERN}')",
    NAME_MESSAGE,
    ".metadata.name",
)
_NAME = re.compile(NAME_PATTERN)
NAMESPACE_MESSAGE = (
    "a namespace is an RFC 1123 label: lower-case letters, digits or '-', starting and ending with a letter or "
    "digit, at most 63 characters (e.g. 'team-rl')"
)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class ObjectMeta(BaseModel):
    """Kubernetes object metadata (``metav1.ObjectMeta``): what a job file sets, and what the API server
    adds (accepted, so a ``kubectl get -o yaml`` validates again). Any other key is a typo (``lables``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    name: str = Field(description=f"Job name: an RFC 1035 label of at most {MAX_NAME_LENGTH} characters.")
    namespace: str | None = Field(
        default=None, max_length=63, description="Namespace of the job (an RFC 1123 label)."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Labels copied to every child object.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations of the job.")
    # Written by the API server (and by kubectl): accepted as they come, never read by asyncrl.
    generate_name: str | None = Field(default=None, description="Name prefix for the server to complete.")
    uid: str | None = Field(default=None, description="Set by the API server.")
    resource_version: str | None = Field(default=None, description="Set by the API server.")
    generation: int | None = Field(default=None, description="Set by the API server.")
    creation_timestamp: Any = Field(default=None, description="Set by the API server.")
    deletion_timestamp: Any = Field(default=None, description="Set by the API server.")
    deletion_grace_period_seconds: int | None = Field(default=None, description="Set by the API server.")
    self_link: str | None = Field(default=None, description="Set by old API servers.")
    owner_references: list[dict[str, Any]] = Field(default_factory=list, description="Owners of the job.")
    finalizers: list[str] = Field(default_factory=list, description="Finalizers of the job.")
    managed_fields: list[dict[str, Any]] = Field(default_factory=list, description="Server-side apply bookkeeping.")

    @field_validator("name")
    @classmethod
    def _rfc1035_label(cls, v: str) -> str:
        # fullmatch: with re.match, '$' also matches before a final newline ('calc\n' would pass)
        if len(v) > MAX_NAME_LENGTH or not _NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid job name: {NAME_MESSAGE}")
        return v

    @field_validator("namespace")
    @classmethod
    def _rfc1123_label(cls, v: str | None) -> str | None:
        if v is not None and not _NAMESPACE.fullmatch(v):
            raise ValueError(f"{v!r} is not a valid namespace: {NAMESPACE_MESSAGE}")
        return v
