"""On the real API server, under the chart's RBAC (issue 35, part C): an external agent without ``sessionKeyFrom``
gets the Secret ``<job>-agent-key``, owned by the job and never rotated, and its rollout pods read it; one with its
own Secret gets none; an in-process agent gets no Service, no key and no endpoint address.

Before: such a job took sessions with no key at all, and an in-process agent's job got the ``<job>-agent`` Service.
What only a cluster with a controller-manager could show: that the Secret is garbage-collected with the job (the
owner reference it needs is checked here).
"""

import base64
import re
from typing import Any

import pytest
from kubernetes.client import ApiException, CoreV1Api

from asyncrl.api import constants as C
from tests.support.jobs import Jobs, wait_for
from tests.support.operator_proc import OperatorProcess


@pytest.fixture
def jobs(kube: Any, namespace: str, operator_process: OperatorProcess) -> Jobs:
    return Jobs(kube, namespace)


def read(jobs: Jobs, kind: str, name: str) -> dict[str, Any] | None:
    api = CoreV1Api(jobs.client)
    reader = {"Secret": api.read_namespaced_secret, "Service": api.read_namespaced_service}[kind]
    try:
        return dict(jobs.client.sanitize_for_serialization(reader(name, jobs.ns)))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def rollout_env(jobs: Jobs, job: str) -> dict[str, dict[str, Any]]:
    pods = jobs.live_pods(job)
    return {e["name"]: e for e in pods[f"{job}-rollout-0"]["spec"]["containers"][0]["env"]}


def reconciles(op: OperatorProcess) -> float:
    m = re.search(r"^asyncrl_operator_reconcile_duration_seconds_count (\S+)$", op.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def test_an_external_agent_gets_an_owned_key_that_its_pods_read_and_that_is_never_rotated(
        jobs: Jobs, operator_process: OperatorProcess) -> None:
    job = jobs.create("job1", task={"agent": "external"})
    secret = wait_for(lambda: read(jobs, "Secret", "job1-agent-key"), message="the Secret job1-agent-key")
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "AsyncRLJob", "job1", job["metadata"]["uid"], True)
    key = base64.b64decode(secret["data"]["key"]).decode()
    assert len(key) == 32 and key.strip() == key  # 192 random bits, URL-safe
    jobs.wait_pods(4, "job1")
    for name, pod in jobs.live_pods("job1").items():
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        if "-rollout-" in name:
            assert env[C.AGENT_SESSION_KEY_ENV]["valueFrom"] == {
                "secretKeyRef": {"name": "job1-agent-key", "key": "key"}}
        else:
            assert C.AGENT_SESSION_KEY_ENV not in env, name
    made = [m for _, r, m in jobs.events("job1") if r == "CreatedSecret" and "job1-agent-key" in m]
    assert len(made) == 1 and "take a session" in made[0] and key not in made[0]
    # later reconciles draw other values and leave the Secret as it is
    seen = reconciles(operator_process)
    wait_for(lambda: reconciles(operator_process) >= seen + 6, timeout=30, message="six more reconciles")
    again = read(jobs, "Secret", "job1-agent-key")
    assert again is not None and again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    assert again["data"] == secret["data"]


def test_a_secret_of_the_specs_own_is_read_and_an_in_process_agent_gets_nothing_exposed(jobs: Jobs,
                                                                                       apiserver: Any) -> None:
    jobs.create("job1", task={"agent": "external", "endpoint": {"sessionKeyFrom": {"name": "harness", "key": "t"}}})
    jobs.create("job2", task={"agent": "my_agent:run"})
    jobs.wait_pods(4, "job1")
    jobs.wait_pods(4, "job2")
    assert rollout_env(jobs, "job1")[C.AGENT_SESSION_KEY_ENV]["valueFrom"] == {
        "secretKeyRef": {"name": "harness", "key": "t"}}
    assert read(jobs, "Secret", "job1-agent-key") is None
    wait_for(lambda: jobs.status("job1").get("agentEndpoint"), message="job1's endpoint address")
    # the in-process agent: loopback in its pod, so no Service, no key, no port, no variable, no address
    wait_for(lambda: jobs.status("job2").get("observedGeneration"), message="job2's status")
    assert read(jobs, "Service", "job2-agent") is None and read(jobs, "Secret", "job2-agent-key") is None
    env = rollout_env(jobs, "job2")
    assert not {C.AGENT_BIND_ENV, C.AGENT_ADVERTISE_ENV, C.AGENT_SESSION_KEY_ENV} & set(env)
    ports = jobs.live_pods("job2")["job2-rollout-0"]["spec"]["containers"][0]["ports"]
    assert "agent" not in {p["name"] for p in ports}
    assert "agentEndpoint" not in jobs.status("job2")
    reasons = [r for _, r, _ in jobs.events("job2")]
    assert "CreatedService" in reasons  # the job's headless Service only
    assert not [m for _, r, m in jobs.events("job2") if r == "CreatedService" and "job2-agent" in m]
