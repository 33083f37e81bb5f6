"""The generated CRD: in sync with crds/, structural, and carrying the models' CEL rules."""

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import celpy

from asyncrl.api.crd import build_crd, crd_yaml
from asyncrl.api.job import MODEL_IMMUTABLE_MESSAGE
from tests.support.crvalidate import CRValidator
from tests.support.helpers import job_manifest

ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = ROOT / "crds" / "asyncrl.io_asyncrljobs.yaml"


def test_checked_in_crd_equals_generator_output() -> None:
    assert CHECKED_IN.read_text() == crd_yaml(), "crds/ is stale: run `asyncrl crd > crds/asyncrl.io_asyncrljobs.yaml`"


def test_cli_prints_the_same_crd() -> None:
    out = subprocess.run([sys.executable, "-m", "asyncrl.trainer.cli", "crd"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == crd_yaml()


def test_names_and_subresources() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "asyncrljobs.asyncrl.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == ("AsyncRLJob", "asyncrljobs", ["arj"])
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[0] == "Phase" and columns[-1] == "Age"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict]]:
    out = []
    if isinstance(node, dict):
        if "type" in node or "x-kubernetes-preserve-unknown-fields" in node or "properties" in node:
            out.append((path, node))
        for key, sub in (node.get("properties") or {}).items():
            out.extend(_walk(sub, f"{path}.{key}"))
        if isinstance(node.get("additionalProperties"), dict):
            out.extend(_walk(node["additionalProperties"], f"{path}.*"))
        if isinstance(node.get("items"), dict):
            out.extend(_walk(node["items"], f"{path}[]"))
    return out


def test_schema_is_structural() -> None:
    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        # Every node has a type unless it explicitly preserves unknown fields.
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        for junctor in ("anyOf", "oneOf", "allOf", "$ref", "const", "title"):
            assert junctor not in node, f"{path} has {junctor}"
        assert node.get("exclusiveMinimum") in (None, True, False), path
    spec = schema["properties"]["spec"]
    undocumented = [p for p, node in _walk(spec) if p and not p.endswith(("*", "[]")) and not node.get("description")]
    assert undocumented == [], "spec fields without a description (kubectl explain text)"


def _rules(schema: dict) -> list[tuple[str, dict, dict]]:
    """(path, node, rule) of every CEL rule of the schema."""
    return [(path, node, rule) for path, node in _walk(schema) for rule in node.get("x-kubernetes-validations", [])]


def _schema() -> dict:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_cross_field_rules_are_in_the_crd() -> None:
    by_path: dict[str, list[str]] = {}
    for path, _, rule in _rules(_schema()):
        by_path.setdefault(path, []).append(rule["rule"])
    assert any("oldLogits.strategy" in r for r in by_path[".spec"])  # exact needs a strategy
    assert len(by_path[".spec.correction.mask.bounds"]) == 3  # one form, order around 1, factor > 1
    assert by_path[".spec.correction.ewma.decay"] == ["self > 0.0 && self < 1.0"]
    assert any("numKeyValueHeads" in r for r in by_path[".spec.model"])
    assert any("metadata.name" in r for r in by_path[""])  # names: a root rule


def test_every_cel_rule_sits_on_a_typed_node_and_names_only_typed_fields() -> None:
    # A real API server refuses the CRD otherwise: an untyped preserve-unknown-fields node has no CEL type
    # ("failed to construct type information"), and naming one is an "undefined field". A *typed*
    # (type: object) free-form node may be tested for presence, has(self.x), and nothing more (seen on
    # kube-apiserver 1.36: has(self.valueFrom) compiles, self.engineArgs.all(...) does not).
    schema = _schema()
    rules = _rules(schema)
    assert len(rules) >= 20
    for path, node, rule in rules:
        assert node.get("type") and not node.get("x-kubernetes-preserve-unknown-fields"), path
        for var, chain in re.findall(r"\b(self|oldSelf)((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", rule["rule"]):
            target = schema if path == "" else node
            walked = var
            keys = chain.strip(".").split(".")
            for key in keys:
                if target.get("type") != "object" or key in {"size", "matches", "startsWith"}:
                    break  # a method call on a scalar
                if "additionalProperties" in target:
                    break  # a typed map (labels, annotations): all/exists and [key] are CEL on it
                props = target.get("properties") or {}
                if path == "" and key in ("metadata",) and walked == "self":
                    target = props["metadata"]
                    walked += ".metadata"
                    continue
                assert key in props, f"{path}: rule {rule['rule']!r} names {walked}.{key}, not in the schema"
                target = props[key]
                walked += f".{key}"
                assert target.get("type"), f"{path}: {walked} is untyped"
                if target.get("x-kubernetes-preserve-unknown-fields"):
                    assert key == keys[-1] and f"has({var}{chain})" in rule["rule"], \
                        f"{path}: {walked} is free-form: a rule may only test its presence"
        if "fieldPath" in rule:
            target = schema if path == "" else node
            for key in rule["fieldPath"].strip(".").split("."):
                target = target["properties"][key]  # KeyError: a fieldPath the server refuses


def test_free_form_maps_are_typed_objects_without_rules() -> None:
    free = [(p, n) for p, n in _walk(_schema()) if n.get("x-kubernetes-preserve-unknown-fields")]
    assert {p for p, _ in free} >= {".spec.rollout.engineArgs", ".spec.actor.template.affinity"}
    for path, node in free:
        assert node.get("type") == "object", path
        assert "x-kubernetes-validations" not in node, path


def test_every_rule_compiles_with_cel_python() -> None:
    env = celpy.Environment()
    for _, _, rule in _rules(_schema()):
        env.program(env.compile(rule["rule"]))  # raises on a syntax error


def test_root_metadata_restricts_only_name_and_generate_name() -> None:
    metadata = _schema()["properties"]["metadata"]
    assert set(metadata["properties"]) == {"name", "generateName"}
    assert set(metadata) == {"type", "properties"}  # the server forbids anything else here


def test_model_is_immutable_and_other_edits_pass() -> None:
    validator = CRValidator(build_crd())
    old = job_manifest(model={"preset": "tiny-llama"})
    errors = validator.validate(job_manifest(model={"preset": "small-llama"}), old=old)
    assert errors == ['spec.model: Invalid value: "object": ' + MODEL_IMMUTABLE_MESSAGE]
    # the same model spelled out again, or left to its defaults both times, is no change (the server defaults
    # model: {}); preset has no server default (a weights folder's config.json decides the architecture), so
    # dropping a spelled-out preset is a change the server refuses, as dropping any other model field is
    assert validator.validate(job_manifest(model={"preset": "tiny-llama"}, train={"steps": 10}), old=old) == []
    assert validator.validate(job_manifest(train={"steps": 10}), old=job_manifest()) == []
    assert validator.validate(job_manifest(), old=old) != []
    # created without a model section: adding a different one later is still a change
    assert validator.validate(job_manifest(model={"preset": "small-llama"}), old=job_manifest()) != []
