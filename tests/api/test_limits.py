"""Every scalar of the spec is as strict as the CRD and bounded: walks every spec model, so a field added
later is held to the same rules (strict types, finite floats, a maximum for every number, enums by value,
and the CRD's bounds equal to the model's)."""

import enum
import math
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from asyncrl.api.base import SpecModel
from asyncrl.api.crd import all_spec_models, spec_schema
from asyncrl.api.job import AsyncRLJobSpec

# Numbers bounded by their own validator (and CEL rule) rather than by a maximum: (model, field, why).
BOUNDED_BY_VALIDATOR = {
    ("EwmaSpec", "decay"): "strictly between 0 and 1 (DECAY_MESSAGE), a validator so that 'auto' gets its own hint",
    ("Bounds", "given_low"): "0 < low < 1 by the order rule shared with high (BOUNDS_ORDER_MESSAGE)",
}


def _scalar(annotation: Any) -> type | None:
    """``int``, ``float``, ``bool`` or ``str`` for a scalar field (``X | None`` too), else None."""
    args = [a for a in (typing.get_args(annotation) or (annotation,)) if a is not type(None)]
    if len(args) == 1 and args[0] in (int, float, bool, str):
        return args[0]  # type: ignore[no-any-return]
    return None


def _fields(kind: type) -> list[tuple[type[SpecModel], str, Any]]:
    return [(m, name, f) for m in all_spec_models() for name, f in m.model_fields.items() if _scalar(f.annotation) is kind]


def _upper(field: Any) -> float | None:
    for meta in field.metadata:
        for attr in ("le", "lt"):
            if getattr(meta, attr, None) is not None:
                return float(getattr(meta, attr))
    return None


def _errors_at(model: type[BaseModel], alias: str, value: Any) -> list[str]:
    try:
        model.model_validate({alias: value})
    except ValidationError as exc:
        return [e["type"] for e in exc.errors() if e["loc"][:1] == (alias,)]
    return []


def _id(case: tuple[type, str, Any]) -> str:
    return f"{case[0].__name__}.{case[1]}"


NUMBERS = _fields(int) + _fields(float)


@pytest.mark.parametrize("case", NUMBERS, ids=_id)
def test_every_number_has_a_maximum(case: tuple[type[SpecModel], str, Any]) -> None:
    model, name, field = case
    assert _upper(field) is not None or (model.__name__, name) in BOUNDED_BY_VALIDATOR, (
        f"{model.__name__}.{name} has no maximum: give it le= (a count a cluster can honour, a sensible range)")


@pytest.mark.parametrize("case", _fields(float), ids=_id)
def test_every_float_is_finite(case: tuple[type[SpecModel], str, Any]) -> None:
    model, name, field = case
    for value in (math.inf, -math.inf, math.nan):
        assert "finite_number" in _errors_at(model, field.alias or name, value), (model.__name__, name, value)


@pytest.mark.parametrize("case", _fields(int), ids=_id)
def test_an_int_takes_no_bool_string_or_fraction(case: tuple[type[SpecModel], str, Any]) -> None:
    model, name, field = case
    for value in (True, "1", 1.5, 1.0):
        assert "int_type" in _errors_at(model, field.alias or name, value), (model.__name__, name, value)


@pytest.mark.parametrize("case", _fields(float), ids=_id)
def test_a_float_takes_no_bool_or_string(case: tuple[type[SpecModel], str, Any]) -> None:
    model, name, field = case
    for value in (True, "0.5"):
        assert "float_type" in _errors_at(model, field.alias or name, value), (model.__name__, name, value)


@pytest.mark.parametrize("case", _fields(bool), ids=_id)
def test_a_bool_takes_no_string_or_number(case: tuple[type[SpecModel], str, Any]) -> None:
    model, name, field = case
    for value in ("yes", "true", 1, 0):
        assert "bool_type" in _errors_at(model, field.alias or name, value), (model.__name__, name, value)


ENUMS = [(m, name, f) for m in all_spec_models() for name, f in m.model_fields.items()
         if any(isinstance(a, type) and issubclass(a, enum.Enum) for a in typing.get_args(f.annotation) or (f.annotation,))]


@pytest.mark.parametrize("case", ENUMS, ids=_id)
def test_an_enum_field_takes_its_string_values(case: tuple[type[SpecModel], str, Any]) -> None:
    model, name, field = case
    (kind,) = [a for a in typing.get_args(field.annotation) or (field.annotation,) if isinstance(a, type)
               and issubclass(a, enum.Enum)]
    for member in kind:  # the only error may be a cross-field rule of the model, never the enum's type
        assert not {"is_instance_of", "enum"} & set(_errors_at(model, field.alias or name, member.value))


def test_defaults_and_aliases_survive_strict_mode() -> None:
    spec = AsyncRLJobSpec()
    assert spec.async_.max_staleness == 2 and spec.train.learning_rate == 3e-4
    by_alias = AsyncRLJobSpec.model_validate({"async": {"maxStaleness": 3}, "train": {"learningRate": 1}})
    by_name = AsyncRLJobSpec.model_validate({"async_": {"max_staleness": 3}, "train": {"learning_rate": 1.0}})
    assert by_alias == by_name and by_alias.train.learning_rate == 1.0  # an int is a float, as in JSON
    assert AsyncRLJobSpec.model_validate(spec.to_spec_dict()) == spec


def _crd_leaves(model: type[BaseModel], node: dict[str, Any], path: str) -> list[tuple[str, Any, dict[str, Any]]]:
    out = []
    for name, field in model.model_fields.items():
        sub = node["properties"][field.alias or name]
        child = next((a for a in typing.get_args(field.annotation) or (field.annotation,)
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
        where = f"{path}.{field.alias or name}"
        if child is not None and "properties" in sub:
            out += _crd_leaves(child, sub, where)
        elif _scalar(field.annotation) in (int, float):
            out.append((where, field, sub))
    return out


def test_the_crd_has_the_models_types_and_bounds() -> None:
    leaves = _crd_leaves(AsyncRLJobSpec, spec_schema(), "spec")
    assert len(leaves) > 60
    for where, field, node in leaves:
        assert node["type"] == ("integer" if _scalar(field.annotation) is int else "number"), where
        upper = _upper(field)
        if upper is not None:
            assert float(node["maximum"]) == upper, where


def test_the_operator_never_builds_pods_for_a_spec_over_the_limits() -> None:
    from asyncrl.api.validation import SpecError
    from asyncrl.operator.reconcile import parse_spec

    body = {"metadata": {"name": "huge", "namespace": "default"}, "spec": {"rollout": {"replicas": 20000}}}
    refused = parse_spec(body)  # the reconcile marks the job ValidationFailed and creates nothing
    assert isinstance(refused, SpecError)
    assert [p.path for p in refused.problems] == ["spec.rollout.replicas"]
    assert "less than or equal to 512" in refused.problems[0].message
