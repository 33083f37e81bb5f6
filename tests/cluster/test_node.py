"""The node itself: a pod from the Debian base image runs on the real kubelet, and its log is read back."""

import pytest

from tests.support.cluster import Cluster
from tests.support.cluster_images import DEBIAN

pytestmark = pytest.mark.cluster


def test_a_pod_runs_and_kubectl_logs_reads_it(cluster: Cluster) -> None:
    ns = cluster.namespace("node-hello")
    cluster.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": DEBIAN, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo hello from $(hostname); cat /proc/self/status | grep ^Uid"],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })
    cluster.wait("pod", "hello", "jsonpath={.status.phase}=Succeeded", ns)
    out = cluster.logs("hello", ns)
    assert "hello from hello" in out
    assert "Uid:\t10001" in out


def test_cluster_dns_resolves_the_api_service_and_nothing_outside(cluster: Cluster) -> None:
    """CoreDNS answers for the cluster's names; it has no upstream, so an outside name does not resolve."""
    ns = cluster.namespace("node-dns")
    cluster.apply({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dns", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "main", "image": DEBIAN, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo api=$(getent hosts kubernetes.default | cut -d' ' -f1); "
                            "getent hosts example.org || echo outside=unresolved"],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    })
    cluster.wait("pod", "dns", "jsonpath={.status.phase}=Succeeded", ns)
    out = cluster.logs("dns", ns)
    assert "api=10.96.0.1" in out
    assert "outside=unresolved" in out
