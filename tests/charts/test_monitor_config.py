"""The translation of the chart's PodMonitor and ServiceMonitor into Prometheus scrape configs that the cluster test
runs (tests/support/monitor_config.py): fast, without a cluster. What the translation keeps and labels must be what
the chart declares, so the real scrape in tests/cluster checks the chart and not this helper's own choices."""

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.cluster import helm_bin
from tests.support.helpers import ROOT
from tests.support.monitor_config import meta_label, scrape_configs


def rendered(*sets: str) -> list[dict[str, Any]]:
    args = [str(helm_bin()), "template", "rel", str(ROOT / "charts" / "asyncrl"), "-n", "ops",
            "--set", "metrics.podMonitor.enabled=true", "--set", "metrics.serviceMonitor.enabled=true"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def relabel(config: dict[str, Any], labels: dict[str, str]) -> dict[str, str] | None:
    """Prometheus's relabelling of one discovered target (the actions the translation emits), or None if dropped."""
    labels = dict(labels)
    for r in config["relabel_configs"]:
        value = ";".join(labels.get(s, "") for s in r.get("source_labels", []))
        regex = re.compile(f"^(?:{r.get('regex', '(.*)')})$")
        action = r.get("action", "replace")
        if action == "keep" and not regex.match(value):
            return None
        if action == "drop" and regex.match(value):
            return None
        if action == "replace":
            m = regex.match(value)
            if m:
                labels[r["target_label"]] = m.expand(r.get("replacement", "$1").replace("$1", r"\1"))
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def pod_target(**over: str) -> dict[str, str]:
    base = {"__meta_kubernetes_namespace": "team-a", "__meta_kubernetes_pod_name": "job1-driver-0",
            "__meta_kubernetes_pod_container_name": "driver", "__meta_kubernetes_pod_container_port_name": "metrics",
            "__meta_kubernetes_pod_phase": "Running"}
    for k, v in {"app.kubernetes.io/managed-by": "asyncrl-operator", "asyncrl.io/role": "driver",
                 "asyncrl.io/job": "job1"}.items():
        base[meta_label("__meta_kubernetes_pod_label_", k)] = v
        base[meta_label("__meta_kubernetes_pod_labelpresent_", k)] = "true"
    base.update(over)
    return base


def test_meta_label_names_follow_prometheus_sanitising() -> None:
    assert meta_label("__meta_kubernetes_pod_label_", "asyncrl.io/role") == "__meta_kubernetes_pod_label_asyncrl_io_role"
    assert meta_label("x_", "app.kubernetes.io/managed-by") == "x_app_kubernetes_io_managed_by"


def test_the_pod_monitor_keeps_the_driver_and_labels_it_with_job_and_role() -> None:
    (pod, svc) = scrape_configs(rendered(), "https://10.0.0.1:6443", Path("/pki"))
    assert pod["kubernetes_sd_configs"][0]["role"] == "pod" and "namespaces" not in pod["kubernetes_sd_configs"][0]
    assert relabel(pod, pod_target()) == {"namespace": "team-a", "container": "driver", "pod": "job1-driver-0",
                                          "job": "ops/rel-asyncrl-operator-jobs", "endpoint": "metrics",
                                          "asyncrljob": "job1", "role": "driver"}
    rollout = pod_target(**{meta_label("__meta_kubernetes_pod_label_", "asyncrl.io/role"): "rollout"})
    assert relabel(pod, rollout) is None  # the chart selects the driver only
    assert relabel(pod, pod_target(__meta_kubernetes_pod_container_port_name="agent")) is None
    assert relabel(pod, pod_target(__meta_kubernetes_pod_phase="Succeeded")) is None
    foreign = pod_target(**{meta_label("__meta_kubernetes_pod_label_", "app.kubernetes.io/managed-by"): "helm"})
    assert relabel(pod, foreign) is None
    assert not pod["honor_labels"] and svc["honor_labels"]  # the operator's per-job series keep their namespace


def test_namespace_selector_and_intervals_come_from_values() -> None:
    (pod, svc) = scrape_configs(rendered("metrics.podMonitor.namespaceSelector.any=false",
                                         "metrics.podMonitor.namespaceSelector.matchNames={rl-jobs}",
                                         "metrics.podMonitor.interval=7s"), "https://10.0.0.1:6443", Path("/pki"))
    assert pod["kubernetes_sd_configs"][0]["namespaces"] == {"names": ["rl-jobs"]}
    assert pod["scrape_interval"] == "7s"
    assert svc["kubernetes_sd_configs"][0] == {
        "role": "endpoints", "api_server": "https://10.0.0.1:6443", "namespaces": {"names": ["ops"]},
        "tls_config": {"ca_file": "/pki/ca.crt", "cert_file": "/pki/admin.crt", "key_file": "/pki/admin.key"}}


def test_a_relabeling_field_it_does_not_translate_is_refused() -> None:
    docs = rendered()
    (pm,) = [d for d in docs if d["kind"] == "PodMonitor"]
    pm["spec"]["podMetricsEndpoints"][0]["relabelings"].append({"sourceLabels": ["a"], "regexp": "typo"})
    with pytest.raises(ValueError, match="regexp"):
        scrape_configs([pm], "https://10.0.0.1:6443", Path("/pki"))
