"""Pure: the cluster side of the rollout workers' OpenAI-compatible agent endpoint (``spec.task.agent``).

Every rollout worker serves the endpoint (``asyncrl.rollout.agent``); one worker runs per rollout pod
(each pod advertises one unit of the Ray resource ``rollout`` and each worker takes one). A job with
``spec.task.agent`` gets, and a job without it gets none of:

- on each rollout pod, the named container port ``agent`` (``endpoint.port``) and the environment the
  worker reads: ``ASYNCRL_AGENT_BIND=0.0.0.0:<port>`` (where it listens) and
  ``ASYNCRL_AGENT_ADVERTISE=http://$(ASYNCRL_POD_IP):<port>`` (the base URL its sessions hand out: the
  pod's own address, from the downward API, so a harness that opened a session through the Service
  goes on talking to the one pod that holds it);
- the ClusterIP Service ``<job>-agent`` over the rollout pods' ``agent`` port: where a harness inside
  the cluster opens sessions (``POST http://<job>-agent.<namespace>.svc:<port>/v1/sessions``); once the
  operator sees it, the job's ``status.agentEndpoint`` holds that base URL (:func:`api_base`; the
  ``Endpoint`` column of ``kubectl get asyncrljob -o wide``);
- with a non-empty ``endpoint.allowFrom``, the NetworkPolicy ``<job>-agent``
  (:func:`asyncrl.operator.pod_policy.agent_network_policy`): those peers, on that port, to the
  rollout pods only. The job's own NetworkPolicy already admits the job's pods on every port.

These two children follow the spec: an edit of the port or of ``allowFrom`` patches them, and a spec
without them deletes the ones this job made (:func:`unwanted`), so a peer taken out of ``allowFrom``
loses its access at the next reconcile.
"""

from typing import Any

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator import names, pod_policy
from asyncrl.operator.names import Role

PORT_NAME = "agent"
# The pod's IP (downward API, status.podIP); the advertised URL refers to it as $(ASYNCRL_POD_IP). ASYNCRL_*
# names are the operator's: validation refuses them in a template's env, so a user's variable cannot shadow it.
POD_IP_ENV = "ASYNCRL_POD_IP"
BIND_HOST = "0.0.0.0"


def enabled(spec: AsyncRLJobSpec) -> bool:
    """Whether the job serves the agent endpoint (``spec.task.agent`` set)."""
    return spec.task.agent is not None


def admits_peers(spec: AsyncRLJobSpec) -> bool:
    """Whether the job has the NetworkPolicy ``<job>-agent`` (an agent and at least one ``allowFrom`` peer)."""
    return enabled(spec) and bool(spec.task.endpoint.allow_from)


def rollout_port(spec: AsyncRLJobSpec) -> dict[str, Any]:
    """The rollout container's named ``agent`` port."""
    return {"name": PORT_NAME, "containerPort": spec.task.endpoint.port, "protocol": "TCP"}


def rollout_env(spec: AsyncRLJobSpec) -> list[dict[str, Any]]:
    """The rollout container's endpoint variables, in order: the pod IP first, since a ``$(VAR)`` reference
    expands only a variable defined before it."""
    port = spec.task.endpoint.port
    return [
        {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}},
        {"name": C.AGENT_BIND_ENV, "value": f"{BIND_HOST}:{port}"},
        {"name": C.AGENT_ADVERTISE_ENV, "value": f"http://$({POD_IP_ENV}):{port}"},
        *([{"name": C.AGENT_SESSION_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]
          if (ref := spec.task.endpoint.session_key_from) is not None else []),
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
    if not enabled(spec):
        out.append(("Service", names.agent_service_name(job), "v1", "spec.task.agent is unset"))
    if not admits_peers(spec):
        why = "spec.task.agent is unset" if not enabled(spec) else "spec.task.endpoint.allowFrom is empty"
        out.append(("NetworkPolicy", names.agent_network_policy_name(job), "networking.k8s.io/v1", why))
    return out
