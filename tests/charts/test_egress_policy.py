"""The chart's optional egress NetworkPolicy for job pods (jobEgressPolicy): off by default; on, one policy per
namespace that keeps every job pod from link-local and metadata addresses and leaves the rest open."""

import subprocess
from typing import Any

import kubernetes_validate
import yaml

from tests.support.helpers import CHART

TEMPLATE = "templates/job-egress-policy.yaml"


def rendered(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", "rel", str(CHART), "-n", "ops", *args], capture_output=True, text=True,
                          timeout=60)


def policies(helm: str, *args: str) -> list[dict[str, Any]]:
    out = rendered(helm, *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "NetworkPolicy"]


def test_off_by_default(helm: str) -> None:
    assert policies(helm) == []


def test_one_policy_per_namespace_denies_link_local_and_metadata_only(helm: str) -> None:
    docs = policies(helm, "--set", "jobEgressPolicy.enabled=true", "--set", "watchNamespaces={rl-a,rl-b}",
                    "--set", "jobEgressPolicy.allowCIDRs={169.254.20.10/32}")
    assert [d["metadata"]["namespace"] for d in docs] == ["rl-a", "rl-b"]  # watchNamespaces by default
    spec = docs[0]["spec"]
    assert spec["podSelector"] == {"matchExpressions": [{"key": "asyncrl.io/job", "operator": "Exists"}]}
    assert spec["policyTypes"] == ["Egress"]
    in_cluster, outside = spec["egress"]
    assert in_cluster == {"to": [{"namespaceSelector": {}}]}
    assert outside["to"] == [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16", "100.100.100.200/32"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::254/128"]}},
        {"ipBlock": {"cidr": "169.254.20.10/32"}},  # NodeLocal DNSCache, allowed back
    ]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.29", strict=True)


def test_its_own_namespaces_win_and_none_at_all_is_refused(helm: str) -> None:
    docs = policies(helm, "--set", "jobEgressPolicy.enabled=true", "--set", "watchNamespaces={rl-a}",
                    "--set", "jobEgressPolicy.namespaces={rl-c}")
    assert [d["metadata"]["namespace"] for d in docs] == ["rl-c"]
    out = rendered(helm, "--set", "jobEgressPolicy.enabled=true", "-s", TEMPLATE)
    assert out.returncode != 0 and "jobEgressPolicy.enabled needs jobEgressPolicy.namespaces" in out.stderr
