"""The few Kubernetes API calls the operator makes, on plain dicts (official ``kubernetes`` client).

Responses are read raw (``_preload_content=False``) and parsed as JSON, so the operator sees
exactly what the API server returned. ``ApiException`` escapes; the reconciler decides.

Children are addressed by kind and apiVersion: built-in kinds go through their typed API, any
other (the gang scheduler's ``PodGroup``) through the custom-objects API of its apiVersion.
"""

import json
import os
from typing import Any

import kubernetes
from kubernetes.client import ApiClient, ApiException

from asyncrl.api.constants import GROUP, PLURAL, VERSION

_CORE = {"Pod": "pod", "ConfigMap": "config_map", "Service": "service", "ServiceAccount": "service_account",
         "Secret": "secret"}
_RBAC = {"Role": "role", "RoleBinding": "role_binding"}
_NETWORKING = {"NetworkPolicy": "network_policy"}
_CUSTOM_PLURALS = {"PodGroup": "podgroups"}  # volcano and coscheduling PodGroups alike
SUPPORTED_KINDS = (*_CORE, *_RBAC, *_NETWORKING, *_CUSTOM_PLURALS)
# Kinds read as metadata only: the operator never needs (nor should hold) a Secret's data.
METADATA_ONLY = frozenset({"Secret"})
_METADATA_ACCEPT = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
MERGE_PATCH = "application/merge-patch+json"


def _json(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data or b"{}")


def server_message(exc: ApiException) -> str:
    """The API server's own message of a failed call (its Status body), else the HTTP reason."""
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or "no message")


class Kube:
    """Thin, typed-by-convention wrapper; one instance per operator process."""

    def __init__(self, api_client: ApiClient) -> None:
        self.client = api_client
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(api_client)
        self.networking = kubernetes.client.NetworkingV1Api(api_client)
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
        for api, nouns in ((self.core, _CORE), (self.rbac, _RBAC), (self.networking, _NETWORKING)):
            if kind in nouns:
                return api, nouns[kind]
        raise ValueError(f"unsupported kind {kind!r}; supported: {', '.join(SUPPORTED_KINDS)}")

    @staticmethod
    def _custom(kind: str, api_version: str) -> tuple[str, str, str]:
        """(group, version, plural) of a custom kind, from the manifest's apiVersion."""
        group, _, version = api_version.rpartition("/")
        if kind not in _CUSTOM_PLURALS or not group:
            raise ValueError(f"unsupported kind {kind!r} with apiVersion {api_version!r}; supported: "
                             f"{', '.join(SUPPORTED_KINDS)} (custom kinds need a group/version apiVersion)")
        return group, version, _CUSTOM_PLURALS[kind]

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

    def get(self, kind: str, namespace: str, name: str, api_version: str = "v1") -> dict[str, Any] | None:
        """The object, or None when absent; a Secret comes back as its metadata only."""
        try:
            if kind in _CUSTOM_PLURALS:
                group, version, plural = self._custom(kind, api_version)
                return _json(self.custom.get_namespaced_custom_object(group, version, namespace, plural, name,
                                                                      _preload_content=False))
            api, noun = self._api(kind)
            headers = {"Accept": _METADATA_ACCEPT} if kind in METADATA_ONLY else None
            return _json(getattr(api, f"read_namespaced_{noun}")(name, namespace, _preload_content=False,
                                                                 _headers=headers))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, kind: str, namespace: str, body: dict[str, Any]) -> None:
        if kind in _CUSTOM_PLURALS:
            group, version, plural = self._custom(kind, body.get("apiVersion", ""))
            self.custom.create_namespaced_custom_object(group, version, namespace, plural, body,
                                                        _preload_content=False)
            return
        api, noun = self._api(kind)
        getattr(api, f"create_namespaced_{noun}")(namespace, body, _preload_content=False)

    def patch(self, kind: str, namespace: str, name: str, body: dict[str, Any], api_version: str = "v1") -> None:
        if kind in _CUSTOM_PLURALS:
            group, version, plural = self._custom(kind, api_version)
            self.custom.patch_namespaced_custom_object(group, version, namespace, plural, name, body,
                                                       _preload_content=False)
            return
        api, noun = self._api(kind)
        # A JSON merge patch (RFC 7386), as for the custom kinds: lists are replaced whole, so a Service's ports
        # and a NetworkPolicy's rules become exactly the desired ones. The client's default for a dict body on
        # a built-in kind is a strategic merge, which merges a Service's ports by number: a changed port would
        # be added next to the old one.
        getattr(api, f"patch_namespaced_{noun}")(name, namespace, body, _preload_content=False,
                                                 _content_type=MERGE_PATCH)

    def delete(self, kind: str, namespace: str, name: str, grace_period_seconds: int | None = None,
               api_version: str = "v1") -> None:
        kw: dict[str, Any] = {"propagation_policy": "Background", "_preload_content": False}
        if grace_period_seconds is not None:
            kw["grace_period_seconds"] = grace_period_seconds
        if kind in _CUSTOM_PLURALS:
            group, version, plural = self._custom(kind, api_version)
            self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name, **kw)
            return
        api, noun = self._api(kind)
        getattr(api, f"delete_namespaced_{noun}")(name, namespace, **kw)
