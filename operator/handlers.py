"""kopf wiring: every handler is a few lines that call :class:`~asyncrl.operator.reconcile.Reconciler`.

Handlers are registered into a registry built at start-up (:func:`build_registry`), never at
import time, so the resync interval comes from the settings the operator started with. Retry
intent is the exception type: ``TemporaryError(delay=)`` for waits and API failures.
"""

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes.client import ApiException
from prometheus_client import CollectorRegistry, start_http_server

from asyncrl.api.constants import GROUP, PLURAL, VERSION
from asyncrl.operator import names
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.kube import Kube
from asyncrl.operator.metrics import create_metrics
from asyncrl.operator.reconcile import ReconcileError, Reconciler

log = logging.getLogger("asyncrl.operator")
API_RETRY_SECONDS = 5.0


def post_event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    kopf.event(cast(kopf.Body, body), type=type_, reason=reason, message=message[:1000])


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    """kopf's own state lives in annotations under our prefix (the status schema is strict)."""
    settings.persistence.finalizer = names.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.KOPF_PREFIX,
        # the operator's own status copy (status_guard): writing it is no change of the job
        ignored_fields=[("metadata", "annotations", names.ANNOTATION_STATUS)])
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300  # nolar/kopf#698: re-open quiet watches
    settings.watching.client_timeout = 310


def _run(memo: kopf.Memo, namespace: str, name: str) -> None:
    # Short waits (restart backoff, deadlines) are scheduled by the reconciler itself.
    try:
        memo.reconciler.reconcile(namespace, name, children=True)
    except (ReconcileError, ApiException, OSError) as exc:  # the API failed: retry later
        raise kopf.TemporaryError(f"reconcile of {namespace}/{name} failed: {exc}", delay=API_RETRY_SECONDS) from exc


def build_registry(cfg: OperatorSettings, metrics_registry: CollectorRegistry | None = None) -> kopf.OperatorRegistry:
    """All handlers of the operator, bound to ``cfg``."""
    registry = kopf.OperatorRegistry()
    prom = metrics_registry if metrics_registry is not None else CollectorRegistry()
    res: dict[str, Any] = dict(group=GROUP, version=VERSION, plural=PLURAL, registry=registry)
    seen_training: dict[str, Any] = {}

    @kopf.on.startup(registry=registry)
    def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        configure_kopf(settings)
        memo.reconciler = Reconciler(cfg, Kube.from_environment(), create_metrics(prom), post_event)
        if cfg.metrics_port:
            start_http_server(cfg.metrics_port, registry=prom)

    @kopf.on.cleanup(registry=registry)
    def cleanup(memo: kopf.Memo, **_: Any) -> None:
        if hasattr(memo, "reconciler"):
            memo.reconciler.close()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.probe(id="reconciler", registry=registry)
    def alive(memo: kopf.Memo, **_: Any) -> bool:
        return hasattr(memo, "reconciler")

    @kopf.on.resume(**res)
    @kopf.on.create(**res)
    @kopf.on.update(**res)
    def reconcile_job(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
        _run(memo, namespace or "", name)

    @kopf.timer(**res, interval=cfg.resync_seconds, initial_delay=cfg.resync_seconds)
    def resync(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
        _run(memo, namespace or "", name)

    @kopf.on.event(**res)
    def training_reported(body: kopf.Body, name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
        # The driver patched status.training: act on it now (mask guard, sync phase), not at resync.
        training = (body.get("status") or {}).get("training")
        uid = body.metadata.uid or f"{namespace}/{name}"
        if training and seen_training.get(uid) != training and hasattr(memo, "reconciler"):
            seen_training[uid] = training
            try:
                memo.reconciler.reconcile(namespace or "", name, children=False)
            except Exception as exc:  # the resync timer retries
                log.warning("reconcile after a training report of %s/%s failed: %s", namespace, name, exc)

    @kopf.on.event("", "v1", "pods", labels={"app.kubernetes.io/managed-by": names.MANAGED_BY}, registry=registry)
    def pod_changed(body: kopf.Body, labels: Mapping[str, str], namespace: str | None, memo: kopf.Memo,
                    **_: Any) -> None:
        # Every event, DELETED included (its body is the pod's last state: a disruption seen there
        # makes a pod that is already gone count as preempted).
        job = labels.get(names.LABEL_JOB)
        if job and hasattr(memo, "reconciler"):
            try:
                memo.reconciler.pod_event(namespace or "", job, dict(body))
            except Exception as exc:  # the resync timer retries
                log.warning("reconcile after a pod event of %s/%s failed: %s", namespace, job, exc)

    @kopf.on.delete(**res)
    def finalize(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        seen_training.pop(body.metadata.uid or "", None)
        if not memo.reconciler.finalize(dict(body)):
            raise kopf.TemporaryError("pods still terminating", delay=1.0)

    return registry
