"""The Helm chart with the real helm binary: lint, render, validate every object offline."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support.helpers import CHART, ROOT

K8S_VERSIONS = ("1.29", "1.33")  # oldest and newest we claim; kubernetes-validate ships their schemas
NOT_BUILTIN = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}  # prometheus-operator CRDs


def render(helm: str, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    out = subprocess.run([helm, "template", "rel", str(chart), "-n", "ops", "--include-crds", *args],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_chart_crd_is_byte_identical_to_the_generated_one() -> None:
    assert (CHART / "crds" / "asyncrl.io_asyncrljobs.yaml").read_bytes() == \
        (ROOT / "crds" / "asyncrl.io_asyncrljobs.yaml").read_bytes(), \
        "run: asyncrl crd > crds/asyncrl.io_asyncrljobs.yaml && cp crds/asyncrl.io_asyncrljobs.yaml charts/asyncrl/crds/"


def test_helm_lint_strict(helm: str) -> None:
    out = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("values", [
    [],
    ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
     "--set", "metrics.serviceMonitor.additionalLabels.release=kps"],
    ["--set", "watchNamespaces={rl-jobs,rl-dev}", "--set", "metrics.enabled=false"],
], ids=["default", "monitors", "namespaced"])
def test_rendered_objects_validate_strictly(helm: str, values: list[str]) -> None:
    docs = render(helm, *values)
    for version in K8S_VERSIONS:
        for doc in docs:
            if doc["kind"] in NOT_BUILTIN:
                continue
            kubernetes_validate.validate(doc, version, strict=True)  # raises with the field path
    kinds = {d["kind"] for d in docs}
    assert {"CustomResourceDefinition", "Deployment", "ServiceAccount"} <= kinds


def test_helm_template_piped_into_kubernetes_validate_cli(helm: str) -> None:
    rendered = subprocess.run([helm, "template", "rel", str(CHART), "-n", "ops", "--include-crds"],
                              capture_output=True, text=True, timeout=60, check=True).stdout
    cli = Path(sys.executable).with_name("kubernetes-validate")
    out = subprocess.run([str(cli), "--strict", "-k", K8S_VERSIONS[-1], "-"], input=rendered,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "passed for resource deployment/rel-asyncrl-operator" in out.stdout + out.stderr


def test_monitors_carry_the_release_label(helm: str) -> None:
    docs = render(helm, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
                  "--set", "metrics.serviceMonitor.additionalLabels.release=kps",
                  "--set", "metrics.podMonitor.additionalLabels.release=kps")
    (sm,) = by_kind(docs, "ServiceMonitor")
    (pm,) = by_kind(docs, "PodMonitor")
    assert sm["metadata"]["labels"]["release"] == pm["metadata"]["labels"]["release"] == "kps"
    assert pm["spec"]["selector"]["matchLabels"]["asyncrl.io/role"] == "driver"
    assert not by_kind(render(helm), "ServiceMonitor")  # off by default


def test_deployment_is_hardened(helm: str) -> None:
    (dep,) = by_kind(render(helm), "Deployment")
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["ASYNCRL_OPERATOR_JOB_IMAGE"] == "asyncrl/job:0.1.0"


def operator_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in by_kind(docs, "ClusterRole") if not d["metadata"]["name"].endswith(("-edit", "-view"))
            for r in d["rules"]]


def verbs_on(rules: list[dict[str, Any]], group: str, resource: str) -> set[str]:
    return {v for r in rules if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


def test_rbac_is_least_privilege(helm: str) -> None:
    docs = render(helm)
    for r in [r for d in by_kind(docs, "ClusterRole") for r in d["rules"]]:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"], r
    rules = operator_rules(docs)
    assert verbs_on(rules, "asyncrl.io", "asyncrljobs/status") == {"get", "patch"}
    # blockOwnerDeletion on the children's ownerReferences needs update on the job's finalizers
    assert verbs_on(rules, "asyncrl.io", "asyncrljobs/finalizers") == {"update"}
    # the job's Ray token: created once, read back as metadata only -- never listed, watched or changed
    assert verbs_on(rules, "", "secrets") == {"get", "create"}
    # the agent endpoint's <job>-agent Service and NetworkPolicy follow the spec (patched, deleted when dropped)
    assert verbs_on(rules, "networking.k8s.io", "networkpolicies") == {"get", "create", "patch", "delete"}
    assert verbs_on(rules, "", "services") == {"get", "create", "patch", "delete"}
    assert verbs_on(rules, "", "serviceaccounts") == {"get", "create"}
    for group in ("scheduling.volcano.sh", "scheduling.x-k8s.io"):  # PodGroups follow the gang's size
        assert verbs_on(rules, group, "podgroups") == {"get", "create", "patch"}
    assert "update" not in verbs_on(rules, "", "pods") and "escalate" not in verbs_on(rules, "rbac.authorization.k8s.io",
                                                                                    "roles")
    ns_docs = render(helm, "--set", "watchNamespaces={rl-jobs}")
    assert {(d["kind"], d["metadata"].get("namespace")) for d in by_kind(ns_docs, "Role")} == {("Role", "rl-jobs")}
    (ns_role,) = by_kind(ns_docs, "Role")
    assert verbs_on(ns_role["rules"], "", "secrets") == {"get", "create"}


def test_users_get_asyncrljobs_through_the_default_roles(helm: str) -> None:
    roles = {d["metadata"]["name"]: d for d in by_kind(render(helm), "ClusterRole")}
    edit, view = roles["rel-asyncrl-operator-edit"], roles["rel-asyncrl-operator-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert verbs_on(edit["rules"], "asyncrl.io", "asyncrljobs") == {
        "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
    assert "patch" not in verbs_on(edit["rules"], "asyncrl.io", "asyncrljobs/status")  # status is the operator's
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert verbs_on(view["rules"], "asyncrl.io", "asyncrljobs") == {"get", "list", "watch"}
    off = render(helm, "--set", "rbac.aggregateToDefaultRoles=false")
    assert not [d for d in by_kind(off, "ClusterRole") if d["metadata"]["name"].endswith(("-edit", "-view"))]


def test_prometheus_selectors_reach_the_operator_as_json(helm: str) -> None:
    def env(*values: str) -> dict[str, str]:
        (dep,) = by_kind(render(helm, *values), "Deployment")
        return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    default = env()  # the release namespace only (render() installs into ops), never "any"
    assert json.loads(default["ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR"]) == {
        "kubernetes.io/metadata.name": "ops"}
    assert json.loads(default["ASYNCRL_OPERATOR_PROMETHEUS_POD_SELECTOR"]) == {"app.kubernetes.io/name": "prometheus"}
    custom = env("--set-json", 'jobNetworkPolicy.prometheusNamespaceSelector={"kubernetes.io/metadata.name":"mon"}')
    assert json.loads(custom["ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR"]) == {"kubernetes.io/metadata.name": "mon"}
    anywhere = env("--set", "jobNetworkPolicy.prometheusFromAnyNamespace=true")  # only as an explicit choice
    assert json.loads(anywhere["ASYNCRL_OPERATOR_PROMETHEUS_NAMESPACE_SELECTOR"]) == {}


def test_privileged_namespaces_are_the_admins_opt_in(helm: str) -> None:
    def env(*values: str) -> dict[str, str]:
        (dep,) = by_kind(render(helm, *values), "Deployment")
        return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert json.loads(env()["ASYNCRL_OPERATOR_PRIVILEGED_NAMESPACES"]) == []  # nobody by default
    opted = env("--set-json", 'podSecurity.privilegedNamespaces=["ml-debug","gpu-lab"]')
    assert json.loads(opted["ASYNCRL_OPERATOR_PRIVILEGED_NAMESPACES"]) == ["ml-debug", "gpu-lab"]
    # the operator reads exactly what the chart renders
    from asyncrl.operator.config import OperatorSettings

    cfg = OperatorSettings.from_env({k: v for k, v in opted.items() if k.startswith("ASYNCRL_OPERATOR_") and v})
    assert cfg.privileged_namespaces == ("ml-debug", "gpu-lab")
    assert cfg.prometheus_namespace_selector == {"kubernetes.io/metadata.name": "ops"}


def test_values_schema_refuses_bad_values(helm: str) -> None:
    for bad in (["--set", "metrics.port=0"], ["--set", "unknownKey=1"],
                ["--set", "securityContext.allowPrivilegeEscalation=true"],
                ["--set", "jobNetworkPolicy.prometheusPodSelector.app=1"],  # label values are strings
                ["--set", "podSecurity.privilegedNamespaces=Not_A_Namespace"],
                ["--set", "podSecurity.allowEverything=true"]):
        out = subprocess.run([helm, "template", "rel", str(CHART), *bad], capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "schema" in out.stderr.lower(), (bad, out.stderr)


def test_alert_and_dashboard_plug_in_points(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "asyncrl"
    shutil.copytree(CHART, chart)
    (chart / "files" / "alerts" / "jobs.yaml").write_text(yaml.safe_dump({"groups": [{
        "name": "asyncrl-jobs", "rules": [{"alert": "AsyncRLJobFailed", "expr": 'asyncrl_operator_jobs{phase="Failed"} > 0',
                                           "for": "5m", "labels": {"severity": "warning"},
                                           "annotations": {"summary": "an AsyncRLJob failed"}}]}]}))
    (chart / "files" / "dashboards" / "overview.json").write_text(json.dumps({"title": "asyncrl", "uid": "asyncrl"}))
    docs = render(helm, "--set", "prometheusRule.enabled=true", "--set", "prometheusRule.additionalLabels.release=kps",
                  "--set", "grafanaDashboards.enabled=true", chart=chart)
    (rule,) = by_kind(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    (jobs_group,) = [g for g in rule["spec"]["groups"] if g["name"] == "asyncrl-jobs"]  # beside the chart's own
    assert jobs_group["rules"][0]["alert"] == "AsyncRLJobFailed"
    dashboards = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    (cm,) = [d for d in dashboards if "overview.json" in d["data"]]  # beside the chart's own asyncrl.json
    assert json.loads(cm["data"]["overview.json"])["uid"] == "asyncrl"
    kubernetes_validate.validate(cm, K8S_VERSIONS[-1], strict=True)
    promtool = shutil.which("promtool")  # make tools installs it
    assert promtool, "promtool not found; run `make tools`"
    # the rendered rules are still valid Prometheus rules
    rules = tmp_path / "rendered-rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
