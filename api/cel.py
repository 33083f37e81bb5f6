"""CEL rules of the CRD and the model checks that mirror them: one message for both.

A rule is a Kubernetes ``x-kubernetes-validations`` entry. It sits either on a model (the class
attribute ``cel_rules``: ``self`` is that object) or on one field's own schema node
(:func:`on_field`: ``self`` is the field's value). The API server evaluates a rule only when the
object is otherwise schema-valid, and only on typed nodes: a rule never sits on, or names, a
free-form (``x-kubernetes-preserve-unknown-fields``) node (a test walks the generated CRD).

``field_path`` (a JSON path relative to the node, e.g. ``.gpusPerReplica``) makes the server
report the error at that field; the model reports the same path by raising :class:`RuleError`
with the same relative path, so ``asyncrl validate`` and ``kubectl apply`` name one field.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry."""

    rule: str
    message: str
    field_path: str = ""

    def to_schema(self) -> dict[str, str]:
        out = {"rule": self.rule, "message": self.message}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def on_field(*rules: CelRule, **extra: Any) -> dict[str, Any]:
    """``json_schema_extra`` of a field whose own schema node carries ``rules`` (plus ``extra`` keys)."""
    return {"x-kubernetes-validations": [r.to_schema() for r in rules], **extra}


class RuleError(ValueError):
    """A model check that failed at one or more fields below the model.

    ``problems`` holds ``(relative_path, message)``; ``relative_path`` is dotted camelCase below the
    model that raised it ("" = the model itself), the same place a CEL rule's ``fieldPath`` names.
    """

    def __init__(self, problems: Iterable[tuple[str, str]]) -> None:
        self.problems = [(path.lstrip("."), message) for path, message in problems]
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in self.problems))


def raise_all(problems: list[tuple[str, str]]) -> None:
    """Raise every collected ``(relative_path, message)`` together, if there is any."""
    if problems:
        raise RuleError(problems)


def cel_literal(value: Any) -> str:
    """A JSON scalar as a CEL literal (strings single-quoted, booleans lower-case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    raise TypeError(f"no CEL literal for {value!r}")


def at_defaults_cel(model: type[BaseModel], ref: str = "self") -> str:
    """CEL that holds when the object ``ref`` (of ``model``) sets nothing but its defaults.

    A field whose default is None must be absent; a nested model must itself be at its
    defaults. Generated from the model, so the defaults live in one place.
    """
    terms = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        sub = f"{ref}.{key}"
        nested = field.annotation if isinstance(field.annotation, type) else None
        if nested is not None and issubclass(nested, BaseModel):
            terms.append(f"(!has({sub}) || ({at_defaults_cel(nested, sub)}))")
        elif field.default is None:
            terms.append(f"!has({sub})")
        else:
            default = field.default.value if hasattr(field.default, "value") else field.default
            terms.append(f"(!has({sub}) || {sub} == {cel_literal(default)})")
    return " && ".join(terms) if terms else "true"


def changed_from_defaults(obj: BaseModel) -> list[str]:
    """camelCase names of the fields of ``obj`` whose value differs from the model's default."""
    fresh = type(obj)()
    return [
        field.alias or name
        for name, field in type(obj).model_fields.items()
        if getattr(obj, name) != getattr(fresh, name)
    ]
