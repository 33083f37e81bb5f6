"""Validate AsyncRLJob objects against the **shipped** CRD as a Kubernetes API server would.

- OpenAPI v3 schema via ``openapi-schema-validator`` (OAS 3.0: ``nullable``, formats), made
  strict like ``kubectl apply`` (server-side ``fieldValidation=Strict``): an unknown field is an
  error wherever the schema lists ``properties`` and does not preserve unknown fields;
- ``default`` values applied before validation (the API server defaults first, then validates);
- every ``x-kubernetes-validations`` CEL rule evaluated with ``cel-python`` at its node, with
  ``self`` the node's value typed by its schema as the server types it (integers in ``number``
  fields are doubles, null fields of an object are absent, only declared fields are visible), a
  null node skipped, the error reported at the rule's ``fieldPath``; transition rules (``oldSelf``)
  only when an old object is given, and root rules (``metadata.name``) on the whole object;
- ``metadata.name`` checked as a DNS-1123 subdomain plus the CRD's own limits.

Errors read like the API server's: ``spec.rollout.replicas: Invalid value: ...``.
Not modelled: CEL cost limits, structural-schema checks of the CRD itself, ratcheting.

    python -m tests.support.crvalidate examples/*.yaml    # exit 1 on any invalid AsyncRLJob
"""

import copy
import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import celpy
import yaml
from openapi_schema_validator import OAS30Validator

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CRD = REPO / "crds" / "asyncrl.io_asyncrljobs.yaml"
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CEL = celpy.Environment()
# Schema failures that stop the server from evaluating any CEL rule (NotSupported, Required,
# TooLong, TooMany, TypeInvalid); a minimum or a pattern does not.
_BLOCKING = {"enum", "required", "maxLength", "maxItems", "maxProperties", "type"}
_NOT_CHECKED = ("some validation rules were not checked because the object was invalid; correct the "
                "existing errors to complete validation")


@lru_cache(maxsize=512)
def _program(rule: str) -> Any:
    return _CEL.program(_CEL.compile(rule))


def _strict(node: Any) -> Any:
    """OAS 3.0 copy of a structural schema with unknown fields refused (kubectl --validate=strict)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k != "x-kubernetes-int-or-string"}
    if isinstance(node.get("pattern"), str):
        out["pattern"] = _end_of_text(node["pattern"])
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def _end_of_text(pattern: str) -> str:
    """``pattern`` with Go's (RE2's) meaning of a final ``$`` in Python: the end of the text. The server
    matches OpenAPI patterns with Go's regexp, where ``$`` never matches before a final newline; the
    validator here uses ``re.search``, where it does (``'tiny-llama\\n'`` would pass)."""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + "\\Z"
    return pattern


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Fill ``default`` values in place, top-down, as the API server does on create and update."""
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                apply_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for v in value.values():
                apply_defaults(extra, v)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            apply_defaults(schema["items"], v)
    return value


def prune(schema: dict[str, Any], value: Any) -> Any:
    """Drop unknown fields in place (what the API server does to fields outside the schema)."""
    if isinstance(value, dict) and not schema.get("x-kubernetes-preserve-unknown-fields"):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None:
            for key in [k for k in value if k not in props]:
                del value[key]
            for key, sub in props.items():
                if key in value:
                    prune(sub, value[key])
        elif isinstance(extra, dict):
            for v in value.values():
                prune(extra, v)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for v in value:
            prune(schema["items"], v)
    return value


def to_cel(schema: dict[str, Any], value: Any) -> Any:
    """``value`` as the API server shows it to CEL under ``schema`` (k8s.io/apiserver
    pkg/cel/common/valuesunstructured.go): ``number`` fields are doubles even when written as
    integers; in an object with ``properties`` only declared fields are visible and a null field
    is absent (``has()`` is false)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None:
            return celpy.celtypes.MapType({
                celpy.celtypes.StringType(k): to_cel(props[k], v)
                for k, v in value.items() if k in props and v is not None
            })
        if isinstance(extra, dict):
            return celpy.celtypes.MapType({celpy.celtypes.StringType(k): to_cel(extra, v) for k, v in value.items()})
        return celpy.json_to_cel(value)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return celpy.celtypes.ListType([to_cel(schema["items"], v) for v in value])
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return celpy.celtypes.DoubleType(float(value))
    return celpy.json_to_cel(value)


def _number(value: Any) -> str:
    """A bound as Go's %v prints a float64 (1.0 -> 1, 0.5 -> 0.5)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _server_words(err: Any, path: str) -> str:
    """A schema error in the API server's words (k8s.io/kube-openapi pkg/validation/errors), so the
    same message fragment can be checked here and against a real server; others keep the
    validator's own text."""
    schema, value = err.schema, err.instance
    shown = json.dumps(value) if isinstance(value, str) else value
    if err.validator == "minimum":
        rel = "greater than" if schema.get("exclusiveMinimum") is True else "greater than or equal to"
        return f"Invalid value: {shown}: {path} in body should be {rel} {_number(schema['minimum'])}"
    if err.validator == "maximum":
        rel = "less than" if schema.get("exclusiveMaximum") is True else "less than or equal to"
        return f"Invalid value: {shown}: {path} in body should be {rel} {_number(schema['maximum'])}"
    if err.validator == "enum":
        supported = ", ".join(json.dumps(v) for v in schema["enum"])
        return f"Unsupported value: {json.dumps(value)}: supported values: {supported}"
    if err.validator == "pattern":
        shown_pattern = schema["pattern"].removesuffix("\\Z") + ("$" if schema["pattern"].endswith("\\Z") else "")
        return f"Invalid value: {json.dumps(value)}: {path} in body should match '{shown_pattern}'"
    if err.validator == "type":
        return f"Invalid value: {json.dumps(_kind_name(value))}: {path} in body must be of type {schema['type']}"
    return f"Invalid value: {err.message}"


def _kind_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number"}.get(type(value), "null")


def _json_path(parts: Any) -> str:
    """``spec.rollout.template.env[0].name`` (as the server writes field paths)."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


def _child(path: str, key: str) -> str:
    return key if path == "(root)" else f"{path}.{key}"


def _at(path: str, field_path: str) -> str:
    """The error path of a rule at ``path`` with ``fieldPath`` (``.a.b``) as the server reports it."""
    if not field_path:
        return path
    return field_path.lstrip(".") if path == "(root)" else path + field_path


def _cel_errors(schema: dict[str, Any], value: Any, old: Any, path: str) -> list[str]:
    errors: list[str] = []
    if value is None:
        return errors  # the server validates only non-null values
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule["rule"]
        if "oldSelf" in text and old is None:
            continue  # a transition rule: only on update
        bindings = {"self": to_cel(schema, value)}
        if old is not None:
            bindings["oldSelf"] = to_cel(schema, old)
        where = _at(path, rule.get("fieldPath", ""))
        try:
            result = _program(text).evaluate(bindings)
        except Exception as exc:  # compile or runtime error: the API server refuses the object too
            errors.append(f"{where}: Invalid value: {_kind(value)}: rule evaluation error: {exc}")
            continue
        if not (isinstance(result, celpy.celtypes.BoolType) and bool(result)):
            message = rule.get("message") or f"failed rule: {text}"
            errors.append(f"{where}: Invalid value: {_kind(value)}: {message}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                sub_old = old.get(key) if isinstance(old, dict) else None
                errors += _cel_errors(sub, value[key], sub_old, _child(path, key))
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, v in value.items():
                errors += _cel_errors(extra, v, None, _child(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            errors += _cel_errors(schema["items"], v, None, f"{path}[{i}]")
    return errors


def _kind(value: Any) -> str:
    return {dict: '"object"', list: '"array"', str: '"string"'}.get(type(value), repr(value))


class CRValidator:
    """Validator for one CRD version (the storage version by default)."""

    def __init__(self, crd: dict[str, Any], version: str | None = None) -> None:
        versions = crd["spec"]["versions"]
        chosen = next(v for v in versions if (v["name"] == version if version else v.get("storage")))
        self.crd = crd
        self.group = crd["spec"]["group"]
        self.kind = crd["spec"]["names"]["kind"]
        self.api_version = f"{self.group}/{chosen['name']}"
        self.schema: dict[str, Any] = chosen["schema"]["openAPIV3Schema"]
        self.has_status = "status" in (chosen.get("subresources") or {})
        main = copy.deepcopy(self.schema)
        main["properties"].pop("status", None)
        self.name_max = (main["properties"].get("metadata", {}).get("properties", {})
                         .get("name", {}).get("maxLength", 253))
        main["properties"]["metadata"] = {"type": "object"}  # ObjectMeta is validated apart, as in the server
        self._main = OAS30Validator(_strict(main))
        status = self.schema["properties"].get("status", {"type": "object"})
        self.status_schema = status
        self._status = OAS30Validator(status)  # not strict: the server prunes unknown status fields

    @classmethod
    def from_file(cls, path: str | Path = SHIPPED_CRD, version: str | None = None) -> "CRValidator":
        return cls(yaml.safe_load(Path(path).read_text()), version)

    def default(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A defaulted deep copy of ``obj`` (status left out of defaulting, as in the server)."""
        out = copy.deepcopy(obj)
        spec_schema = self.schema["properties"].get("spec", {})
        if isinstance(out.get("spec"), dict):
            apply_defaults(spec_schema, out["spec"])
        return out

    def validate(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
        """Every problem of ``obj`` (defaulted first); empty when the API server would accept it."""
        errors: list[str] = []
        if obj.get("apiVersion") != self.api_version or obj.get("kind") != self.kind:
            errors.append(f"apiVersion/kind: expected {self.api_version} {self.kind}, got "
                          f"{obj.get('apiVersion')} {obj.get('kind')}")
        meta = obj.get("metadata") or {}
        name = meta.get("name") or ""
        if not name and not meta.get("generateName"):
            errors.append("metadata.name: Required value: name or generateName is required")
        elif name and (not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253):
            errors.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must "
                          "consist of lower case alphanumeric characters, '-' or '.'")
        if len(name) > self.name_max:
            errors.append(f"metadata.name: Too long: may not be longer than {self.name_max}")
        body = self.default({k: v for k, v in obj.items() if k != "status"})
        blocking = len(name) > self.name_max
        for err in sorted(self._main.iter_errors(body), key=lambda e: list(map(str, e.absolute_path))):
            path = _json_path(err.absolute_path)
            errors.append(f"{path}: {_server_words(err, path)}")
            blocking = blocking or err.validator in _BLOCKING
        if blocking:
            # As the server does (apiextensions-apiserver registry/customresource/strategy.go,
            # hasBlockingErr): no CEL rule runs on an object with a wrong type, a missing field, an
            # unsupported enum value or an over-long string or list.
            errors.append(f"(root): Invalid value: null: {_NOT_CHECKED}")
            return errors
        old_body = self.default({k: v for k, v in old.items() if k != "status"}) if old else None
        errors += _cel_errors(self.schema, body, old_body, "(root)")
        return errors

    def validate_status(self, status: dict[str, Any]) -> list[str]:
        errors = []
        for err in self._status.iter_errors(status):
            path = _json_path(["status", *err.absolute_path])
            errors.append(f"{path}: Invalid value: {err.message}")
        return errors + _cel_errors(self.status_schema, status, None, "status")


def validate_files(paths: list[str], validator: CRValidator | None = None) -> dict[str, list[str]]:
    """Problems per AsyncRLJob document of each file (other kinds are skipped)."""
    v = validator or CRValidator.from_file()
    out: dict[str, list[str]] = {}
    for path in paths:
        for i, doc in enumerate(yaml.safe_load_all(Path(path).read_text())):
            if isinstance(doc, dict) and doc.get("kind") == v.kind:
                out[f"{path}#{i}:{(doc.get('metadata') or {}).get('name')}"] = v.validate(doc)
    return out


def main(argv: list[str]) -> int:
    bad = 0
    for key, errors in validate_files(argv).items():
        print(("FAIL " if errors else "OK   ") + key)
        for e in errors:
            print("   - " + e)
        bad += bool(errors)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
