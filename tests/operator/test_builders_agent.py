"""The agent endpoint's cluster side (``spec.task.agent``), pure: the rollout pods' ``agent`` port and
environment, the ``<job>-agent`` Service and NetworkPolicy, and how the planner keeps them in step
with the spec (create, patch on an edit, delete when the spec drops them). A job without an agent
renders as before: no port, no variable, no extra child, the same spec hash."""

import copy
import datetime as dt
from typing import Any

import kubernetes_validate

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator import agent_endpoint, names
from asyncrl.operator.builders import Desired, JobRef, desired, spec_hash
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.lifecycle import Plan, plan
from asyncrl.operator.names import Role
from asyncrl.operator.observed import JobView, Observed, PodView

REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(job_image="img:1")
T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
ALL = ["j-driver-0", "j-rollout-0", "j-rollout-1", "j-actor-0"]
PEERS = [
    {"podSelector": {"matchLabels": {"app": "harness"}}, "namespaceSelector": {"matchLabels": {"team": "rl"}}},
    {"namespaceSelector": {}},  # every pod of every namespace: as given
    {"ipBlock": {"cidr": "10.20.0.0/16", "except": ["10.20.5.0/24"]}},
]


def spec_of(task: dict[str, Any] | None = None, **sections: Any) -> AsyncRLJobSpec:
    base: dict[str, Any] = {"rollout": {"replicas": 2}, "actor": {"replicas": 1}, **sections}
    if task is not None:
        base["task"] = task
    return AsyncRLJobSpec.model_validate(base)


def agent(port: int | None = None, allow: list[dict[str, Any]] | None = None,
          name: str = "external") -> AsyncRLJobSpec:
    endpoint: dict[str, Any] = {}
    if port is not None:
        endpoint["port"] = port
    if allow is not None:
        endpoint["allowFrom"] = allow
    return spec_of({"agent": name, "endpoint": endpoint})


def build(spec: AsyncRLJobSpec) -> Desired:
    return desired(REF, spec, CFG, 0, ray_token="t0k3n")


def children(d: Desired) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c.kind, c.name): c.manifest for c in d.children}


def main_container(d: Desired, pod: str) -> dict[str, Any]:
    return d.pods[pod].manifest["spec"]["containers"][0]


def env_names(c: dict[str, Any]) -> list[str]:
    return [e["name"] for e in c["env"]]


# ---------------------------------------------------------------- without an agent: as before

def test_a_job_without_an_agent_gets_no_port_no_variable_and_no_agent_child() -> None:
    d = build(spec_of())
    for name in d.pods:
        c = main_container(d, name)
        assert [p["name"] for p in c["ports"] if p["name"] == agent_endpoint.PORT_NAME] == []
        assert not {C.AGENT_BIND_ENV, C.AGENT_ADVERTISE_ENV, agent_endpoint.POD_IP_ENV} & set(env_names(c))
    assert [c.kind for c in d.children] == ["Secret", "ConfigMap", "Service", "NetworkPolicy", "ServiceAccount",
                                            "Role", "RoleBinding"]
    assert "j-agent" not in {c.name for c in d.children}
    # what an earlier spec of this job may have made is looked for, and deleted if it is there
    assert [(u.kind, u.name, u.api_version, u.why) for u in d.unwanted] == [
        ("Service", "j-agent", "v1", "spec.task.agent is unset"),
        ("NetworkPolicy", "j-agent", "networking.k8s.io/v1", "spec.task.agent is unset"),
    ]


def test_the_spec_hash_of_a_job_without_an_agent_ignores_the_endpoint_and_the_agent_changes_it() -> None:
    plain = spec_hash(spec_of())
    # task.endpoint without task.agent shapes no pod: the hash stays (running jobs are not restarted by an
    # operator upgrade that brings the new fields, nor by an edit of an unused endpoint)
    assert spec_hash(spec_of({"endpoint": {"port": 9000, "allowFrom": PEERS}})) == plain
    with_agent = spec_hash(agent())
    assert with_agent != plain
    assert spec_hash(agent(port=9000)) != with_agent  # a port edit with an agent restarts the gang
    assert spec_hash(agent(allow=PEERS)) != with_agent


# ---------------------------------------------------------------- rollout pods

def test_rollout_pods_get_the_agent_port_and_the_variables_the_worker_reads() -> None:
    d = build(agent(port=9100))
    for i in range(2):
        c = main_container(d, f"j-rollout-{i}")
        assert {"name": "agent", "containerPort": 9100, "protocol": "TCP"} in c["ports"]
        env = {e["name"]: e for e in c["env"]}
        assert env[C.AGENT_BIND_ENV] == {"name": "ASYNCRL_AGENT_BIND", "value": "0.0.0.0:9100"}
        assert env[C.AGENT_ADVERTISE_ENV] == {"name": "ASYNCRL_AGENT_ADVERTISE",
                                              "value": "http://$(ASYNCRL_POD_IP):9100"}
        assert env[agent_endpoint.POD_IP_ENV]["valueFrom"] == {
            "fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}
        order = env_names(c)  # $(VAR) expands only a variable defined before it
        assert order.index(agent_endpoint.POD_IP_ENV) < order.index(C.AGENT_ADVERTISE_ENV)
        assert len(order) == len(set(order))
    for name in ("j-driver-0", "j-actor-0"):  # the endpoint is the rollout workers' only
        c = main_container(d, name)
        assert "agent" not in {p["name"] for p in c["ports"]}
        assert C.AGENT_BIND_ENV not in env_names(c)


def test_the_agent_port_changes_nothing_else_of_the_rollout_pod() -> None:
    plain, served = build(spec_of()), build(agent())
    a, b = copy.deepcopy(plain.pods["j-rollout-0"].manifest), copy.deepcopy(served.pods["j-rollout-0"].manifest)
    for doc in (a, b):
        doc["metadata"]["annotations"].pop(names.ANNOTATION_SPEC_HASH)
        c = doc["spec"]["containers"][0]
        c["ports"] = [p for p in c["ports"] if p["name"] != "agent"]
        c["env"] = [e for e in c["env"] if e["name"] not in
                    (C.AGENT_BIND_ENV, C.AGENT_ADVERTISE_ENV, agent_endpoint.POD_IP_ENV, C.AGENT_SESSION_KEY_ENV)]
    assert a == b


def test_template_env_comes_after_the_endpoint_variables() -> None:
    s = spec_of({"agent": "external"}, rollout={"replicas": 1, "template": {"env": [{"name": "HOME_DIR",
                                                                                           "value": "/x"}]}})
    order = env_names(main_container(build(s), "j-rollout-0"))
    assert order.index(C.AGENT_ADVERTISE_ENV) < order.index("HOME_DIR")


# ---------------------------------------------------------------- the Service

def test_the_agent_service_selects_the_rollout_pods_on_the_agent_port() -> None:
    d = build(agent(port=9100))
    svc = children(d)[("Service", "j-agent")]
    assert svc["metadata"]["ownerReferences"] == [REF.owner_reference()]
    assert svc["metadata"]["labels"][names.LABEL_JOB] == "j"
    assert svc["spec"] == {"type": "ClusterIP", "selector": {names.LABEL_JOB: "j", names.LABEL_ROLE: "rollout"},
                           "ports": [{"name": "agent", "protocol": "TCP", "port": 9100, "targetPort": "agent"}]}
    selector = svc["spec"]["selector"].items()
    picked = sorted(n for n, slot in d.pods.items() if selector <= slot.manifest["metadata"]["labels"].items())
    assert picked == ["j-rollout-0", "j-rollout-1"]
    assert agent_endpoint.url("j", "ns", agent(port=9100)) == "http://j-agent.ns.svc:9100"
    (child,) = [c for c in d.children if c.name == "j-agent"]
    assert child.follows_spec and child.note == "the agent endpoint: http://j-agent.ns.svc:9100/v1"


def test_without_allow_from_there_is_no_agent_network_policy_and_the_job_policy_is_unchanged() -> None:
    d = build(agent())
    kids = children(d)
    assert ("NetworkPolicy", "j-agent") not in kids
    assert kids[("NetworkPolicy", "j")] == children(build(spec_of()))[("NetworkPolicy", "j")]
    assert [(u.kind, u.name, u.why) for u in d.unwanted] == [
        ("NetworkPolicy", "j-agent", "spec.task.endpoint.allowFrom is empty")]


# ---------------------------------------------------------------- the NetworkPolicy

def test_allow_from_admits_each_peer_as_given_to_the_rollout_pods_agent_port_only() -> None:
    d = build(agent(port=9100, allow=PEERS))
    kids = children(d)
    pol = kids[("NetworkPolicy", "j-agent")]
    assert pol["metadata"]["ownerReferences"] == [REF.owner_reference()]
    assert pol["spec"] == {
        "podSelector": {"matchLabels": {names.LABEL_JOB: "j", names.LABEL_ROLE: "rollout"}},
        "policyTypes": ["Ingress"],
        "ingress": [{"from": PEERS, "ports": [{"protocol": "TCP", "port": 9100}]}],
    }
    assert kids[("NetworkPolicy", "j")] == children(build(spec_of()))[("NetworkPolicy", "j")]  # its own rules stay
    assert d.unwanted == []
    assert [c.kind for c in d.children][-2:] == ["Service", "NetworkPolicy"]


def test_every_agent_manifest_is_a_valid_kubernetes_object() -> None:
    d = build(agent(allow=PEERS))
    for doc in [s.manifest for s in d.pods.values()] + [c.manifest for c in d.children]:
        kubernetes_validate.validate(doc, "1.33", strict=True)  # raises with the field path


# ---------------------------------------------------------------- the planner keeps them in step

def pod(name: str) -> PodView:
    return PodView(name, Role(name.split("-")[1]), int(name.rsplit("-", 1)[1]), 0, "Running", True, False, False)


def run(spec: AsyncRLJobSpec, kids: dict[tuple[str, str], dict[str, Any]]) -> Plan:
    job = JobView.read(REF, 1, {"phase": "Running", "epoch": 0})
    return plan(job, spec, build(spec), Observed({n: pod(n) for n in ALL}, kids), T0, CFG)


def acts(p: Plan) -> list[tuple[str, str, str]]:
    return [(a.verb, a.kind, a.name) for a in p.actions]


def agent_acts(p: Plan) -> list[tuple[str, str, str]]:
    """The actions on the agent endpoint's children (a spec edit also patches the ConfigMap)."""
    return [x for x in acts(p) if x[2] == "j-agent"]


def as_served(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns for a Service we created: its own fields added."""
    out = copy.deepcopy(manifest)
    if out["kind"] == "Service":
        out["spec"].update({"clusterIP": "10.96.0.12", "clusterIPs": ["10.96.0.12"], "sessionAffinity": "None",
                            "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                            "internalTrafficPolicy": "Cluster"})
    out["metadata"]["resourceVersion"] = "7"
    return out


def test_missing_agent_children_are_created_and_the_event_names_the_url() -> None:
    s = agent(allow=PEERS)
    kids = {k: v for k, v in children(build(s)).items() if k[1] != "j-agent"}
    p = run(s, kids)
    assert acts(p) == [("create", "Service", "j-agent"), ("create", "NetworkPolicy", "j-agent")]
    assert p.actions[0].message == "created Service j-agent: the agent endpoint: http://j-agent.ns.svc:8100/v1"


def test_agent_children_as_the_server_holds_them_are_left_alone() -> None:
    s = agent(allow=PEERS)
    kids = {k: as_served(v) for k, v in children(build(s)).items()}
    assert run(s, kids).actions == []


def test_an_edit_of_the_port_or_the_peers_patches_the_agent_children_whole() -> None:
    before = {k: as_served(v) for k, v in children(build(agent(port=8100, allow=PEERS))).items()}
    after = agent(port=8200, allow=PEERS[:1])
    p = run(after, before)
    assert sorted(agent_acts(p)) == [("patch", "NetworkPolicy", "j-agent"), ("patch", "Service", "j-agent")]
    want = children(build(after))
    patched = [a for a in p.actions if a.name == "j-agent"]
    for a in patched:  # the whole spec the operator sets: a merge patch replaces the lists
        assert a.body == {"spec": want[(a.kind, a.name)]["spec"]}
        assert a.api_version == want[(a.kind, a.name)]["apiVersion"]
    assert {a.reason for a in patched} == {"UpdatedService", "UpdatedNetworkPolicy"}


def test_children_the_spec_no_longer_wants_are_deleted_if_they_are_ours() -> None:
    old = {k: as_served(v) for k, v in children(build(agent(allow=PEERS))).items()}
    p = run(agent(), old)  # allowFrom emptied: the peers lose access
    assert agent_acts(p) == [("delete", "NetworkPolicy", "j-agent")]
    (gone,) = [a for a in p.actions if a.name == "j-agent"]
    assert gone.message == "deleted NetworkPolicy j-agent: spec.task.endpoint.allowFrom is empty"
    assert gone.api_version == "networking.k8s.io/v1" and gone.reason == "DeletedNetworkPolicy"
    plain = spec_of()
    kids = {**children(build(plain)), **{k: v for k, v in old.items() if k[1] == "j-agent"}}
    p = run(plain, kids)  # agent unset
    assert sorted(agent_acts(p)) == [("delete", "NetworkPolicy", "j-agent"), ("delete", "Service", "j-agent")]


def test_an_unwanted_name_held_by_another_owner_or_already_going_is_left_alone() -> None:
    plain = spec_of()
    theirs = as_served(children(build(agent()))[("Service", "j-agent")])
    theirs["metadata"]["ownerReferences"] = [{**REF.owner_reference(), "uid": "someone-else"}]
    going = as_served(children(build(agent(allow=PEERS)))[("NetworkPolicy", "j-agent")])
    going["metadata"]["deletionTimestamp"] = "2026-01-01T11:59:00Z"
    kids = {**children(build(plain)), ("Service", "j-agent"): theirs, ("NetworkPolicy", "j-agent"): going}
    p = run(plain, kids)
    assert p.actions == []
    assert next(c for c in p.status.conditions if c.type == "ChildConflict").status == "False"  # not ours to want


def test_a_wanted_agent_name_held_by_another_owner_is_a_conflict() -> None:
    s = agent()
    kids = children(build(s))
    kids[("Service", "j-agent")] = {**kids[("Service", "j-agent")], "metadata": {"name": "j-agent",
                                                                                 "ownerReferences": []}}
    p = run(s, kids)
    assert ("patch", "Service", "j-agent") not in acts(p)
    cond = next(c for c in p.status.conditions if c.type == "ChildConflict")
    assert cond.status == "True" and "Service/j-agent exists and is owned by" in cond.message


def test_a_session_key_from_a_secret_reaches_the_rollout_pods_only_as_a_secret_reference() -> None:
    spec = spec_of({"agent": "external", "endpoint": {"sessionKeyFrom": {"name": "harness", "key": "token"}}})
    d = build(spec)
    for i in range(2):
        env = {e["name"]: e for e in main_container(d, f"j-rollout-{i}")["env"]}
        assert env[C.AGENT_SESSION_KEY_ENV] == {"name": "ASYNCRL_AGENT_SESSION_KEY",
                                                "valueFrom": {"secretKeyRef": {"name": "harness", "key": "token"}}}
    assert C.AGENT_SESSION_KEY_ENV not in env_names(main_container(d, "j-driver-0"))
    # without sessionKeyFrom the pods read the operator's Secret (tests/operator/test_agent_keys.py)
    env = {e["name"]: e for e in main_container(build(agent()), "j-rollout-0")["env"]}
    assert env[C.AGENT_SESSION_KEY_ENV]["valueFrom"] == {"secretKeyRef": {"name": "j-agent-key", "key": "key"}}


# ---------------------------------------------------------------- status.agentEndpoint

def run_from(spec: AsyncRLJobSpec, kids: dict[tuple[str, str], dict[str, Any]] | None,
             status: dict[str, Any]) -> Plan:
    """:func:`run` from a given last status; ``kids`` None: the children were not read this time."""
    job = JobView.read(REF, 1, {"phase": "Running", "epoch": 0, **status})
    return plan(job, spec, build(spec), Observed({n: pod(n) for n in ALL}, kids), T0, CFG)


URL = "http://j-agent.ns.svc:8100/v1"


def test_the_status_names_the_endpoint_once_the_service_is_there_and_not_before() -> None:
    s = agent()
    served = {k: as_served(v) for k, v in children(build(s)).items()}
    missing = {k: v for k, v in served.items() if k != ("Service", "j-agent")}
    first = run_from(s, missing, {})  # the Service is created in this plan: no address yet
    assert agent_acts(first) == [("create", "Service", "j-agent")]
    assert first.status.agent_endpoint is None and "agentEndpoint" not in first.status.to_status_dict()
    there = run_from(s, served, first.status.to_status_dict())
    assert there.status.agent_endpoint == URL == agent_endpoint.api_base("j", "ns", s)
    assert there.status.to_status_dict()["agentEndpoint"] == URL
    # the event of the Service's creation and the status say the same address
    assert first.actions[0].message.endswith(URL)
    # a pod event (children not read): the last value stands
    assert run_from(s, None, there.status.to_status_dict()).status.agent_endpoint == URL
    assert run_from(s, None, {}).status.agent_endpoint is None


def test_a_finished_job_names_no_endpoint() -> None:
    s = agent()
    served = {k: as_served(v) for k, v in children(build(s)).items()}
    for phase in ("Succeeded", "Failed"):
        job = JobView.read(REF, 1, {"phase": phase, "epoch": 0, "agentEndpoint": URL})
        p = plan(job, s, build(s), Observed({n: pod(n) for n in ALL}, served), T0, CFG)
        assert p.status.agent_endpoint is None and "agentEndpoint" not in p.status.to_status_dict(), phase
        assert agent_acts(p) == []  # the Service stays (it goes with the job), nothing is created


def test_the_endpoint_follows_a_port_edit_and_goes_with_the_service_or_the_agent() -> None:
    s = agent(port=8200)
    served = {k: as_served(v) for k, v in children(build(s)).items()}
    p = run_from(s, served, {"agentEndpoint": URL})  # the port was 8100
    assert p.status.agent_endpoint == "http://j-agent.ns.svc:8200/v1"
    # the Service deleted by hand: no address until the operator made it again
    gone = {k: v for k, v in served.items() if k != ("Service", "j-agent")}
    p = run_from(s, gone, {"agentEndpoint": URL})
    assert p.status.agent_endpoint is None and agent_acts(p) == [("create", "Service", "j-agent")]
    going = {**served, ("Service", "j-agent"): {**served[("Service", "j-agent")], "metadata": {
        **served[("Service", "j-agent")]["metadata"], "deletionTimestamp": "2026-01-01T11:59:00Z"}}}
    assert run_from(s, going, {"agentEndpoint": URL}).status.agent_endpoint is None
    # another owner's Service of that name is not this job's endpoint
    theirs = {**served, ("Service", "j-agent"): {**served[("Service", "j-agent")], "metadata": {
        "name": "j-agent", "ownerReferences": [{**REF.owner_reference(), "uid": "someone-else"}]}}}
    assert run_from(s, theirs, {"agentEndpoint": URL}).status.agent_endpoint is None
    # the agent dropped from the spec: the field goes at once, children read or not
    plain = spec_of()
    for kids in (None, {**children(build(plain)), ("Service", "j-agent"): served[("Service", "j-agent")]}):
        p = run_from(plain, kids, {"agentEndpoint": URL})
        assert p.status.agent_endpoint is None and "agentEndpoint" not in p.status.to_status_dict()


def test_a_job_without_an_agent_never_has_the_field_and_the_reconciler_deletes_a_stale_one() -> None:
    from asyncrl.operator.reconcile import status_patch

    plain = spec_of()
    p = run_from(plain, {k: as_served(v) for k, v in children(build(plain)).items()}, {})
    assert p.status.agent_endpoint is None and "agentEndpoint" not in p.status.to_status_dict()
    old = {"phase": "Running", "epoch": 0, "agentEndpoint": URL}
    assert status_patch(old, run_from(plain, None, old).status.to_status_dict())["agentEndpoint"] is None
