"""The driver's one call to the Kubernetes API: the ``status.training`` merge patch, and what its failures mean.

Light on purpose (the kubernetes client and :mod:`asyncrl.api`, no torch): the driver pod's ``status``
sidecar (:mod:`.relay_server`) runs it with the ``<job>-status`` token; a driver outside a cluster
runs it with its kubeconfig.
"""

import os
from collections.abc import Callable
from typing import Any

from asyncrl.api.constants import ENV_JOB_NAME, ENV_JOB_NAMESPACE, GROUP, PLURAL, VERSION

Sender = Callable[[dict[str, Any]], None]  # takes the merge-patch body; raises on failure


def describe_failure(exc: BaseException) -> str:
    """What went wrong and what to do about it, for the common API answers."""
    status = getattr(exc, "status", None)
    hints = {
        401: "the <job>-status ServiceAccount token was rejected; check the driver pod's status-token volume "
             "(mounted in its status sidecar only)",
        403: "RBAC: the Role <job>-status must allow get/patch on asyncrljobs/status for this job "
             "(the operator creates it; check `kubectl get role <job>-status -o yaml`)",
        404: f"the AsyncRLJob is gone, or {ENV_JOB_NAME}/{ENV_JOB_NAMESPACE} name another job",
        422: "the API server rejected status.training: the installed CRD is older than this driver; "
             "apply the CRD from `asyncrl crd`",
    }
    hint = hints.get(status) if isinstance(status, int) else None
    reason = getattr(exc, "reason", None) or str(exc)
    if hint is None:
        hint = "the API server was unreachable or failed; the next report retries in 30 s"
    return f"{type(exc).__name__}{f' {status}' if status else ''}: {reason} -- {hint}"


def kubernetes_sender(name: str, namespace: str, *, timeout_s: float = 10.0) -> Sender:
    """A sender using the official client: in-cluster credentials in a pod, else the default kubeconfig."""
    from kubernetes import client, config

    # A private Configuration/ApiClient: the client's process-wide default is captured once and
    # would keep pointing at the first API server it saw.
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # KUBECONFIG read now: the client reads it once, when kubernetes.config is first imported.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    api = client.CustomObjectsApi(client.ApiClient(configuration))

    def send(body: dict[str, Any]) -> None:
        api.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, body,
            _content_type="application/merge-patch+json", _request_timeout=timeout_s,
        )

    return send
