"""Session fixtures shared by every test folder: a real kube-apiserver + etcd, the real operator process.

The server starts once per test session, only when a test asks for it (about 5 s, plus 2 s of
PKI); each test gets a namespace of its own (``e2e-<n>``), because a deleted namespace stays
``Terminating`` forever without a controller-manager. One operator process serves every ``e2e-*``
namespace; a test that needs its own operator (a restart mid-way) starts one for another pattern.
"""

import contextlib
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
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
def apiserver(request: pytest.FixtureRequest) -> Iterator[ApiServer]:
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
        if request.session.testsfailed:  # the server's and etcd's logs are kept for a failed session
            print(f"\nkube-apiserver and etcd logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


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


# --------------------------------------------------------------------------- one Ray for the session
class SharedRay:
    """The one local Ray (2 CPUs) that every in-process job of the session runs on, started when a test
    first asks for it: a Ray start and stop costs 10-25 s on two loaded cores, once per test before.
    A test about Ray itself (auth, leftovers, worker hooks) asks for ``no_shared_ray`` and starts its own;
    the next test that asks for ``ray_session`` starts the shared one again."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self.starts = 0

    @property
    def up(self) -> bool:
        return self._stack is not None

    def ensure(self) -> None:
        if self._stack is not None:
            return
        import ray

        from asyncrl.trainer.driver.hosts.ray_env import local_ray

        if ray.is_initialized():
            raise RuntimeError("a Ray that is not the session's is still running: the test that started it "
                               "must stop it (with local_ray(...) does)")
        stack = contextlib.ExitStack()
        stack.enter_context(local_ray(num_cpus=2))
        self._stack, self.starts = stack, self.starts + 1

    def stop(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


SHARED_RAY = SharedRay()


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    """The session's shared local Ray (module scope, so module-scoped job fixtures can use it)."""
    SHARED_RAY.ensure()
    yield


@pytest.fixture(scope="module")
def no_shared_ray() -> Iterator[None]:
    """For the tests about Ray itself: the shared Ray is stopped, so they start (and stop) their own."""
    SHARED_RAY.stop()
    yield


def alive_actors() -> list[str]:
    """The class names of the shared Ray's live actors (read from its GCS; empty when it is not up)."""
    import ray

    if not SHARED_RAY.up or not ray.is_initialized():
        return []
    return sorted(a.get("ActorClassName", "?") for a in ray._private.state.actors().values()
                  if a.get("State") == "ALIVE")


@pytest.fixture(scope="module", autouse=True)
def no_actor_outlives_its_module() -> Iterator[None]:
    """After a test module, no actor of ours is alive on the shared Ray: a leftover holds CPUs (the next
    job would wait for them) and memory. A killed actor turns DEAD asynchronously, so this waits for the
    event with a deadline that is only a hang guard; survivors are named and the shared Ray restarted."""
    yield
    if not SHARED_RAY.up:
        return
    deadline = time.monotonic() + 60.0
    while (left := alive_actors()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if left:
        SHARED_RAY.stop()  # its shutdown ends them: the next module gets a clean Ray
        pytest.fail(f"actors left alive on the shared Ray after this module: {left}; kill them in the "
                    "test (or let the job's own shutdown do it)", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran the operator shows the operator's last log lines (what it saw and did)."""
    outcome = yield
    report = outcome.get_result()
    op = getattr(item, "funcargs", {}).get("operator_process")
    if report.failed and isinstance(op, OperatorProcess):
        report.sections.append(("operator log (last 60 lines)", op.log(60)))


# --------------------------------------------------------------------------- test durations
# ASYNCRL_DURATIONS=<file.json> records every test's seconds (setup + call + teardown) of this session, so a
# suite's budget is read from data (CONTRIBUTING.md; `python tests/support/durations.py` prints the slowest).
_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    SHARED_RAY.stop()
    target = os.environ.get("ASYNCRL_DURATIONS")
    if target and _durations:
        record = {"exitstatus": int(exitstatus), "tests": len(_durations),
                  "seconds": round(sum(_durations.values()), 2), "shared_ray_starts": SHARED_RAY.starts,
                  "load_avg": [round(x, 2) for x in os.getloadavg()],
                  "durations": {k: round(v, 3) for k, v in sorted(_durations.items())}}
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(record, indent=1) + "\n")
