"""The chart's PodMonitor and ServiceMonitor as plain Prometheus scrape configs, for a Prometheus without the operator.

prometheus-operator turns each monitor into a ``scrape_configs`` entry with Kubernetes service discovery. The test
cluster has no prometheus-operator (its CRDs are not installed), so :func:`scrape_configs` does that translation for
the host's Prometheus (the Debian package) in ``tests/cluster``. It follows prometheus-operator's documented
semantics for the fields the chart uses, so what the cluster test checks is the chart's own selection and
relabelling:

- ``selector.matchLabels``: keep targets whose pod (PodMonitor) or Service (ServiceMonitor) carries each label;
- ``port``: keep the container port (pods) or Service endpoint port of that name;
- a PodMonitor drops pods that are Succeeded or Failed;
- the target labels ``namespace``, ``pod``, ``container`` (and ``service``, ``endpoint``) and ``job`` (the
  monitor's ``<namespace>/<name>`` for a PodMonitor, the Service's name for a ServiceMonitor);
- then the endpoint's own ``relabelings``, in order; ``honorLabels`` becomes ``honor_labels``;
- ``namespaceSelector``: ``any: true`` (every namespace) or ``matchNames``; absent means the monitor's namespace.
"""

import re
from pathlib import Path
from typing import Any

_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")


def meta_label(prefix: str, label: str) -> str:
    """The service-discovery label of a Kubernetes label: ``asyncrl.io/role`` -> ``<prefix>asyncrl_io_role``."""
    return prefix + _UNSAFE.sub("_", label)


def _namespaces(monitor: dict[str, Any]) -> dict[str, Any]:
    sel = monitor["spec"].get("namespaceSelector") or {}
    if sel.get("any"):
        return {}
    return {"namespaces": {"names": list(sel.get("matchNames") or [monitor["metadata"]["namespace"]])}}


def _relabelings(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    keys = {"sourceLabels": "source_labels", "targetLabel": "target_label", "replacement": "replacement",
            "regex": "regex", "action": "action", "separator": "separator", "modulus": "modulus"}
    out = []
    for rule in rules:
        unknown = set(rule) - set(keys)
        if unknown:
            raise ValueError(f"relabeling field(s) {sorted(unknown)} are not translated here: {rule}")
        out.append({keys[k]: (v.lower() if k == "action" else v) for k, v in rule.items()})
    return out


def _selector(kind: str, match_labels: dict[str, str]) -> list[dict[str, Any]]:
    prefix = f"__meta_kubernetes_{kind}_label_"
    present = f"__meta_kubernetes_{kind}_labelpresent_"
    return [{"action": "keep", "source_labels": [meta_label(prefix, k), meta_label(present, k)],
             "regex": f"({re.escape(v)});true"} for k, v in sorted(match_labels.items())]


def _sd(role: str, monitor: dict[str, Any], api_server: str, tls: dict[str, str]) -> dict[str, Any]:
    return {"role": role, "api_server": api_server, "tls_config": tls, **_namespaces(monitor)}


def _target_labels(kind: str, port: str, job: str) -> list[dict[str, Any]]:
    """The kind's own keep/drop rules and target labels, before the endpoint's ``relabelings``."""
    if kind == "pod":
        return [
            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port},
            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"target_label": "job", "replacement": job},
            {"target_label": "endpoint", "replacement": port},
        ]
    return [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
        {"target_label": "endpoint", "replacement": port},
    ]


def _monitor(kind: str, monitor: dict[str, Any], api_server: str, tls: dict[str, str]) -> list[dict[str, Any]]:
    """``kind`` "pod" (a PodMonitor: its ``podMetricsEndpoints``) or "service" (a ServiceMonitor: ``endpoints``)."""
    spec, name = monitor["spec"], f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    endpoints, prefix, role = ((spec["podMetricsEndpoints"], "podMonitor", "pod") if kind == "pod"
                               else (spec["endpoints"], "serviceMonitor", "endpoints"))
    configs = []
    for i, ep in enumerate(endpoints):
        relabel = _selector(kind, spec["selector"].get("matchLabels") or {}) + _target_labels(kind, ep["port"], name)
        configs.append({
            "job_name": f"{prefix}/{name}/{i}", "honor_labels": bool(ep.get("honorLabels", False)),
            "metrics_path": ep.get("path", "/metrics"), "scrape_interval": ep.get("interval", "30s"),
            "scrape_timeout": ep.get("scrapeTimeout", "10s"),
            "kubernetes_sd_configs": [_sd(role, monitor, api_server, tls)],
            "relabel_configs": relabel + _relabelings(ep.get("relabelings") or []),
        })
    return configs


def scrape_configs(docs: list[dict[str, Any]], api_server: str, pki: Path) -> list[dict[str, Any]]:
    """Every PodMonitor and ServiceMonitor in ``docs`` (a rendered chart) as scrape configs that discover targets
    through ``api_server`` with the client certificate in ``pki`` (``ca.crt``, ``admin.crt``, ``admin.key``)."""
    tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "admin.crt"), "key_file": str(pki / "admin.key")}
    out: list[dict[str, Any]] = []
    for doc in docs:
        if doc and doc.get("kind") == "PodMonitor":
            out += _monitor("pod", doc, api_server, tls)
        elif doc and doc.get("kind") == "ServiceMonitor":
            out += _monitor("service", doc, api_server, tls)
    return out
