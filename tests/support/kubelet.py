"""The kubelet's part, played by the tests against the real API server (there is no kubelet here).

A kubelet reports what happens to a pod through the pod's ``status`` subresource: phases,
conditions, container states with exit codes and waiting reasons. The scheduler binds pods
(``pods/binding``) and marks ``PodScheduled``; the scheduler and the eviction API add the
``DisruptionTarget`` condition before deleting a pod. Each helper here writes what those
components write, with the admin identity, through the same endpoints.

A pod bound to a node is deleted gracefully: the server sets ``deletionTimestamp`` and keeps it
until the kubelet confirms (:meth:`Kubelet.finish_termination`). An unbound pod is deleted at once.
"""

import datetime as dt
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cond(ctype: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": ctype, "status": status, "lastTransitionTime": _now()}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


class Kubelet:
    """Status writes of a kubelet (and the scheduler) for pods of one namespace."""

    def __init__(self, api_client: ApiClient, namespace: str) -> None:
        self.core = CoreV1Api(api_client)
        self.ns = namespace

    def pod(self, name: str) -> dict[str, Any]:
        return self.core.api_client.sanitize_for_serialization(self.core.read_namespaced_pod(name, self.ns))

    def _containers(self, name: str) -> list[str]:
        return [c["name"] for c in self.pod(name)["spec"]["containers"]]

    def _status(self, name: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": status})

    def bind(self, name: str, node: str = "node-1") -> None:
        """What the scheduler does: ``POST pods/<name>/binding`` (spec.nodeName is set)."""
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self.core.create_namespaced_pod_binding(name, self.ns, body, _preload_content=False)

    def run(self, name: str, ready: bool = True) -> None:
        """Containers started; Ready as the readiness probe says."""
        r = "True" if ready else "False"
        self._status(name, {
            "phase": "Running", "startTime": _now(),
            "conditions": [_cond("PodScheduled", "True"), _cond("Initialized", "True"),
                           _cond("ContainersReady", r), _cond("Ready", r)],
            "containerStatuses": [{"name": c, "ready": ready, "restartCount": 0, "image": "asyncrl/job",
                                   "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": _now()}}} for c in self._containers(name)],
        })

    def terminate(self, name: str, exit_code: int, reason: str = "Error", message: str = "",
                  disrupted: bool = False) -> None:
        """The main container exited (``restartPolicy: Never``): phase Succeeded (0) or Failed."""
        conds = [_cond("PodScheduled", "True"), _cond("Ready", "False", "PodCompleted")]
        if disrupted:
            conds.append(_cond("DisruptionTarget", "True", "PreemptionByScheduler",
                               "preempted by a pod of higher priority"))
        term: dict[str, Any] = {"exitCode": exit_code, "reason": reason, "startedAt": _now(), "finishedAt": _now()}
        if message:
            term["message"] = message
        self._status(name, {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "conditions": conds,
            "containerStatuses": [{"name": c, "ready": False, "restartCount": 0, "image": "asyncrl/job",
                                   "imageID": "", "state": {"terminated": term}} for c in self._containers(name)],
        })

    def disrupt(self, name: str, reason: str = "PreemptionByScheduler") -> None:
        """What the scheduler / eviction API writes before deleting a pod it preempts or evicts."""
        pod = self.pod(name)
        conds = [c for c in (pod.get("status") or {}).get("conditions") or [] if c["type"] != "DisruptionTarget"]
        conds.append(_cond("DisruptionTarget", "True", reason, "the pod is being preempted"))
        self._status(name, {"conditions": conds})

    def waiting(self, name: str, reason: str, message: str = "", init: bool = False) -> None:
        """A container that cannot start (image pull, config error) or an init container still waiting."""
        key = "initContainerStatuses" if init else "containerStatuses"
        spec = self.pod(name)["spec"]
        names = [c["name"] for c in spec.get("initContainers" if init else "containers") or []]
        self._status(name, {
            "phase": "Pending",
            "conditions": [_cond("PodScheduled", "True"), _cond("Ready", "False", "ContainersNotReady")],
            key: [{"name": c, "ready": False, "restartCount": 0, "image": "asyncrl/job", "imageID": "",
                   "state": {"waiting": {"reason": reason, "message": message}}} for c in names],
        })

    def unschedulable(self, name: str, message: str = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.") -> None:
        """What the scheduler writes when no node fits."""
        self._status(name, {"phase": "Pending",
                            "conditions": [_cond("PodScheduled", "False", "Unschedulable", message)]})

    def finish_termination(self, name: str) -> None:
        """The kubelet confirms a graceful deletion: the pod object goes away."""
        self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0, _preload_content=False)
