"""Fixtures: a realistic fake API server and the real operator (kopf) running against it."""

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))

from tests.support.fakeapi import FakeCluster  # noqa: E402
from tests.support.helpers import job_manifest, wait_for  # noqa: E402,F401  (re-exported)

logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


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
