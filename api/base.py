"""The base model of every spec section: camelCase fields, unknown fields refused, strict scalars.

Every field of a section must carry a ``description``: it becomes the CRD's ``kubectl explain``
text, so a test walks all models and fails on a field without one.

Scalars are as strict as the CRD (the API server refuses ``maxStaleness: true`` and
``partialRollout: "yes"`` by type, so ``asyncrl validate`` must too): no bool -> int, no str -> int,
float or bool, no float -> int; an int is a float. Floats are finite (YAML's ``.inf``/``.nan`` never
reach the server: JSON has no spelling for them). Enum fields take their string values: pydantic's
strict mode would want an enum *instance* from Python input, so every subclass's enum fields are made
lax on definition (a test walks every model and checks that each enum field takes its values).
"""

import enum
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Strict
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
        strict=True,
        allow_inf_nan=False,
    )

    # CEL rules (Kubernetes `x-kubernetes-validations`) that mirror this model's cross-field
    # validators, with the same messages. The CRD generator attaches them to this object's node.
    cel_rules: ClassVar[tuple[CelRule, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        lax = [f for f in cls.model_fields.values()
               if _is_enum(f.annotation) and not any(isinstance(m, Strict) for m in f.metadata)]
        for info in lax:  # an enum field takes its values ("ewma"), as the CRD's enum does
            info.metadata.append(Strict(False))
        if lax:
            cls.model_rebuild(force=True, raise_errors=False)

    def to_spec_dict(self) -> dict[str, Any]:
        """The section as it is written in YAML (camelCase, defaults included)."""
        return self.model_dump(mode="json", by_alias=True)


def _is_enum(annotation: Any) -> bool:
    """``E`` or ``E | None`` for an :class:`enum.Enum` ``E``."""
    args = typing.get_args(annotation) or (annotation,)
    return any(isinstance(a, type) and issubclass(a, enum.Enum) for a in args)
