"""The driver pod's own parts: its status sidecar (the only holder of the status token) and the task's volumes.

Pure, like :mod:`asyncrl.operator.builders`, which puts these into the driver pod.

**User code never shares a container with the status token.** The driver container runs the Ray
head, the job driver and every Ray worker the head hosts; the task's code (``spec.task``) is checked
there at start, in a child process (``asyncrl.rollout.envs.task_check``). That container gets no
ServiceAccount token: the pod sets ``automountServiceAccountToken: false``, so the API server's
ServiceAccount admission injects nothing. The token of ``<job>-status`` is a projected volume
(:func:`status_token_volume`, what Kubernetes' own ``kube-api-access-*`` volume holds) mounted only
in the ``status`` sidecar (:func:`status_sidecar`): a native sidecar (an init container with
``restartPolicy: Always``, Kubernetes 1.29 and later) that runs ``asyncrl status-relay`` and
nothing else. Containers of a pod share no filesystem and, without ``shareProcessNamespace`` (no
template field sets it), no processes, so no process of the driver container can read the token.

The driver reaches ``status.training`` through the sidecar's Unix socket, on an emptyDir both
containers mount (:func:`status_relay_volume`); no port listens. The relay accepts one thing: a
``status.training`` summary that validates as :class:`asyncrl.api.status.TrainingSummary`, and it
sends only that field. Code in the driver container can still send a summary (as the driver
does), but no longer read the job, patch any other status field, or carry the token away.

**The task's volumes.** The driver reads what the task names: the dataset's rows (held-out
problems for ``spec.eval`` and the start-up probe), and the check at start imports the user's
modules and constructs the environment. So the driver container mounts, read-only, each mount of
the rollout template (where ``docs/tasks.md`` puts them) that holds one of :func:`task_paths`,
with its volume. A volume that projects a ServiceAccount token is never copied: the driver
container holds no token.
"""

from collections.abc import Iterator
from typing import Any

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator.config import OperatorSettings

STATUS_CONTAINER = "status"
RELAY_VOLUME, TOKEN_VOLUME = "status-relay", "status-token"
# The relay process: python + the kubernetes client, 54 MiB resident when idle (measured, `asyncrl status-relay`).
STATUS_RESOURCES = {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
TOKEN_EXPIRATION_SECONDS = 3607  # as Kubernetes' own kube-api-access volume; the kubelet renews it at 80 %


def status_token_volume() -> dict[str, Any]:
    """The ``<job>-status`` ServiceAccount token, CA and namespace: the files the in-cluster client reads."""
    return {"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                      "fieldPath": "metadata.namespace"}}]}},
    ]}}


def status_relay_volume() -> dict[str, Any]:
    """The folder of the relay's socket: memory-backed and tiny (it holds one socket file)."""
    return {"name": RELAY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}


def relay_mount() -> dict[str, Any]:
    return {"name": RELAY_VOLUME, "mountPath": C.STATUS_RELAY_DIR}


def status_sidecar(job_name: str, namespace: str, image: str, settings: OperatorSettings,
                   security: dict[str, Any]) -> dict[str, Any]:
    """The ``status`` native sidecar: the token, the relay's socket, and no user code, template env or Ray token.
    ``security``: the driver container's hardened context; the sidecar's root filesystem is read-only too."""
    return {
        "name": STATUS_CONTAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "restartPolicy": "Always",  # a native sidecar: up before the driver, stopped after it
        "command": ["asyncrl", "status-relay", "--socket", C.STATUS_RELAY_SOCKET],
        "env": [{"name": C.ENV_JOB_NAME, "value": job_name}, {"name": C.ENV_JOB_NAMESPACE, "value": namespace}],
        "resources": STATUS_RESOURCES,
        "volumeMounts": [relay_mount(),
                         {"name": TOKEN_VOLUME, "mountPath": C.SERVICE_ACCOUNT_DIR, "readOnly": True}],
        "securityContext": {**security, "readOnlyRootFilesystem": True},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def task_paths(spec: AsyncRLJobSpec) -> list[str]:
    """The absolute paths ``spec.task`` names: ``dataset.path``, the ``pythonPath`` folders, and every
    string in ``args`` that is an absolute path (an environment's data file)."""
    task = spec.task
    named = [*([task.dataset.path] if task.dataset is not None else []), *task.python_path, *_strings(task.args)]
    return [p for p in named if p.startswith("/")]


def _holds(mount_path: str, path: str) -> bool:
    return path == mount_path or path.startswith(mount_path.rstrip("/") + "/")


def _projects_token(volume: dict[str, Any]) -> bool:
    return any("serviceAccountToken" in (s or {}) for s in (volume.get("projected") or {}).get("sources") or [])


def task_volumes(spec: AsyncRLJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(mounts, volumes)`` for the driver container: each rollout-template mount that holds one of
    :func:`task_paths`, read-only, and the volumes they name (never one that projects a token)."""
    template = spec.rollout.template
    volumes = {v.name: v.model_dump(mode="json", by_alias=True) for v in template.volumes}
    paths = task_paths(spec)
    mounts = []
    for m in template.volume_mounts:
        volume = volumes[m.name]  # validation: every mount names a declared volume
        if _projects_token(volume) or not any(_holds(m.mount_path, p) for p in paths):
            continue
        mounts.append({**m.model_dump(mode="json", by_alias=True, exclude_none=True), "readOnly": True})
    names = {m["name"] for m in mounts}
    return mounts, [v for name, v in volumes.items() if name in names]
