"""Fixtures: a realistic fake API server and the real operator (kopf) running against it."""

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))

from tests.support.fakeapi import FakeCluster  # noqa: E402

logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def job_manifest(name: str = "job1", **spec: Any) -> dict[str, Any]:
    """A small valid AsyncRLJob (CPU pods) with ``spec`` sections merged over it."""
    base: dict[str, Any] = {
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"rollout": {"replicas": 2, "gpusPerReplica": 0},
                 "actor": {"replicas": 1, "gpusPerReplica": 0},
                 "runPolicy": {"backoffLimit": 2}},
    }
    for key, value in spec.items():
        if isinstance(value, dict):
            base["spec"].setdefault(key, {}).update(value)
        else:
            base["spec"][key] = value
    return base


def wait_for(what: Callable[[], Any], timeout: float = 10.0, interval: float = 0.05, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = what()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message or what}; last value: {last!r}")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCluster]:
    with FakeCluster(tmp_path) as c:
        monkeypatch.setenv("KUBECONFIG", str(c.kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        yield c


@pytest.fixture
def operator_factory(cluster: FakeCluster) -> Iterator[Callable[..., Any]]:
    """Start the operator (``with operator_factory(): ...``) with fast timings for tests."""
    from kopf.testing import KopfRunner
    from prometheus_client import CollectorRegistry

    from asyncrl.operator.config import OperatorSettings
    from asyncrl.operator.handlers import build_registry

    @contextlib.contextmanager
    def start(**overrides: Any) -> Iterator[Any]:
        cfg = OperatorSettings(**{"resync_seconds": 0.5, "restart_backoff_seconds": 0.2,
                                  "finalizer_timeout_seconds": 5.0, "metrics_port": 0, **overrides})
        prom = CollectorRegistry()
        registry = build_registry(cfg, prom)
        with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry, timeout=30) as runner:
            runner.metrics = prom
            yield runner

    yield start


@pytest.fixture
def operator(operator_factory: Callable[..., Any]) -> Iterator[Any]:
    with operator_factory() as runner:
        yield runner


def load_yaml(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]
