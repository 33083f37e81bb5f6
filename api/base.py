"""The base model of every spec section: camelCase fields, unknown fields refused.

Every field of a section must carry a ``description``: it becomes the CRD's ``kubectl explain``
text, so a test walks all models and fails on a field without one.
"""

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from asyncrl.api.cel import CelRule


class SpecModel(BaseModel):
    """A section of the AsyncRLJob spec (immutable once validated)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=False,
    )

    # CEL rules (Kubernetes `x-kubernetes-validations`) that mirror this model's cross-field
    # validators, with the same messages. The CRD generator attaches them to this object's node.
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    def to_spec_dict(self) -> dict[str, Any]:
        """The section as it is written in YAML (camelCase, defaults included)."""
        return self.model_dump(mode="json", by_alias=True)
