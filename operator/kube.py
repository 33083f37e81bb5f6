"""The few Kubernetes API calls the operator makes, on plain dicts (official ``kubernetes`` client).

Responses are read raw (``_preload_content=False``) and parsed as JSON, so the operator sees
exactly what the API server returned. ``ApiException`` escapes; the reconciler decides.
"""

import json
import os
from typing import Any

import kubernetes
from kubernetes.client import ApiClient, ApiException

from asyncrl.api.constants import GROUP, PLURAL, VERSION

_CORE = {"Pod": "pod", "ConfigMap": "config_map", "Service": "service", "ServiceAccount": "service_account"}
_RBAC = {"Role": "role", "RoleBinding": "role_binding"}


def _json(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data or b"{}")


class Kube:
    """Thin, typed-by-convention wrapper; one instance per operator process."""

    def __init__(self, api_client: ApiClient) -> None:
        self.client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)

    @classmethod
    def from_environment(cls) -> "Kube":
        """In-cluster credentials when running in a pod, else ``$KUBECONFIG`` (read now, not at import)."""
        conf = kubernetes.client.Configuration()
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kubernetes.config.load_incluster_config(client_configuration=conf)
        else:
            kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=conf)
        return cls(ApiClient(conf))

    def _api(self, kind: str) -> tuple[Any, str]:
        if kind in _CORE:
            return self.core, _CORE[kind]
        if kind in _RBAC:
            return self.rbac, _RBAC[kind]
        raise ValueError(f"unsupported kind {kind!r}; supported: {', '.join([*_CORE, *_RBAC])}")

    # -- the job
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                          {"status": status}, _preload_content=False)

    def patch_job(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body,
                                                   _preload_content=False)

    def delete_job(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                    propagation_policy="Background", _preload_content=False)

    # -- children
    def list_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return _json(self.core.list_namespaced_pod(namespace, label_selector=selector,
                                                   _preload_content=False)).get("items") or []

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        api, noun = self._api(kind)
        try:
            return _json(getattr(api, f"read_namespaced_{noun}")(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        api, noun = self._api(kind)
        getattr(api, f"create_namespaced_{noun}")(namespace, body, _preload_content=False)

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any]) -> None:
        api, noun = self._api(kind)
        getattr(api, f"patch_namespaced_{noun}")(name, namespace, body, _preload_content=False)

    def delete(self, kind: str, namespace: str, name: str, grace_period_seconds: int | None = None) -> None:
        api, noun = self._api(kind)
        kw: dict[str, Any] = {"propagation_policy": "Background", "_preload_content": False}
        if grace_period_seconds is not None:
            kw["grace_period_seconds"] = grace_period_seconds
        getattr(api, f"delete_namespaced_{noun}")(name, namespace, **kw)
