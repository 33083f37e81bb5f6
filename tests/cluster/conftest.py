"""The ``cluster`` tests' session fixture: one real one-node Kubernetes for the whole run (tests/support/cluster.py).

It starts when the first ``cluster`` test asks for it and is torn down at the end of the session, which then
checks that nothing is left behind (a leftover fails the run). Without the binaries or images the fixture
fails with the command that builds them: these tests never skip. ``ASYNCRL_CLUSTER_REUSE=1`` runs them on
the cluster ``make cluster-up`` started and leaves it up (for working on a test).
"""

import os
from collections.abc import Iterator

import pytest

from tests.support import cluster_prometheus
from tests.support.cluster import (
    OPERATOR_NAMESPACE,
    RELEASE,
    ROOT,
    RUN_DIR,
    Cluster,
    attach,
    down,
    leftovers,
    up,
)
from tests.support.cluster_jobs import close_all


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("ASYNCRL_CLUSTER_REUSE"):  # a cluster from `make cluster-up`, left up afterwards
        yield attach()
        return
    started = up()
    try:
        yield started
    finally:
        log = down()
        left = leftovers()
        assert not left, f"the cluster's teardown left: {left}\n{log}"





@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> str:
    """The chart installed for real with helm: the operator runs as a pod from its image (built here from
    docker/operator.Dockerfile), under the chart's ServiceAccount and RBAC. Images are imported, never pulled
    (pullPolicy Never). Returns the operator's namespace."""
    cluster.namespace(OPERATOR_NAMESPACE)
    cluster.helm("upgrade", "--install", RELEASE, str(ROOT / "charts" / "asyncrl"), "-n", OPERATOR_NAMESPACE,
                 "--set", "image.pullPolicy=Never", "--set", "jobImage.pullPolicy=Never",
                 "--wait", "--timeout", "5m")
    cluster.wait("deployment", f"{RELEASE}-operator", "condition=Available", OPERATOR_NAMESPACE, timeout=300)
    return OPERATOR_NAMESPACE


@pytest.fixture(autouse=True)
def _watches_end_with_their_test() -> Iterator[None]:
    """Every job record's watch threads stop when its test ends (tests/support/cluster_jobs.py)."""
    yield
    close_all()


@pytest.fixture(scope="session")
def prometheus(cluster: Cluster, operator: str) -> Iterator[cluster_prometheus.Prometheus]:
    """The host's Prometheus, scraping the cluster as the chart's PodMonitor and ServiceMonitor declare and
    evaluating the chart's PrometheusRule (tests/support/cluster_prometheus.py)."""
    prom = cluster_prometheus.start(cluster, RELEASE, operator, RUN_DIR / "prometheus")
    try:
        yield prom
    finally:
        prom.stop()
