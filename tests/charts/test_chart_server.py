"""The chart's rendered objects and every example job, checked by the real API server (``--dry-run=server``).

Server-side dry run runs the whole admission chain (schema, defaulting, CEL, admission plugins)
without storing anything: what passes here is what ``helm install`` and ``kubectl apply`` will
get past on a real cluster of the same version.
"""

from pathlib import Path

import pytest

from tests.support.apiserver import ApiServer
from tests.support.helpers import ROOT
from tests.support.operator_proc import OPERATOR_NAMESPACE, render_chart

VALUE_SETS = {
    "default": [],
    "everything-on": ["--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true",
                      "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboards.enabled=true",
                      "--set", "metrics.serviceMonitor.additionalLabels.release=kps"],
    "namespaced": ["--set", "watchNamespaces={rl-jobs,rl-dev}", "--set", "metrics.enabled=false"],
}
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("values", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_every_chart_object_applies_to_the_real_server(apiserver: ApiServer, values: list[str]) -> None:
    docs = render_chart(*values)
    for ns in sorted({OPERATOR_NAMESPACE, *(d["metadata"].get("namespace") for d in docs)} - {None}):
        apiserver.namespace(ns, pod_security=None)
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    assert [c["metadata"]["name"] for c in crds] == ["asyncrljobs.asyncrl.io"]
    rest = [d for d in docs if d["kind"] != "CustomResourceDefinition"]
    kinds = {d["kind"] for d in rest}
    assert {"Deployment", "ServiceAccount", "ClusterRole"} <= kinds
    out = apiserver.apply(rest, "--dry-run=server", check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    applied = [line for line in out.stdout.splitlines() if "(server dry run)" in line]
    assert len(applied) == len(rest), out.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_applies_to_the_real_server(apiserver: ApiServer, path: Path) -> None:
    apiserver.namespace("rl-jobs", pod_security=None)  # production.yaml names it
    out = apiserver.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "created (server dry run)" in out.stdout or "configured (server dry run)" in out.stdout
