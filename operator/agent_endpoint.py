"""Pure: the cluster side of the rollout workers' OpenAI-compatible agent endpoint (``spec.task.agent``).

Every rollout worker serves the endpoint (``asyncrl.rollout.agent``); one worker runs per rollout pod
(each pod advertises one unit of the Ray resource ``rollout`` and each worker takes one).

An **in-process agent** (``task.agent: "pkg.mod:fn"``) is called by the worker's own agent runner, in the same
pod: its endpoint listens on loopback on a free port (the worker's default), so the operator adds nothing for it
(no port, no variable, no Service; ``status.agentEndpoint`` stays empty). Validation refuses ``allowFrom`` and
``sessionKeyFrom`` there: no peer could use them.

An **external agent** (``task.agent: external``, :func:`exposed`) is served on the pod network:

- on each rollout pod, the named container port ``agent`` (``endpoint.port``) and the environment the
  worker reads: ``ASYNCRL_AGENT_BIND=0.0.0.0:<port>`` (where it listens),
  ``ASYNCRL_AGENT_ADVERTISE=http://$(ASYNCRL_POD_IP):<port>`` (the base URL its sessions hand out: the
  pod's own address, from the downward API, so a harness that opened a session through the Service
  goes on talking to the one pod that holds it) and ``ASYNCRL_AGENT_SESSION_KEY`` (:func:`session_key_ref`);
- a session key, always: ``endpoint.sessionKeyFrom`` when the spec names a Secret, else the Secret
  ``<job>-agent-key`` that the operator makes (:func:`key_secret`: 192 random bits, created once and never
  patched or rotated, owned by the job so it goes with it). Taking a session (``POST /v1/sessions``) needs it;
- the ClusterIP Service ``<job>-agent`` over the rollout pods' ``agent`` port: where a harness inside
  the cluster opens sessions (``POST http://<job>-agent.<namespace>.svc:<port>/v1/sessions``); once the
  operator sees it, the job's ``status.agentEndpoint`` holds that base URL (:func:`api_base`; the
  ``Endpoint`` column of ``kubectl get asyncrljob -o wide``);
- with a non-empty ``endpoint.allowFrom``, the NetworkPolicy ``<job>-agent``
  (:func:`asyncrl.operator.pod_policy.agent_network_policy`): those peers, on that port, to the
  rollout pods only. The job's own NetworkPolicy already admits the job's pods on every port.

The Service and the NetworkPolicy follow the spec: an edit of the port or of ``allowFrom`` patches them, and a
spec without them deletes the ones this job made (:func:`unwanted`), so a peer taken out of ``allowFrom``
loses its access at the next reconcile. The key Secret is never deleted by the operator (its RBAC has no
``delete`` on Secrets): it goes with the job, and a spec that comes back to the operator's key finds it again.
"""

from typing import Any

from asyncrl.api import constants as C
from asyncrl.api.agent import EXTERNAL
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator import names, pod_policy
from asyncrl.operator.names import Role

PORT_NAME = "agent"
# The pod's IP (downward API, status.podIP); the advertised URL refers to it as $(ASYNCRL_POD_IP). ASYNCRL_*
# names are the operator's: validation refuses them in a template's env, so a user's variable cannot shadow it.
POD_IP_ENV = "ASYNCRL_POD_IP"
BIND_HOST = "0.0.0.0"
KEY_BYTES = 24  # the operator's session key: 192 random bits (secrets.token_urlsafe(KEY_BYTES), 32 characters)


def enabled(spec: AsyncRLJobSpec) -> bool:
    """Whether the job's rollout workers serve the agent endpoint (``spec.task.agent`` set), on loopback or not."""
    return spec.task.agent is not None


def exposed(spec: AsyncRLJobSpec) -> bool:
    """Whether the endpoint is served on the pod network (``spec.task.agent: external``): port, variables, key,
    Service, NetworkPolicy. An in-process agent's endpoint stays on loopback inside its pod."""
    return spec.task.agent == EXTERNAL


def admits_peers(spec: AsyncRLJobSpec) -> bool:
    """Whether the job has the NetworkPolicy ``<job>-agent`` (an external agent and an ``allowFrom`` peer)."""
    return exposed(spec) and bool(spec.task.endpoint.allow_from)


def generates_key(spec: AsyncRLJobSpec) -> bool:
    """Whether the operator makes the key Secret ``<job>-agent-key`` (an external agent without ``sessionKeyFrom``)."""
    return exposed(spec) and spec.task.endpoint.session_key_from is None


def session_key_ref(job: str, spec: AsyncRLJobSpec) -> tuple[str, str] | None:
    """(Secret, key) of the session key the rollout pods read: the spec's own, else the operator's; None without
    an external agent (nothing takes sessions)."""
    if not exposed(spec):
        return None
    ref = spec.task.endpoint.session_key_from
    return (ref.name, ref.key) if ref is not None else (names.agent_key_secret_name(job), names.AGENT_KEY_KEY)


def key_secret(metadata: dict[str, Any], key: str) -> dict[str, Any]:
    """The Secret ``<job>-agent-key`` (only with :func:`generates_key`): ``stringData.key``, the caller's random
    value (``secrets.token_urlsafe(KEY_BYTES)``); created once, never patched."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "stringData": {names.AGENT_KEY_KEY: key}}


def rollout_port(spec: AsyncRLJobSpec) -> dict[str, Any]:
    """The rollout container's named ``agent`` port."""
    return {"name": PORT_NAME, "containerPort": spec.task.endpoint.port, "protocol": "TCP"}


def rollout_env(job: str, spec: AsyncRLJobSpec) -> list[dict[str, Any]]:
    """The rollout container's endpoint variables (an external agent), in order: the pod IP first, since a
    ``$(VAR)`` reference expands only a variable defined before it; the session key last, from its Secret."""
    port = spec.task.endpoint.port
    secret = session_key_ref(job, spec)
    assert secret is not None, "rollout_env is for an external agent (exposed)"
    return [
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        {"name": C.AGENT_BIND_ENV, "value": f"{BIND_HOST}:{port}"},
        {"name": C.AGENT_ADVERTISE_ENV, "value": f"http://$({POD_IP_ENV}):{port}"},
        {"name": C.AGENT_SESSION_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": secret[0], "key": secret[1]}}},
    ]


def url(job: str, namespace: str, spec: AsyncRLJobSpec) -> str:
    """The endpoint's in-cluster base URL through the Service (sessions: ``<url>/v1/sessions``)."""
    return f"http://{names.agent_service_name(job)}.{namespace}.svc:{spec.task.endpoint.port}"


def api_base(job: str, namespace: str, spec: AsyncRLJobSpec) -> str:
    """The OpenAI API base URL of the endpoint through the Service (:func:`url` + ``/v1``): the event of the
    Service's creation says it, and the job's ``status.agentEndpoint`` holds it while the Service exists and the job is not final."""
    return f"{url(job, namespace, spec)}/v1"


def service(metadata: dict[str, Any], job: str, spec: AsyncRLJobSpec) -> dict[str, Any]:
    """The ClusterIP Service ``<job>-agent``: the job's rollout pods, on their ``agent`` port. Only ready pods
    take new sessions (a ClusterIP Service routes to ready endpoints)."""
    port = spec.task.endpoint.port
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": metadata,
        "spec": {"type": "ClusterIP", "selector": names.role_selector(job, Role.ROLLOUT),
                 "ports": [{"name": PORT_NAME, "protocol": "TCP", "port": port, "targetPort": PORT_NAME}]},
    }


def network_policy(metadata: dict[str, Any], job: str, spec: AsyncRLJobSpec) -> dict[str, Any]:
    """The NetworkPolicy ``<job>-agent`` (only with :func:`admits_peers`)."""
    return pod_policy.agent_network_policy(metadata, names.role_selector(job, Role.ROLLOUT),
                                           spec.task.endpoint.allow_from, port=spec.task.endpoint.port)


def unwanted(job: str, spec: AsyncRLJobSpec) -> list[tuple[str, str, str, str]]:
    """(kind, name, apiVersion, why) of the endpoint's children this spec does not want: the job made them
    under an earlier spec, and the operator deletes them (its own only)."""
    out: list[tuple[str, str, str, str]] = []
    unexposed = ("spec.task.agent is unset" if not enabled(spec)
                 else "spec.task.agent runs in the rollout worker, which serves it on loopback")
    if not exposed(spec):
        out.append(("Service", names.agent_service_name(job), "v1", unexposed))
    if not admits_peers(spec):
        why = unexposed if not exposed(spec) else "spec.task.endpoint.allowFrom is empty"
        out.append(("NetworkPolicy", names.agent_network_policy_name(job), "networking.k8s.io/v1", why))
    return out
