"""KMock 0.8 made realistic enough to test the operator: a fake API server in a background thread.

Plain KMock is an in-memory REST + watch server. This layer adds the API-server semantics the
operator relies on (see the testing notes):

- ``metadata.uid``, ``creationTimestamp``, ``generation`` and an increasing ``resourceVersion``;
  ``generateName``; ``generation`` bumps only on a change outside ``metadata``/``status``;
- status subresource isolation: a main-resource write ignores ``status``, a ``/status`` write
  changes only ``status`` (for pods and for CRs declaring the subresource);
- no-op patches change nothing (no new resourceVersion, no watch event), as in a real server;
- ``labelSelector`` on LIST and WATCH (``=``, ``==``, ``!=``, ``in``-less exists / ``!key``);
- the AsyncRLJob is defaulted and validated against the **shipped** CRD (schema + CEL, via
  :mod:`tests.support.crvalidate`) on create and update: 422 ``Invalid`` with the field paths;
  ``status`` is validated and pruned on ``/status`` writes;
- a ``resourceVersion`` precondition in a patch body is honoured (409 on a stale one);
- a watch stream never replays an object older than one it already sent;
- events expire: only the newest ``event_limit`` are kept (a real server drops them after ``--event-ttl``).

Not modelled (real cluster only): RBAC, admission webhooks, ownerReference garbage collection,
graceful pod termination, server-side apply, PUT, watch bookmarks / 410 relists, kubelets.
"""

import asyncio
import collections
import copy
import datetime as dt
import itertools
import json
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Any

import kmock
import yaml
from kmock._internal import dicts as kdicts
from kmock._internal import enums as kenums
from kmock._internal.k8s import KubernetesError

from tests.support.crvalidate import SHIPPED_CRD, CRValidator, prune

POD = kmock.resource("", "v1", "pods")


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_diff(old: Any, new: Any) -> Any:
    """An RFC 7386 merge patch that turns ``old`` into ``new`` (None deletes a key)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {}
    for k in old:
        if k not in new:
            out[k] = None
    for k, v in new.items():
        if k not in old:
            out[k] = v
        elif old[k] != v:
            out[k] = merge_diff(old[k], v) if isinstance(v, dict) and isinstance(old[k], dict) else v
    return out


def matches(selector: str | None, labels: dict[str, str]) -> bool:
    """Equality-based label selector semantics (what list/watch with ``labelSelector`` use)."""
    if not selector:
        return True
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


class Invalid(KubernetesError):
    pass


def _invalid(kind: str, name: str, errors: list[str]) -> KubernetesError:
    causes = [{"reason": "FieldValueInvalid", "message": e, "field": e.split(":", 1)[0]} for e in errors]
    return KubernetesError(status=422, reason="Invalid",
                           message=f'{kind}.asyncrl.io "{name}" is invalid: ' + ", ".join(errors),
                           details={"name": name, "kind": kind, "causes": causes})


class RealisticEmulator(kmock.KubernetesEmulator):
    """KubernetesEmulator plus the API-server semantics listed in the module docstring."""

    def __init__(self, crd: dict[str, Any]) -> None:
        super().__init__()
        with warnings.catch_warnings():  # kmock 0.8 uses importlib.resources.read_binary
            warnings.simplefilter("ignore", DeprecationWarning)
            self.resources.load_bundled()
        self.crd = crd
        names = crd["spec"]["names"]
        self.validator = CRValidator(crd)
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        self.cr = kmock.resource(crd["spec"]["group"], version["name"], names["plural"])
        self.resources[self.cr] = kmock.ResourceInfo(
            kind=names["kind"], singular=names["singular"], namespaced=True,
            verbs={"create", "delete", "get", "list", "patch", "update", "watch"},
            shortnames=set(names.get("shortNames", [])), subresources=set(version.get("subresources") or {}))
        self._rv = itertools.count(1000)
        self._mutex: asyncio.Lock | None = None
        self.bypass_validation = False  # simulates an older CRD in the cluster than the operator's
        self.created_at: dict[tuple[str, str, str], float] = {}  # (plural, ns, name) -> monotonic time
        self.event_limit = 500  # a real server expires events (--event-ttl); keep the newest ones only
        self._events: collections.deque[Any] = collections.deque()
        self._served = 0

    # -- helpers
    def _has_status(self, request: Any) -> bool:
        return request.resource == POD or (request.resource == self.cr and "status" in
                                           self.resources[self.cr].subresources)

    def _current(self, key: Any) -> dict[str, Any] | None:
        if key in self.objects and not self.objects[key].deleted:
            return copy.deepcopy(self.objects[key].raw)
        return None

    def _check_cr(self, obj: dict[str, Any], old: dict[str, Any] | None, status_only: bool = False) -> dict[str, Any]:
        """Default, validate (422 with field paths) and prune a CR. On update, errors already present
        in the old object are tolerated (validation ratcheting, Kubernetes >= 1.30); a ``/status``
        write validates only the status."""
        name = obj.get("metadata", {}).get("name", "")
        if self.bypass_validation:
            return copy.deepcopy(obj)
        defaulted = self.validator.default(obj)
        errors = [] if status_only else self.validator.validate(defaulted, old)
        if old is not None and errors:
            known = set(self.validator.validate(self.validator.default(old), None))
            errors = [e for e in errors if e not in known]
        if obj.get("status"):
            errors += self.validator.validate_status(obj["status"])
        if errors:
            raise _invalid(self.validator.kind, name, errors)
        if defaulted.get("status"):
            prune(self.validator.status_schema, defaulted["status"])
        return defaulted

    def _trim_history(self, keep: int = 10) -> None:
        """KMock logs every request on the server and on each reaction, and its request views scan
        those logs on every request to pick a reaction: a cost that grows with every request
        (quadratic over a benchmark). Keep only the latest few (the one being served is the last);
        these tests assert on objects and events, not on the request log."""
        logs = [self._requests]
        for root in (self, getattr(self, "fallback", None)):
            for payload in getattr(root, "_payloads", []):
                logs.append(getattr(payload, "_requests", []))
        for log in logs:
            if len(log) > 2 * keep:
                del log[:-keep]

    # -- the interceptor
    async def _handle(self, request: Any) -> Any:
        if self._mutex is None:
            self._mutex = asyncio.Lock()
        self._served += 1
        if self._served % 10 == 0:
            self._trim_history()
        if request.resource is not None and request.action == kenums.action.DELETE and request.name is not None:
            async with self._mutex:
                key = (request.resource, request.namespace, request.name)
                old = self._current(key)
                if old is not None and old["metadata"].get("finalizers") and not old["metadata"].get("deletionTimestamp"):
                    # setting deletionTimestamp is a write: a new resourceVersion (KMock keeps the old one)
                    self.objects[key].patch({"metadata": {"resourceVersion": str(next(self._rv))}})
                return await super()._handle(request)
        if request.resource is None or request.action not in (kenums.action.CREATE, kenums.action.UPDATE):
            return await super()._handle(request)
        async with self._mutex:
            try:
                if request.action == kenums.action.CREATE:
                    self._on_create(request)
                elif request.name is not None:
                    early = self._on_update(request)
                    if early is not None:
                        return early
            except KubernetesError as exc:
                return await self._render_error(exc)
            return await super()._handle(request)

    def _on_create(self, request: Any) -> None:
        obj = request.data
        if not isinstance(obj, dict):
            raise KubernetesError(status=400, reason="BadRequest", message="body must be an object")
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if request.namespace and not meta.get("namespace"):
            meta["namespace"] = request.namespace
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1, resourceVersion=str(next(self._rv)))
        self.created_at[(request.resource.plural, meta.get("namespace") or "", meta.get("name") or "")] = \
            time.monotonic()
        if request.resource.plural == "events":
            self._events.append((request.resource, meta.get("namespace"), meta.get("name")))
            while len(self._events) > self.event_limit:
                old_key = self._events.popleft()
                if old_key in self.objects:
                    del self.objects[old_key]
        if request.resource == self.cr:
            obj.pop("status", None)  # the status subresource: create ignores status
            checked = self._check_cr(obj, None)
            obj.clear()
            obj.update(checked)

    def _on_update(self, request: Any) -> Any:
        key = (request.resource, request.namespace, request.name)
        old = self._current(key)
        if old is None:
            return None  # KMock answers 404
        try:
            new = copy.deepcopy(dict(kdicts.patch_dict(old, request.data)))
        except Exception as exc:
            raise KubernetesError(status=422, reason="Invalid", message=f"patch cannot be applied: {exc}") from exc
        wanted_rv = ((request.data or {}).get("metadata") or {}).get("resourceVersion") \
            if isinstance(request.data, dict) else None
        if wanted_rv and wanted_rv != old["metadata"].get("resourceVersion"):
            raise KubernetesError(status=409, reason="Conflict",
                                  message="the object has been modified; please apply your changes to the latest version")
        if self._has_status(request):
            if request.subresource == "status":
                new = {**old, "status": new.get("status")}
                if new["status"] is None:
                    new.pop("status")
            else:
                new = {k: v for k, v in new.items() if k != "status"}
                if "status" in old:
                    new["status"] = old["status"]
        for k in ("uid", "creationTimestamp", "name", "namespace", "resourceVersion", "generation"):
            if k in old["metadata"]:
                new.setdefault("metadata", {})[k] = old["metadata"][k]
        if request.resource == self.cr:
            new = self._check_cr(new, old, status_only=request.subresource == "status")
        spec_changed = {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
            {k: v for k, v in old.items() if k not in ("metadata", "status")}
        if new == old:
            return self._json(old)  # a no-op: no new resourceVersion, no event
        if spec_changed:
            new["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        new["metadata"]["resourceVersion"] = str(next(self._rv))
        object.__setattr__(request, "data", merge_diff(old, new))  # kmock's Request is frozen
        return None

    @staticmethod
    def _json(obj: dict[str, Any]) -> Any:
        import aiohttp.web
        return aiohttp.web.json_response(obj)

    # -- label selectors and list kinds
    async def _serve_list(self, request: Any) -> Any:
        result = await super()._serve_list(request)
        selector = (request.params or {}).get("labelSelector")
        items = [o for o in result["items"] if matches(selector, (o.get("metadata") or {}).get("labels") or {})]
        info = self.resources.get(request.resource) if request.resource is not None else None
        kind = f"{info.kind}List" if info is not None and info.kind else "List"
        rv = str(next(self._rv))
        return {"apiVersion": _api_version(request.resource), "kind": kind,
                "metadata": {"resourceVersion": rv}, "items": items}

    async def _serve_watch(self, request: Any) -> Any:
        # A real watch never goes back in time: KMock may replay an object in its initial burst and
        # again from its event bus; drop anything not newer than what this stream already sent.
        # A watch from the resourceVersion of a LIST starts after that LIST, as in a real server.
        selector = (request.params or {}).get("labelSelector")
        since = int((request.params or {}).get("resourceVersion") or 0)
        sent: dict[str, int] = {}
        async for event in super()._serve_watch(request):
            if not isinstance(event, dict):
                yield event
                continue
            meta = (event.get("object") or {}).get("metadata") or {}
            uid, rv = meta.get("uid") or "", int(meta.get("resourceVersion") or 0)
            if event.get("type") != "DELETED" and (rv <= since or (uid in sent and rv <= sent[uid])):
                continue
            sent[uid] = rv
            if matches(selector, meta.get("labels") or {}):
                yield event


def _api_version(resource: Any) -> str:
    if resource is None or not resource.group:
        return "v1"
    return f"{resource.group}/{resource.version}"


class FakeCluster:
    """The realistic emulator on 127.0.0.1 in a background thread, plus a kubeconfig for it.

    ``with FakeCluster(tmp_path) as cluster:`` then point ``KUBECONFIG`` at ``cluster.kubeconfig``.
    Read objects with :meth:`get`/:meth:`items` (snapshots); write as a client would with
    :meth:`create`, :meth:`patch`, :meth:`delete` (through the HTTP API, so validation applies).
    """

    def __init__(self, workdir: Path, crd_path: Path = SHIPPED_CRD) -> None:
        self.workdir = Path(workdir)
        self.crd = yaml.safe_load(Path(crd_path).read_text())
        self.emulator: RealisticEmulator | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.url = ""
        self.kubeconfig = self.workdir / "kubeconfig"

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with RealisticEmulator(self.crd) as emu, kmock.Server(emu) as server:
            self.emulator = emu
            self.url = f"http://{server.host}:{server.port}"
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> "FakeCluster":
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake API server did not start in 10 s")
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
        }))
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- a tiny synchronous client (urllib: no extra dependency, no shared session)
    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        import urllib.error
        import urllib.request
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, json.loads(err.read() or b"{}")) from None

    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        base = {"asyncrljobs": "/apis/asyncrl.io/v1alpha1", "pods": "/api/v1", "events": "/api/v1",
                "configmaps": "/api/v1", "services": "/api/v1", "serviceaccounts": "/api/v1",
                "roles": "/apis/rbac.authorization.k8s.io/v1",
                "rolebindings": "/apis/rbac.authorization.k8s.io/v1"}[kind]
        out = f"{base}/namespaces/{namespace}/{kind}"
        if name:
            out += f"/{name}"
        if sub:
            out += f"/{sub}"
        return out

    def create(self, kind: str, obj: dict[str, Any]) -> Any:
        return self.request("POST", self.path(kind, obj["metadata"].get("namespace", "default")), obj)

    def patch(self, kind: str, namespace: str, name: str, body: Any, sub: str | None = None) -> Any:
        return self.request("PATCH", self.path(kind, namespace, name, sub), body, "application/merge-patch+json")

    def delete(self, kind: str, namespace: str, name: str) -> Any:
        return self.request("DELETE", self.path(kind, namespace, name))

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.path(kind, namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def items(self, kind: str, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
        path = self.path(kind, namespace)
        if selector:
            import urllib.parse
            path += "?labelSelector=" + urllib.parse.quote(selector)
        return self.request("GET", path)["items"]

    def events(self, namespace: str = "default") -> list[tuple[str, str, str]]:
        return [(e.get("type"), e.get("reason"), e.get("message", "")) for e in self.items("events", namespace)]


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status}: {body.get('message', body)}")
        self.status = status
        self.body = body
