"""Session fixtures shared by every test folder: a real kube-apiserver + etcd, the real operator process.

The server starts once per test session, only when a test asks for it (about 5 s, plus 2 s of
PKI); each test gets a namespace of its own (``e2e-<n>``), because a deleted namespace stays
``Terminating`` forever without a controller-manager. One operator process serves every ``e2e-*``
namespace; a test that needs its own operator (a restart mid-way) starts one for another pattern.
"""

import itertools
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))

from tests.support.apiserver import ApiServer, ToolMissing, find_tools  # noqa: E402
from tests.support.helpers import wait_for  # noqa: E402
from tests.support.kubelet import Kubelet  # noqa: E402
from tests.support.operator_proc import OperatorProcess  # noqa: E402

_ns_counter = itertools.count(1)


@pytest.fixture(scope="session")
def apiserver() -> Iterator[ApiServer]:
    try:
        tools = find_tools()
    except ToolMissing as exc:
        pytest.fail(str(exc), pytrace=False)  # never a skip: `make tools` installs every one of them
    # a short path: unix sockets and the server's own paths stay short
    workdir = Path(tempfile.mkdtemp(prefix="arl-k8s-"))
    server = ApiServer(workdir, tools)
    server.start()
    try:
        crd_seconds = server.install_crd()
        server.install_third_party_crds()
        print(f"\nreal kube-apiserver on {server.url}: started in {server.start_seconds:.1f} s, "
              f"CRD Established in {crd_seconds:.1f} s ({workdir})")
        yield server
    finally:
        server.stop()


@pytest.fixture
def namespace(apiserver: ApiServer) -> Iterator[str]:
    """A fresh namespace that enforces the ``restricted`` Pod Security level; the AsyncRLJobs a test
    leaves in it are removed afterwards (finalizers dropped: no kubelet finishes their pods), so the
    session's one operator does not keep a resync timer per finished test's job and fall behind on the
    pod events of later tests."""
    ns = apiserver.namespace(f"e2e-{next(_ns_counter)}")
    yield ns
    _remove_jobs(apiserver, ns)


def _remove_jobs(apiserver: ApiServer, namespace: str) -> None:
    from kubernetes.client import CustomObjectsApi
    from kubernetes.client.exceptions import ApiException

    from asyncrl.api.constants import GROUP, PLURAL, VERSION

    client = apiserver.api_client()
    try:
        api = CustomObjectsApi(client)
        for job in api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
            name = job["metadata"]["name"]
            try:
                # delete first: an object being deleted gets no new finalizer (the operator adds its own to
                # any job without one), then drop the finalizers so nothing waits for a kubelet
                api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
                api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name,
                                                   {"metadata": {"finalizers": None}})
            except ApiException as exc:
                if exc.status != 404:  # already gone (the test or the operator removed it)
                    raise
        wait_for(lambda: not api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"],
                 timeout=10.0, message=f"the AsyncRLJobs of {namespace} to be gone")
    finally:
        client.close()


@pytest.fixture(scope="session")
def operator_process(apiserver: ApiServer) -> Iterator[OperatorProcess]:
    """The real operator under the chart's ClusterRole, watching every ``e2e-*`` namespace."""
    op = OperatorProcess(apiserver, ["e2e-*"])
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def kube(apiserver: ApiServer) -> Any:
    """An admin ``kubernetes.client.ApiClient`` for the test's own reads and writes."""
    client = apiserver.api_client()
    yield client
    client.close()


@pytest.fixture
def kubelet(kube: Any, namespace: str) -> Kubelet:
    return Kubelet(kube, namespace)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran the operator shows the operator's last log lines (what it saw and did)."""
    outcome = yield
    report = outcome.get_result()
    op = getattr(item, "funcargs", {}).get("operator_process")
    if report.failed and isinstance(op, OperatorProcess):
        report.sections.append(("operator log (last 60 lines)", op.log(60)))
