"""The HTTP requests ``Kube`` makes for the job's new child kinds, with the real ``kubernetes`` client.

A loopback HTTP endpoint records each request and answers as the API server would (an object, a
404 Status, a 403 Status). It checks the paths and headers, not server behaviour: a Secret is
read as metadata only (the operator never receives a token), a PodGroup goes to the custom-objects
API of its manifest's apiVersion, a NetworkPolicy to networking.k8s.io/v1.
"""

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes
import pytest
from kubernetes.client import ApiException

from asyncrl.operator.kube import Kube, server_message


class Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, str, Any]] = []
    answers: dict[tuple[str, str], tuple[int, dict[str, Any]]] = {}

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.seen.append((self.command, self.path, self.headers.get("Accept", ""), body))
        code, doc = self.answers.get((self.command, self.path.split("?")[0]), (200, body or {"metadata": {}}))
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PATCH = do_DELETE = _reply

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def kube() -> Iterator[Kube]:
    Recorder.seen, Recorder.answers = [], {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    conf = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield Kube(kubernetes.client.ApiClient(conf))
    finally:
        server.shutdown()
        server.server_close()


def test_secret_is_read_as_metadata_only(kube: Kube) -> None:
    path = "/api/v1/namespaces/ns/secrets/j-ray-token"
    Recorder.answers[("GET", path)] = (200, {"kind": "PartialObjectMetadata", "metadata": {
        "name": "j-ray-token", "ownerReferences": [{"uid": "uid-1"}]}})
    got = kube.get("Secret", "ns", "j-ray-token")
    assert got is not None and got["metadata"]["ownerReferences"] == [{"uid": "uid-1"}]
    ((verb, seen_path, accept, _),) = Recorder.seen
    assert (verb, seen_path) == ("GET", path)
    assert accept == "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    kube.get("ConfigMap", "ns", "j-spec")  # other kinds: the whole object (the planner compares data)
    assert "PartialObjectMetadata" not in Recorder.seen[-1][2]


def test_pod_group_goes_to_the_custom_objects_api_of_its_api_version(kube: Kube) -> None:
    volcano = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
               "metadata": {"name": "j", "namespace": "ns"}, "spec": {"minMember": 4}}
    kube.create("PodGroup", "ns", volcano)
    kube.get("PodGroup", "ns", "j", "scheduling.x-k8s.io/v1alpha1")
    kube.patch("PodGroup", "ns", "j", {"spec": {"minMember": 5}}, "scheduling.volcano.sh/v1beta1")
    assert [(v, p) for v, p, _, _ in Recorder.seen] == [
        ("POST", "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups"),
        ("GET", "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/j"),
        ("PATCH", "/apis/scheduling.volcano.sh/v1beta1/namespaces/ns/podgroups/j"),
    ]
    assert Recorder.seen[0][3] == volcano


def test_network_policy_and_missing_objects(kube: Kube) -> None:
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "j", "namespace": "ns"},
              "spec": {"podSelector": {"matchLabels": {"asyncrl.io/job": "j"}}, "policyTypes": ["Ingress"]}}
    kube.create("NetworkPolicy", "ns", policy)
    assert Recorder.seen[-1][:2] == ("POST", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies")
    Recorder.answers[("GET", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/j")] = (
        404, {"kind": "Status", "code": 404, "message": 'networkpolicies.networking.k8s.io "j" not found'})
    assert kube.get("NetworkPolicy", "ns", "j") is None


def test_a_refusal_carries_the_servers_message(kube: Kube) -> None:
    quota = 'pods "j-actor-0" is forbidden: exceeded quota: pods, requested: pods=1, used: pods=2, limited: pods=2'
    Recorder.answers[("POST", "/api/v1/namespaces/ns/pods")] = (403, {"kind": "Status", "code": 403,
                                                                     "reason": "Forbidden", "message": quota})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "j-actor-0"},
           "spec": {"containers": [{"name": "actor", "image": "x"}]}}
    with pytest.raises(ApiException) as err:
        kube.create("Pod", "ns", pod)
    assert err.value.status == 403 and server_message(err.value) == quota


def test_unknown_kinds_name_the_supported_ones(kube: Kube) -> None:
    with pytest.raises(ValueError, match="supported: Pod, ConfigMap"):
        kube.get("Deployment", "ns", "x")
    with pytest.raises(ValueError, match="group/version apiVersion"):
        kube.create("PodGroup", "ns", {"apiVersion": "v1", "metadata": {"name": "j"}})
