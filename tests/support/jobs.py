"""Reading and writing AsyncRLJobs and their children on the real API server, for the operator tests."""

from typing import Any

from kubernetes.client import ApiClient, ApiException, CoreV1Api, CustomObjectsApi

from asyncrl.api.constants import GROUP, PLURAL, VERSION
from tests.support.helpers import job_manifest, wait_for

__all__ = ["Jobs", "ApiException", "job_manifest", "wait_for"]


class Jobs:
    """The AsyncRLJobs of one namespace, their pods, other children and events."""

    def __init__(self, api_client: ApiClient, namespace: str) -> None:
        self.client = api_client
        self.ns = namespace
        self.custom = CustomObjectsApi(api_client)
        self.core = CoreV1Api(api_client)

    def _plain(self, obj: Any) -> Any:
        return self.client.sanitize_for_serialization(obj)

    # -- the job
    def create(self, name: str = "job1", **spec: Any) -> dict[str, Any]:
        body = job_manifest(name, self.ns, **spec)
        return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body))

    def create_manifest(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a whole AsyncRLJob manifest in this namespace (its own namespace field is replaced)."""
        body = {**body, "metadata": {**body["metadata"], "namespace": self.ns}}
        return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, body))

    def get(self, name: str = "job1") -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch(self, body: dict[str, Any], name: str = "job1") -> dict[str, Any]:
        return dict(self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name, body))

    def patch_status(self, body: dict[str, Any], name: str = "job1") -> None:
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.ns, PLURAL, name, body)

    def delete(self, name: str = "job1") -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.ns, PLURAL, name)

    def status(self, name: str = "job1") -> dict[str, Any]:
        return (self.get(name) or {}).get("status") or {}

    def phase(self, name: str = "job1") -> str | None:
        return self.status(name).get("phase")

    def condition(self, ctype: str, name: str = "job1") -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == ctype), {})

    def wait_phase(self, phase: str, name: str = "job1", timeout: float = 30.0) -> dict[str, Any]:
        wait_for(lambda: self.phase(name) == phase, timeout=timeout,
                 message=f"{name} phase {phase} (now {self.phase(name)!r}: {self.status(name).get('message')})")
        return self.status(name)

    # -- children
    def pods(self, job: str = "job1") -> dict[str, dict[str, Any]]:
        items = self.core.list_namespaced_pod(self.ns, label_selector=f"{GROUP}/job={job}").items
        return {p.metadata.name: self._plain(p) for p in items}

    def live_pods(self, job: str = "job1") -> dict[str, dict[str, Any]]:
        """Pods not terminating."""
        return {n: p for n, p in self.pods(job).items() if not p["metadata"].get("deletionTimestamp")}

    def wait_pods(self, count: int, job: str = "job1", timeout: float = 30.0) -> dict[str, dict[str, Any]]:
        wait_for(lambda: len(self.live_pods(job)) == count, timeout=timeout,
                 message=f"{count} live pods of {job} (have {sorted(self.live_pods(job))}; "
                         f"status: {self.status(job).get('message')})")
        return self.live_pods(job)

    def events(self, name: str = "job1") -> list[tuple[str, str, str]]:
        """(type, reason, message) of the events about the job, oldest first."""
        items = self.core.list_namespaced_event(self.ns, field_selector=f"involvedObject.name={name}").items
        items.sort(key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp))
        return [(e.type, e.reason, e.message) for e in items]

    def reasons(self, name: str = "job1") -> list[str]:
        return [r for _, r, _ in self.events(name)]

    def wait_reasons(self, *reasons: str, name: str = "job1", timeout: float = 20.0) -> list[str]:
        """Events with these reasons (kopf posts events from a queue: they can trail the status write)."""
        def seen() -> list[str] | None:
            got = self.reasons(name)
            return got if set(reasons) <= set(got) else None

        return list(wait_for(seen, timeout=timeout, message=f"events {reasons} about {name}"))
