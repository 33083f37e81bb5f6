"""The AsyncRLJob CustomResourceDefinition, generated from the pydantic models.

``asyncrl crd`` prints it; ``crds/`` holds the checked-in copy (a test keeps them equal). The
generator turns pydantic's JSON Schema into a Kubernetes *structural* OpenAPI v3 schema:
``$ref`` inlined, ``Optional`` as ``nullable``, JSON-Schema numeric exclusivity as OpenAPI 3.0
booleans, free-form maps as ``type: object`` with ``x-kubernetes-preserve-unknown-fields``, and
the models' rules as CEL ``x-kubernetes-validations`` (:mod:`asyncrl.api.cel`: the same rules and
messages the models enforce), each on a typed node.
"""

from typing import Any

import yaml
from pydantic import BaseModel

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule
from asyncrl.api.constants import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.metadata import NAME_RULE
from asyncrl.api.status import JobStatus

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
    {"name": "Version", "type": "integer", "jsonPath": ".status.training.policyVersion",
     "description": "Current policy version (optimizer steps)."},
    {"name": "Keep%", "type": "number", "jsonPath": ".status.training.keepPercent",
     "description": "Share of tokens kept by the train–inference mask, in percent."},
    {"name": "Staleness", "type": "integer", "jsonPath": ".status.training.stalenessMax",
     "description": "Observed largest version gap of a token trained on recently (at most spec.async.maxStaleness)."},
    {"name": "Rollout", "type": "string", "jsonPath": ".status.replicas.rollout",
     "description": "Rollout pods ready/desired."},
    {"name": "Actor", "type": "string", "jsonPath": ".status.replicas.actor",
     "description": "Actor pods ready/desired."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts",
     "description": "Restarts from checkpoint so far."},
    {"name": "Reason", "type": "string", "jsonPath": ".status.reason", "priority": 1,
     "description": "Reason of the last phase change."},
    {"name": "Sync", "type": "string", "jsonPath": ".status.syncPhase.phase", "priority": 1,
     "description": "Interrupt-sync phase reported by the driver."},
    {"name": "Export", "type": "string", "jsonPath": ".status.training.lastExport", "priority": 1,
     "description": "Newest Hugging Face export of the policy (checkpoint.exportEverySteps)."},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.agentEndpoint", "priority": 1,
     "description": "In-cluster base URL of the agent endpoint (spec.task.agent), through the Service <job>-agent."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

_DROP = {"title", "$defs", "discriminator"}


def _models_by_name(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``root``, keyed by the name pydantic uses in ``$defs``."""
    found: dict[str, type[BaseModel]] = {}
    stack = [root]
    while stack:
        model = stack.pop()
        if model.__name__ in found:
            continue
        found[model.__name__] = model
        for field in model.model_fields.values():
            for sub in _sub_models(field.annotation):
                stack.append(sub)
    return found


def _sub_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in getattr(annotation, "__args__", ()) or ():
        out.extend(_sub_models(arg))
    return out


class _Converter:
    def __init__(self, root: type[BaseModel]) -> None:
        self.schema = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = self.schema.get("$defs", {})
        self.models = _models_by_name(root)

    def convert(self, node: dict[str, Any], model: type[BaseModel] | None = None) -> dict[str, Any]:
        """The structural schema of ``node``; CEL rules of a field (:func:`asyncrl.api.cel.on_field`)
        land on the field's own node, those of a model (``cel_rules``) on the model's object node."""
        node = dict(node)
        field_rules = node.pop("x-kubernetes-validations", [])
        out = self._convert(node, model)
        rules = [*out.get("x-kubernetes-validations", []), *field_rules]
        if rules:
            out["x-kubernetes-validations"] = rules
        return out

    def _convert(self, node: dict[str, Any], model: type[BaseModel] | None) -> dict[str, Any]:
        out: dict[str, Any]
        description = node.pop("description", None)
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            target = self.convert(self.defs[name], self.models.get(name))
            node = {**target, **{k: v for k, v in node.items() if k in ("default",)}}
            if description:
                node["description"] = description
            return node
        if "allOf" in node and len(node["allOf"]) == 1:
            inner = self.convert(node.pop("allOf")[0])
            out = {**inner, **self._scalars(node)}
            if description:
                out["description"] = description
            return out
        if "anyOf" in node:
            branches = node.pop("anyOf")
            non_null = [b for b in branches if b.get("type") != "null"]
            if len(non_null) != 1:
                # A union the API server cannot type: model it as an object with one field per form.
                raise ValueError(f"no structural schema for the union {branches}")
            out = self.convert(non_null[0])
            out["nullable"] = True
            if "default" in node and node["default"] is not None:
                out["default"] = node["default"]
            if description:
                out["description"] = description
            return out
        out = {}
        if description:
            out["description"] = description
        kind = node.get("type")
        if "const" in node:
            out["type"] = "string" if isinstance(node["const"], str) else kind
            out["enum"] = [node["const"]]
        elif kind == "object":
            out["type"] = "object"
            props = node.get("properties")
            extra = node.get("additionalProperties")
            if props is not None:
                out["properties"] = {k: self.convert(v) for k, v in props.items()}
                if node.get("required"):
                    out["required"] = list(node["required"])
            elif isinstance(extra, dict) and extra:
                out["additionalProperties"] = self.convert(extra)
            else:
                # A free-form map (engineArgs, affinity, ...): no CEL rule may sit on it or name it.
                out["x-kubernetes-preserve-unknown-fields"] = True
            if "default" in node:
                out["default"] = node["default"]
            if model is not None:
                out.update(self._cel(model))
        else:
            out.update(self._scalars(node))
            if kind == "array" and isinstance(node.get("items"), dict):
                out["items"] = self.convert(node["items"])
        return out

    @staticmethod
    def _scalars(node: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _DROP or key in ("anyOf", "allOf", "properties", "required"):
                continue
            if key == "exclusiveMinimum":
                out["minimum"], out["exclusiveMinimum"] = value, True
            elif key == "exclusiveMaximum":
                out["maximum"], out["exclusiveMaximum"] = value, True
            elif key == "items":
                out["items"] = _Converter._scalars(value)
            else:
                out[key] = value
        return out

    @staticmethod
    def _cel(model: type[BaseModel]) -> dict[str, Any]:
        rules: tuple[CelRule, ...] = getattr(model, "cel_rules", ())
        if not rules:
            return {}
        return {"x-kubernetes-validations": [r.to_schema() for r in rules]}


def spec_schema() -> dict[str, Any]:
    """The structural OpenAPI v3 schema of ``spec``."""
    conv = _Converter(AsyncRLJobSpec)
    return conv.convert(conv.schema, AsyncRLJobSpec)


def status_schema() -> dict[str, Any]:
    """The structural schema of ``status``, generated from :class:`asyncrl.api.status.JobStatus`.

    Typed (a real API server prunes unknown status fields); ``conditions`` is a list-map keyed
    by ``type`` as in ``metav1.Condition``.
    """
    conv = _Converter(JobStatus)
    schema = conv.convert(conv.schema, JobStatus)
    schema["description"] = "Observed state: written by the operator, except training (written by the driver)."
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    spec = spec_schema()
    spec["description"] = "Specification of the asynchronous RL job."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "asyncrl", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": ["all", "asyncrl"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": "AsyncRLJob runs asynchronous RL training of an LLM agent with "
                            "decoupled train–inference and staleness correction.",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                # Root metadata may only restrict name and generateName; the DNS-label
                                # limit bounds the name rule's CEL cost, the rule gives our message.
                                "metadata": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string", "maxLength": 63},
                                        "generateName": {"type": "string", "maxLength": 63},
                                    },
                                },
                                "spec": spec,
                                "status": status_schema(),
                            },
                            "x-kubernetes-validations": [NAME_RULE.to_schema()],
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as YAML, exactly as checked in under ``crds/``."""
    header = "# Generated by `asyncrl crd` from asyncrl.api; do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, allow_unicode=True, width=100)


def all_spec_models() -> list[type[SpecModel]]:
    """Every spec section model (used by tests: each field needs a description)."""
    return [m for m in _models_by_name(AsyncRLJobSpec).values() if issubclass(m, SpecModel)]
