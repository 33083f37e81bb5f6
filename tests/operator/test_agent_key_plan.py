"""Keys by default, pure (issue 35, part C): an external agent in a cluster always has a session key, the
operator's Secret ``<job>-agent-key`` unless the spec names its own, created once and never rotated; an
in-process agent is served on loopback, so it gets no port, no variable, no Service and no endpoint address.

Before: a job with ``agent: external`` and no ``sessionKeyFrom`` took sessions without a key (four clients
claimed 924 sessions in 20 s, the honest harness 1); an in-process agent's pods bound ``0.0.0.0`` and got the
``<job>-agent`` Service. On the real API server: ``tests/operator/test_server_agent.py``.
"""

import datetime as dt
import secrets
from typing import Any

import kubernetes_validate
import pytest

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator import agent_endpoint, names
from asyncrl.operator.builders import Desired, JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.lifecycle import Plan, plan
from asyncrl.operator.names import Role
from asyncrl.operator.observed import JobView, Observed, PodView

REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(job_image="img:1")
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
PODS = ["j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0"]


def spec(agent: str | None = "external", **endpoint: Any) -> AsyncRLJobSpec:
    task: dict[str, Any] = {"endpoint": endpoint}
    if agent is not None:
        task["agent"] = agent
    return AsyncRLJobSpec.model_validate({"rollout": {"replicas": 2}, "actor": {"replicas": 1}, "task": task})


def build(s: AsyncRLJobSpec, key: str | None = "k" * 32) -> Desired:
    return desired(REF, s, CFG, 0, ray_token="t0k3n", agent_key=key)


def kids(d: Desired) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c.kind, c.name): c.manifest for c in d.children}


def rollout_env(d: Desired) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in d.pods["j-rollout-0"].manifest["spec"]["containers"][0]["env"]}


def run(s: AsyncRLJobSpec, observed: dict[tuple[str, str], dict[str, Any]], key: str = "n" * 32) -> Plan:
    job = JobView.read(REF, 1, {"phase": "Running", "epoch": 0})
    pods = {n: PodView(n, Role(n.split("-")[1]), int(n[-1]), 0, "Running", True, False, False) for n in PODS}
    return plan(job, s, build(s, key), Observed(pods, observed), T0, CFG)


def served(d: Desired) -> dict[tuple[str, str], dict[str, Any]]:
    """The children as the server returns them (a Secret: metadata only, as the operator reads it)."""
    out = {}
    for k, m in kids(d).items():
        out[k] = {"kind": m["kind"], "metadata": m["metadata"]} if m["kind"] == "Secret" else m
    return out


# ---------------------------------------------------------------- the operator's key

def test_an_external_agent_without_a_secret_of_its_own_gets_the_operators_key() -> None:
    d = build(spec())
    secret = kids(d)[("Secret", "j-agent-key")]
    assert secret["stringData"] == {"key": "k" * 32} and secret["type"] == "Opaque"
    assert secret["metadata"]["ownerReferences"] == [REF.owner_reference()]  # garbage-collected with the job
    kubernetes_validate.validate(secret, "1.33", strict=True)
    (child,) = [c for c in d.children if c.name == "j-agent-key"]
    assert not child.follows_spec and "take a session" in child.note
    # every rollout pod reads it as sessionKeyFrom would be read; no other pod has it
    for i in range(2):
        env = {e["name"]: e for e in d.pods[f"j-rollout-{i}"].manifest["spec"]["containers"][0]["env"]}
        assert env[C.AGENT_SESSION_KEY_ENV] == {"name": C.AGENT_SESSION_KEY_ENV, "valueFrom": {
            "secretKeyRef": {"name": "j-agent-key", "key": "key"}}}
    for pod in ("j-driver-0", "j-actor-0"):
        assert C.AGENT_SESSION_KEY_ENV not in {e["name"] for e in d.pods[pod].manifest["spec"]["containers"][0]["env"]}


def test_the_reconciler_draws_192_random_bits_for_it() -> None:
    # reconcile.py passes secrets.token_urlsafe(KEY_BYTES): 24 bytes = 192 bits, 32 URL-safe characters (no
    # whitespace, so the worker's check of the value passes)
    assert agent_endpoint.KEY_BYTES * 8 == 192
    key = secrets.token_urlsafe(agent_endpoint.KEY_BYTES)
    assert len(key) == 32 and key.strip() == key


def test_the_key_is_created_once_and_never_rotated_by_a_later_reconcile() -> None:
    s = spec()
    first = run(s, {k: v for k, v in served(build(s)).items() if k != ("Secret", "j-agent-key")})
    made = [a for a in first.actions if a.kind == "Secret"]
    assert [(a.verb, a.name) for a in made] == [("create", "j-agent-key")]
    assert made[0].body is not None and made[0].body["stringData"] == {"key": "n" * 32}
    # the next reconciles draw other values; the Secret is there: no create, no patch, whatever they drew
    for key in ("m" * 32, "o" * 32):
        assert [a for a in run(s, served(build(s)), key).actions if a.kind == "Secret"] == []


def test_a_secret_of_the_specs_own_is_read_instead_and_the_operator_makes_none() -> None:
    d = build(spec(sessionKeyFrom={"name": "harness", "key": "token"}))
    assert ("Secret", "j-agent-key") not in kids(d)
    assert rollout_env(d)[C.AGENT_SESSION_KEY_ENV]["valueFrom"] == {
        "secretKeyRef": {"name": "harness", "key": "token"}}
    # the operator never deletes a Secret (its RBAC has no delete there): a spec back to its own key finds it again
    assert "Secret" not in {u.kind for u in d.unwanted}


def test_a_key_name_held_by_another_owner_is_a_conflict_and_never_adopted() -> None:
    s = spec()
    observed = served(build(s))
    observed[("Secret", "j-agent-key")] = {"kind": "Secret", "metadata": {"name": "j-agent-key",
                                                                          "ownerReferences": []}}
    p = run(s, observed)
    assert not [a for a in p.actions if a.kind == "Secret"]
    cond = next(c for c in p.status.conditions if c.type == "ChildConflict")
    assert cond.status == "True" and "Secret/j-agent-key exists and is owned by" in cond.message


def test_the_names_fit() -> None:
    assert names.agent_key_secret_name("j") == "j-agent-key" and names.AGENT_KEY_KEY == "key"
    assert agent_endpoint.session_key_ref("j", spec()) == ("j-agent-key", "key")
    assert agent_endpoint.session_key_ref("j", spec("my_agent:run")) is None
    assert agent_endpoint.session_key_ref("j", spec(None)) is None


# ---------------------------------------------------------------- in-process agents: loopback, nothing exposed

@pytest.mark.parametrize("agent", ["my_agent:run", None])
def test_an_in_process_agent_gets_no_port_no_variable_no_key_and_no_service(agent: str | None) -> None:
    s = spec(agent)
    d = build(s)
    assert not [c for c in d.children if c.name.startswith("j-agent")]
    for name, slot in d.pods.items():
        c = slot.manifest["spec"]["containers"][0]
        assert "agent" not in {p["name"] for p in c["ports"]}, name
        assert not {C.AGENT_BIND_ENV, C.AGENT_ADVERTISE_ENV, C.AGENT_SESSION_KEY_ENV} & {e["name"] for e in c["env"]}
    why = "spec.task.agent runs in the rollout worker, which serves it on loopback" if agent else \
        "spec.task.agent is unset"
    assert [(u.kind, u.name, u.why) for u in d.unwanted] == [("Service", "j-agent", why),
                                                             ("NetworkPolicy", "j-agent", why)]


def test_a_job_that_moves_to_an_in_process_agent_loses_its_service_and_its_endpoint_address() -> None:
    ext = spec()
    before = served(build(ext))
    url = agent_endpoint.api_base("j", "ns", ext)
    job = JobView.read(REF, 1, {"phase": "Running", "epoch": 0, "agentEndpoint": url})
    s = spec("my_agent:run")
    pods = {n: PodView(n, Role(n.split("-")[1]), int(n[-1]), 0, "Running", True, False, False) for n in PODS}
    p = plan(job, s, build(s), Observed(pods, before), T0, CFG)
    assert [(a.verb, a.kind, a.name) for a in p.actions if a.name.startswith("j-agent")] == [
        ("delete", "Service", "j-agent")]
    assert p.status.agent_endpoint is None


def test_allow_from_everywhere_is_never_served_without_a_key() -> None:
    # before: allowFrom admitting 0.0.0.0/0 validated without a key, and anyone on the internet that reached the
    # port took sessions; now an external agent's pods always read a key, and an in-process agent refuses allowFrom
    from asyncrl.api.validation import SpecError, validate_job

    everyone = [{"ipBlock": {"cidr": "0.0.0.0/0"}}]
    d = build(spec(allowFrom=everyone))
    assert ("NetworkPolicy", "j-agent") in kids(d) and ("Secret", "j-agent-key") in kids(d)
    assert rollout_env(d)[C.AGENT_SESSION_KEY_ENV]["valueFrom"]["secretKeyRef"]["name"] == "j-agent-key"
    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "j"},
           "spec": {"task": {"agent": "my_agent:run", "endpoint": {"allowFrom": everyone}}}}
    with pytest.raises(SpecError) as err:
        validate_job(doc)
    assert "spec.task.endpoint.allowFrom" in str(err.value) and "task.agent: external" in str(err.value)
