"""On the real API server, under the chart's RBAC: a job with ``spec.task.agent`` gets the ``<job>-agent``
Service and (with ``allowFrom``) NetworkPolicy, its rollout pods the ``agent`` port and variables, and its
status the endpoint's address (``status.agentEndpoint``, the ``Endpoint`` column of ``kubectl get -o wide``); a
job without an agent gets none of them; an edit patches them whole (one port, the new peers, no patch loop), and
a spec that drops them deletes them.

What only a cluster with a CNI could show: that the NetworkPolicy is enforced (the server stores it as
given, nothing more), and with a controller-manager, the Service's EndpointSlices.
"""

import re
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api, NetworkingV1Api

from asyncrl.api import constants as C
from tests.support.jobs import Jobs, wait_for
from tests.support.operator_proc import OperatorProcess

PEERS: list[dict[str, Any]] = [
    {"podSelector": {"matchLabels": {"app": "harness"}}, "namespaceSelector": {"matchLabels": {"team": "rl"}}},
    {"namespaceSelector": {}},
    {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}},
]


@pytest.fixture
def jobs(kube: Any, namespace: str, operator_process: OperatorProcess) -> Jobs:
    return Jobs(kube, namespace)


def service(jobs: Jobs, name: str) -> dict[str, Any] | None:
    try:
        return dict(jobs.client.sanitize_for_serialization(CoreV1Api(jobs.client).read_namespaced_service(name, jobs.ns)))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def policy(jobs: Jobs, name: str) -> dict[str, Any] | None:
    try:
        got = NetworkingV1Api(jobs.client).read_namespaced_network_policy(name, jobs.ns)
        return dict(jobs.client.sanitize_for_serialization(got))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def reconciles(op: OperatorProcess) -> float:
    """How many reconciles the operator has run (its histogram's count)."""
    m = re.search(r"^asyncrl_operator_reconcile_duration_seconds_count (\S+)$", op.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def rollout_ports(jobs: Jobs, job: str = "job1") -> dict[str, list[int]]:
    """The rollout pods' ``agent`` container ports (live pods only), by pod."""
    return {n: [p["containerPort"] for p in p_["spec"]["containers"][0].get("ports") or [] if p["name"] == "agent"]
            for n, p_ in jobs.live_pods(job).items() if "-rollout-" in n}


def endpoint_column(apiserver: Any, ns: str, job: str) -> str | None:
    """The ``ENDPOINT`` column of ``kubectl get asyncrljob <job> -o wide`` (None: empty)."""
    out = apiserver.kubectl("get", "asyncrljob", job, "-n", ns, "-o", "wide").stdout.splitlines()
    # columns are aligned: the value sits under its header, up to the next one (AGE)
    start, end = out[0].index("ENDPOINT"), out[0].index("AGE")
    value = out[1][start:end].strip()
    return None if value in ("", "<none>") else value


def test_a_job_with_an_agent_gets_the_service_and_policy_and_one_without_gets_neither(jobs: Jobs,
                                                                                     apiserver: Any) -> None:
    job = jobs.create("job1", task={"agent": "external", "endpoint": {"port": 8200, "allowFrom": PEERS}})
    jobs.create("job2")
    uid = job["metadata"]["uid"]
    svc = wait_for(lambda: service(jobs, "job1-agent"), message="the Service job1-agent")
    pol = wait_for(lambda: policy(jobs, "job1-agent"), message="the NetworkPolicy job1-agent")
    for obj in (svc, pol):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("AsyncRLJob", "job1", uid, True)
        assert obj["metadata"]["labels"]["asyncrl.io/job"] == "job1"
    rollout = {"asyncrl.io/job": "job1", "asyncrl.io/role": "rollout"}
    assert svc["spec"]["type"] == "ClusterIP" and svc["spec"]["clusterIP"] not in (None, "None")
    assert svc["spec"]["selector"] == rollout
    assert svc["spec"]["ports"] == [{"name": "agent", "protocol": "TCP", "port": 8200, "targetPort": "agent"}]
    assert pol["spec"]["podSelector"] == {"matchLabels": rollout}
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    assert pol["spec"]["ingress"] == [{"from": PEERS, "ports": [{"protocol": "TCP", "port": 8200}]}]

    pods = jobs.wait_pods(4)  # driver, two rollout, one actor: admitted under the restricted level
    for name in ("job1-rollout-0", "job1-rollout-1"):
        c = pods[name]["spec"]["containers"][0]
        assert {"name": "agent", "containerPort": 8200, "protocol": "TCP"} in c["ports"]
        env = {e["name"]: e for e in c["env"]}
        assert env[C.AGENT_BIND_ENV]["value"] == "0.0.0.0:8200"
        assert env[C.AGENT_ADVERTISE_ENV]["value"] == "http://$(ASYNCRL_POD_IP):8200"
        assert env["ASYNCRL_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    created = [m for t, r, m in jobs.events("job1") if r == "CreatedService" and "job1-agent" in m]
    url = f"http://job1-agent.{jobs.ns}.svc:8200/v1"
    assert created == [f"created Service job1-agent: the agent endpoint: {url}"]
    # the status says where to point the harness once the operator saw the Service, and kubectl shows it
    wait_for(lambda: jobs.status("job1").get("agentEndpoint") == url, message=f"status.agentEndpoint {url}")
    assert endpoint_column(apiserver, jobs.ns, "job1") == url
    assert "ENDPOINT" not in apiserver.kubectl("get", "asyncrljob", "job1", "-n", jobs.ns).stdout  # -o wide only

    # job2 has no agent: its pods come in the same reconcile as its children, and none is an agent one
    jobs.wait_pods(4, "job2")
    assert service(jobs, "job2") is not None and policy(jobs, "job2") is not None
    assert service(jobs, "job2-agent") is None and policy(jobs, "job2-agent") is None
    assert not [p for p in rollout_ports(jobs, "job2").values() if p]
    wait_for(lambda: jobs.status("job2").get("observedGeneration"), message="job2's status")
    assert "agentEndpoint" not in jobs.status("job2") and endpoint_column(apiserver, jobs.ns, "job2") is None


def test_the_agent_children_follow_edits_and_go_when_the_spec_drops_them(jobs: Jobs,
                                                                         operator_process: OperatorProcess) -> None:
    jobs.create("job1", task={"agent": "external", "endpoint": {"allowFrom": PEERS}})
    jobs.create("job2")
    svc = wait_for(lambda: service(jobs, "job1-agent"), message="the Service job1-agent")
    pol = wait_for(lambda: policy(jobs, "job1-agent"), message="the NetworkPolicy job1-agent")
    # as the server holds them they are what the operator wants: resyncs patch nothing
    seen = reconciles(operator_process)
    wait_for(lambda: reconciles(operator_process) >= seen + 6, timeout=30, message="six more reconciles")
    assert service(jobs, "job1-agent")["metadata"]["resourceVersion"] == svc["metadata"]["resourceVersion"]
    assert policy(jobs, "job1-agent")["metadata"]["resourceVersion"] == pol["metadata"]["resourceVersion"]
    assert not {"UpdatedService", "UpdatedNetworkPolicy"} & set(jobs.reasons())

    # a new port and fewer peers: the Service has the new port only, the policy exactly the new peers
    jobs.patch({"spec": {"task": {"endpoint": {"port": 8300, "allowFrom": PEERS[:1]}}}})
    wait_for(lambda: (service(jobs, "job1-agent") or {}).get("spec", {}).get("ports") == [
        {"name": "agent", "protocol": "TCP", "port": 8300, "targetPort": "agent"}], message="the Service's new port")
    wait_for(lambda: (policy(jobs, "job1-agent") or {}).get("spec", {}).get("ingress") == [
        {"from": PEERS[:1], "ports": [{"protocol": "TCP", "port": 8300}]}], message="the policy's new rule")
    # the edit restarts the gang (SpecChanged): the new rollout pods listen on the new port
    wait_for(lambda: rollout_ports(jobs) == {"job1-rollout-0": [8300], "job1-rollout-1": [8300]}, timeout=30,
             message=f"rollout pods on port 8300 (have {rollout_ports(jobs)})")
    url = f"http://job1-agent.{jobs.ns}.svc:8300/v1"
    wait_for(lambda: jobs.status().get("agentEndpoint") == url, message=f"status.agentEndpoint {url}")

    jobs.patch({"spec": {"task": {"endpoint": {"allowFrom": []}}}})  # the peers lose access
    wait_for(lambda: policy(jobs, "job1-agent") is None, message="the NetworkPolicy job1-agent deleted")
    assert service(jobs, "job1-agent") is not None and policy(jobs, "job1") is not None

    jobs.patch({"spec": {"task": {"agent": None}}})  # no agent: no endpoint
    wait_for(lambda: service(jobs, "job1-agent") is None, message="the Service job1-agent deleted")
    wait_for(lambda: "agentEndpoint" not in jobs.status(), message="status.agentEndpoint removed")
    assert service(jobs, "job1") is not None  # the headless Service stays
    wait_for(lambda: rollout_ports(jobs) == {"job1-rollout-0": [], "job1-rollout-1": []}, timeout=30,
             message=f"rollout pods without the agent port (have {rollout_ports(jobs)})")
    reasons = jobs.wait_reasons("UpdatedService", "UpdatedNetworkPolicy", "DeletedNetworkPolicy", "DeletedService")
    assert not [r for r in reasons if r.startswith("FailedTo")], reasons  # RBAC let every call through
    assert service(jobs, "job2-agent") is None and policy(jobs, "job2-agent") is None  # never made for job2
