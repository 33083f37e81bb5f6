"""The shipped CRD's schema and CEL rules, evaluated by cel-python as the API server would."""

import copy
from typing import Any

import pytest

from tests.support.crvalidate import CRValidator
from tests.support.helpers import job_manifest


@pytest.fixture(scope="module")
def validator() -> CRValidator:
    return CRValidator.from_file()


def with_spec(**spec: Any) -> dict[str, Any]:
    return job_manifest(**spec)


@pytest.mark.parametrize("bounds, ok", [
    ({"low": 0.5, "high": 2.0}, True),
    ({"low": 0.5, "high": 2}, True),      # an integer high: double(self.high) works
    (2, True), (1.5, True),               # the single-number shorthand c > 1
    (0.5, False), (1, False),
    ({"low": 1.5, "high": 2.0}, False),   # low must be < 1
    ({"low": 0.5}, False),                # both needed
])
def test_bounds_rule_with_type_self_map(validator: CRValidator, bounds: Any, ok: bool) -> None:
    errors = validator.validate(with_spec(correction={"mask": {"bounds": bounds}}))
    assert (errors == []) is ok, errors
    if not ok:
        assert errors[0].startswith("spec.correction.mask.bounds: Invalid value")


@pytest.mark.parametrize("decay, ok", [("auto", True), (0.9, True), (0.0, False), (1, False), ("fast", False)])
def test_ewma_decay_rule_number_or_auto(validator: CRValidator, decay: Any, ok: bool) -> None:
    errors = validator.validate(with_spec(correction={"ewma": {"decay": decay}}))
    assert (errors == []) is ok, errors


def test_cross_field_rules(validator: CRValidator) -> None:
    errs = validator.validate(with_spec(correction={"reference": "exact"}))
    assert errs == ["spec: Invalid value: \"object\": correction.reference 'exact' needs oldLogits.strategy "
                    "(snapshot, dedicated or interruptSync)"]
    errs = validator.validate(with_spec(actor={"replicas": 3, "gpusPerReplica": 1, "megatron": {"tensorParallel": 2}}))
    assert len(errs) == 1 and errs[0].startswith("spec.actor: Invalid value")
    errs = validator.validate(with_spec(monitoring={"maskGuard": {"warnKeepRatio": 0.5, "criticalKeepRatio": 0.8}}))
    assert len(errs) == 1 and "criticalKeepRatio" in errs[0]
    errs = validator.validate(with_spec(model={"numAttentionHeads": 6, "numKeyValueHeads": 4}))
    assert len(errs) == 1 and errs[0].startswith("spec.model")


def test_schema_errors_name_the_field(validator: CRValidator) -> None:
    bad = with_spec(rollout={"replicas": "two", "bogus": 1})
    bad["metadata"]["name"] = "Bad_Name"
    errs = validator.validate(bad)
    assert any(e.startswith("metadata.name: Invalid value") for e in errs)
    assert any(e.startswith("spec.rollout.replicas: Invalid value") for e in errs)
    assert any("spec.rollout" in e and "bogus" in e for e in errs)


def test_defaults_are_applied_before_validation(validator: CRValidator) -> None:
    obj = validator.default(with_spec())
    assert obj["spec"]["rollout"]["engine"] == "transformers"  # scalar defaults inside a present object
    # an absent section stays absent (the generated schema has no object-level defaults), which is
    # why every CEL rule guards with has()
    assert "async" not in obj["spec"]


def test_status_schema_is_typed(validator: CRValidator) -> None:
    assert validator.validate_status({"phase": "Running", "training": {"policyVersion": 3, "keepRatio": 0.9}}) == []
    assert validator.validate_status({"phase": "Bogus"})
    assert validator.validate_status({"training": {"policyVersion": -1}})


def test_validation_does_not_mutate_the_input(validator: CRValidator) -> None:
    obj = with_spec()
    before = copy.deepcopy(obj)
    validator.validate(obj)
    assert obj == before
