"""The generated CRD: in sync with crds/, structural, and carrying the models' CEL rules."""

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from asyncrl.api.crd import build_crd, crd_yaml

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


def test_cross_field_rules_are_in_the_crd() -> None:
    text = yaml.safe_dump(build_crd())
    assert "oldLogits.strategy" in text  # exact needs a strategy
    assert "type(self) == map" in text  # bounds: number or {low, high}
    assert "numKeyValueHeads" in text
