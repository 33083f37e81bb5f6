"""The generated CRD's status schema and printer columns on the real API server: the interrupt-sync phase
the driver reports and the operator surfaces (``status.syncPhase``, the ``SyncStuck`` condition) is stored
as written and shown in the ``Sync`` column of ``kubectl get -o wide``; a phase name outside
:class:`~asyncrl.api.status.SyncPhase` is refused."""

from typing import Any

import pytest
from kubernetes.client import ApiException

from asyncrl.api.status import SyncPhase
from tests.support.jobs import Jobs


def test_sync_phase_round_trips_and_shows_in_the_sync_column(apiserver: Any) -> None:
    ns = apiserver.namespace("crd-columns")  # not an e2e-* namespace: no operator writes here
    kube = apiserver.api_client()
    jobs = Jobs(kube, ns)
    jobs.create("job1", correction={"reference": "exact"}, oldLogits={"strategy": "interruptSync"})
    stuck = {"type": "SyncStuck", "status": "True", "reason": "SyncPhaseTimeout",
             "message": "interrupt-sync phase Score running since 2026-01-01T11:50:00Z: 600 s > phaseTimeoutSeconds 300",
             "lastTransitionTime": "2026-01-01T12:00:00Z", "observedGeneration": 1}
    jobs.patch_status({"status": {
        "phase": "Running",
        "syncPhase": {"phase": "Score", "since": "2026-01-01T11:50:00Z", "timedOut": True},
        "conditions": [stuck],
        "training": {"policyVersion": 3, "syncPhase": "Score", "syncPhaseSince": "2026-01-01T11:50:00Z"},
    }})
    status = jobs.status()
    assert status["syncPhase"] == {"phase": "Score", "since": "2026-01-01T11:50:00Z", "timedOut": True}
    assert jobs.condition("SyncStuck") == stuck
    assert status["training"]["syncPhase"] == "Score"

    out = apiserver.kubectl("get", "asyncrljob", "job1", "-n", ns, "-o", "wide").stdout.splitlines()
    start = out[0].index("SYNC")  # columns are aligned: the value sits under its header
    assert out[1][start:].split()[0] == "Score", out
    assert "SYNC" not in apiserver.kubectl("get", "asyncrljob", "job1", "-n", ns).stdout  # -o wide only

    for phase in SyncPhase:  # every phase the driver may report is accepted
        jobs.patch_status({"status": {"training": {"policyVersion": 3, "syncPhase": phase.value}}})
    with pytest.raises(ApiException) as err:  # a phase name from before the rename is refused
        jobs.patch_status({"status": {"training": {"policyVersion": 3, "syncPhase": "OldLogits"}}})
    assert err.value.status == 422 and "status.training.syncPhase" in err.value.body
    kube.close()
