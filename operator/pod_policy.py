"""Pure policy pieces of the job's pods: hardening, gang scheduling, network isolation, sizes.

``asyncrl.operator.builders`` assembles the pods and children from these; nothing here calls the API.

Hardening. Every pod passes the ``restricted`` Pod Security level by default: non-root as the job
image's user (``docker/job.Dockerfile``: uid/gid 10001), ``fsGroup`` so that a fresh volume (the
checkpoint claim) is writable by that user, seccomp ``RuntimeDefault``; every container, the init
container too, without privilege escalation and with all capabilities dropped. A role's
``template.podSecurityContext`` / ``template.securityContext`` merge over these defaults (nested
objects merge key by key, so ``capabilities: {add: [...]}`` keeps ``drop: [ALL]``).

Gang scheduling (``spec.scheduling.gangScheduler``), as KubeRay's batch-scheduler plugins do:
``volcano`` -- a ``scheduling.volcano.sh/v1beta1`` PodGroup, pods with ``schedulerName: volcano`` and
the annotation ``scheduling.k8s.io/group-name``; ``coscheduling`` -- the scheduler-plugins
``scheduling.x-k8s.io/v1alpha1`` PodGroup, pods with the label ``scheduling.x-k8s.io/pod-group`` and
``schedulerName: scheduler-plugins-scheduler`` (the upstream chart's name of the second scheduler).
``spec.scheduling.schedulerName`` overrides either scheduler name. ``minMember`` is every pod of the
job and ``minResources`` the sum of their requests: all pods start together or none does.

Network. The job's NetworkPolicy admits only the job's own pods (and Prometheus on the metrics
port); with ``spec.task.agent`` and ``spec.task.endpoint.allowFrom``, a second one admits those peers
to the rollout pods' agent port (:func:`agent_network_policy`). Egress stays open.

/dev/shm. Ray's object store lives in /dev/shm (30 % of the pod's memory by default; Ray falls back
to slow disk when /dev/shm is smaller) and NCCL and torch share buffers through it; the container
runtime's default is 64 MiB. Each pod gets a memory-backed emptyDir with ``sizeLimit`` = half the
pod's memory limit (rounded up to MiB): room for the object store and the buffers, while tmpfs pages,
which count against the memory limit, can never take all of it.
"""

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from asyncrl.api import constants as C
from asyncrl.api.agent import EndpointPeer
from asyncrl.api.kube_types import KubeModel, SecurityContext
from asyncrl.api.pods import GangScheduler

JOB_UID = C.JOB_UID  # the user of docker/job.Dockerfile
POD_SECURITY_DEFAULTS: Mapping[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": JOB_UID,
    "runAsGroup": JOB_UID,
    "fsGroup": JOB_UID,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_DEFAULTS: Mapping[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}

VOLCANO_API = "scheduling.volcano.sh/v1beta1"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_LABEL = "volcano.sh/queue-name"  # a job label naming the Volcano queue of its PodGroup
COSCHEDULING_API = "scheduling.x-k8s.io/v1alpha1"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
DEFAULT_SCHEDULER = {GangScheduler.VOLCANO: "volcano", GangScheduler.COSCHEDULING: "scheduler-plugins-scheduler"}
GPU_RESOURCE = "nvidia.com/gpu"

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


# ---------------------------------------------------------------- quantities

def _quantity(q: str) -> float:
    """The value of a quantity like ``32Gi``, ``500M``, ``1.5`` or ``500m`` (the spec's pattern)."""
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    if q.endswith("m"):
        return float(q[:-1]) / 1000
    return float(q)


def quantity_bytes(q: str) -> int:
    """Bytes of a memory quantity like ``32Gi`` or ``500M``."""
    return int(_quantity(q))


def cpu_millis(q: str) -> int:
    """Millicores of a CPU quantity (``'4'`` -> 4000, ``'1.5'`` -> 1500, ``'500m'`` -> 500)."""
    return round(_quantity(q) * 1000)


def mebibytes(n_bytes: int) -> str:
    """``n_bytes`` as a quantity in whole MiB, rounded up."""
    return f"{-(-n_bytes // 2**20)}Mi"


def add_memory(a: str, b: str) -> str:
    """``a + b`` as a quantity in whole MiB (rounded up)."""
    return mebibytes(quantity_bytes(a) + quantity_bytes(b))


def ray_num_cpus(cpu: str) -> int:
    """``ray start --num-cpus``: the pod's CPU request rounded up to whole CPUs, at least 1 (KubeRay
    rounds the same way; Ray counts whole CPUs)."""
    return max(1, -(-cpu_millis(cpu) // 1000))


def shm_size_limit(memory: str) -> str:
    """``sizeLimit`` of the pod's /dev/shm: half its memory limit (see the module docstring)."""
    return mebibytes(quantity_bytes(memory) // 2)


# ---------------------------------------------------------------- hardening

def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` over ``base``; nested objects merge key by key, anything else is replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _set_fields(override: KubeModel | Mapping[str, Any] | None) -> dict[str, Any]:
    if override is None:
        return {}
    if isinstance(override, KubeModel):
        return override.model_dump(mode="json", by_alias=True)  # unset fields are left out
    return dict(override)


def pod_security_context(override: KubeModel | Mapping[str, Any] | None) -> dict[str, Any]:
    return merge(POD_SECURITY_DEFAULTS, _set_fields(override))


def container_security_context(override: SecurityContext | None) -> dict[str, Any]:
    """The operator's container defaults with ``override`` over them. A privileged container or one with
    SYS_ADMIN (only behind ``podSecurityLevel: privileged``) cannot keep ``allowPrivilegeEscalation:
    false``: Kubernetes refuses that pod, so the default is left out for it."""
    defaults = dict(CONTAINER_SECURITY_DEFAULTS)
    if override is not None and override.escalates():
        defaults.pop("allowPrivilegeEscalation")
    return merge(defaults, _set_fields(override))


# ---------------------------------------------------------------- gang scheduling

def scheduler_name(gang: GangScheduler, configured: str | None) -> str | None:
    """The pods' ``schedulerName``: the spec's, else the gang scheduler's, else the default (None)."""
    if configured:
        return configured
    return DEFAULT_SCHEDULER.get(gang)


def gang_metadata(gang: GangScheduler, group: str) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod into PodGroup ``group``."""
    if gang is GangScheduler.VOLCANO:
        return {}, {VOLCANO_GROUP_ANNOTATION: group}
    if gang is GangScheduler.COSCHEDULING:
        return {COSCHEDULING_GROUP_LABEL: group}, {}
    return {}, {}


def total_requests(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Sum of the main containers' requests of ``pods`` (cpu, memory, GPUs and other device-plugin
    resources such as RDMA HCAs): a PodGroup's minResources."""
    millis = mem = 0
    devices: dict[str, int] = {}
    for pod in pods:
        for c in pod["spec"]["containers"]:
            req = c.get("resources", {}).get("requests", {})
            millis += cpu_millis(req.get("cpu", "0"))
            mem += quantity_bytes(req.get("memory", "0"))
            for name, count in req.items():
                if name not in ("cpu", "memory"):
                    devices[name] = devices.get(name, 0) + int(count)
    out = {"cpu": f"{millis}m", "memory": mebibytes(mem)}
    out.update({name: str(n) for name, n in sorted(devices.items())})
    return out


def pod_group(gang: GangScheduler, metadata: dict[str, Any], pods: list[Mapping[str, Any]],
              *, queue: str | None, priority_class_name: str | None) -> dict[str, Any]:
    """The PodGroup manifest of ``gang`` over ``pods`` (``minMember`` = all of them)."""
    spec: dict[str, Any] = {"minMember": len(pods), "minResources": total_requests(pods)}
    if gang is GangScheduler.VOLCANO:
        if queue:
            spec["queue"] = queue
        if priority_class_name:
            spec["priorityClassName"] = priority_class_name
        return {"apiVersion": VOLCANO_API, "kind": "PodGroup", "metadata": metadata, "spec": spec}
    if gang is GangScheduler.COSCHEDULING:
        return {"apiVersion": COSCHEDULING_API, "kind": "PodGroup", "metadata": metadata, "spec": spec}
    raise ValueError(f"spec.scheduling.gangScheduler {gang.value!r} has no PodGroup; valid: volcano, coscheduling")


# ---------------------------------------------------------------- network

def network_policy(metadata: dict[str, Any], job_selector: Mapping[str, str], *, metrics_port: int | None,
                   prometheus_namespaces: Mapping[str, str] | None, prometheus_pods: Mapping[str, str]
                   ) -> dict[str, Any]:
    """Ingress to the job's pods only from the job's own pods (every port: Ray's GCS, raylets, object
    transfer, workers) and, with ``metrics_port``, from Prometheus pods on that port: in the namespaces
    ``prometheus_namespaces`` selects, or with None only in the job's own namespace (a ``from`` entry
    without a namespaceSelector). ``{}`` would admit every namespace: only an admin's explicit
    setting passes it. Egress is open (image pulls, the API server for status, model downloads)."""
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": dict(job_selector)}}]}]
    if metrics_port is not None:
        source: dict[str, Any] = {"podSelector": {"matchLabels": dict(prometheus_pods)}}
        if prometheus_namespaces is not None:
            source["namespaceSelector"] = {"matchLabels": dict(prometheus_namespaces)}
        ingress.append({"from": [source], "ports": [{"protocol": "TCP", "port": metrics_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata,
        "spec": {"podSelector": {"matchLabels": dict(job_selector)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def endpoint_peer(peer: EndpointPeer) -> dict[str, Any]:
    """One ``spec.task.endpoint.allowFrom`` entry as a NetworkPolicy ``from`` peer, as given: an empty
    selector stays ``{}`` (every pod / every namespace), an ``ipBlock`` keeps its ``except`` ranges."""
    out: dict[str, Any] = {}
    for key, selector in (("podSelector", peer.pod_selector), ("namespaceSelector", peer.namespace_selector)):
        if selector is not None:
            out[key] = {"matchLabels": dict(selector.match_labels)} if selector.match_labels else {}
    if peer.ip_block is not None:
        block: dict[str, Any] = {"cidr": peer.ip_block.cidr}
        if peer.ip_block.except_:
            block["except"] = list(peer.ip_block.except_)
        out["ipBlock"] = block
    return out


def agent_network_policy(metadata: dict[str, Any], rollout_selector: Mapping[str, str],
                         peers: Iterable[EndpointPeer], *, port: int) -> dict[str, Any]:
    """Ingress to the rollout pods ``rollout_selector`` picks, on the agent endpoint's ``port`` only, from
    ``peers`` (``spec.task.endpoint.allowFrom``). NetworkPolicies add up: the job's own policy still
    admits the job's pods everywhere, this one adds these peers here and nowhere else."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata,
        "spec": {"podSelector": {"matchLabels": dict(rollout_selector)}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [endpoint_peer(p) for p in peers],
                              "ports": [{"protocol": "TCP", "port": port}]}]},
    }
