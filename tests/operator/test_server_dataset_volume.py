"""On the real API server, pods created by the real operator: the driver pod mounts the dataset's volume,
and the ``<job>-status`` token is in its status sidecar only, never in a container that runs user code.

Before: the driver pod set ``automountServiceAccountToken: true``; the ServiceAccount admission plugin
added a ``kube-api-access-*`` volume and mounted it in the driver container, the one that imports the
task; and the driver pod had none of the template's volumes, so a dataset on one was "no such file".
"""

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api import constants as C
from asyncrl.api.status import TrainingSummary, training_patch
from tests.support.apiserver import ApiServer
from tests.support.jobs import Jobs, wait_for

DATA = {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}}
TASK = {"dataset": {"path": "/data/math/train.jsonl"}, "reward": "my_reward:score"}
TEMPLATE = {"volumes": [DATA, {"name": "scratch", "emptyDir": {}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "scratch", "mountPath": "/scratch"}]}


def token_volumes(spec: dict[str, Any]) -> set[str]:
    """The pod's volumes that hold a ServiceAccount token (ours, or one the admission plugin added)."""
    return {v["name"] for v in spec["volumes"]
            if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources") or [])}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or []}


def test_the_driver_pod_mounts_the_dataset_volume_and_its_token_only_in_the_sidecar(jobs: Jobs) -> None:
    jobs.create(task=TASK, rollout={"replicas": 1, "template": TEMPLATE})
    pods = jobs.wait_pods(3)  # driver, one rollout, one actor: admitted under the restricted level
    spec = pods["job1-driver-0"]["spec"]
    (driver,) = spec["containers"]
    (sidecar,) = spec["initContainers"]
    # the dataset's volume and mount, read-only; the rollout's scratch space is not the task's
    assert mounts(driver)["data"] == {"name": "data", "mountPath": "/data", "readOnly": True}
    assert next(v for v in spec["volumes"] if v["name"] == "data")["persistentVolumeClaim"] == DATA[
        "persistentVolumeClaim"]
    assert "scratch" not in mounts(driver)
    # the token: the sidecar's volume, and nothing the admission plugin added (no kube-api-access-*)
    assert spec["automountServiceAccountToken"] is False and spec["serviceAccountName"] == "job1-status"
    assert token_volumes(spec) == {"status-token"}
    assert not token_volumes(spec) & set(mounts(driver))
    assert not [m for m in driver["volumeMounts"] if m["mountPath"].startswith("/var/run/secrets")]
    assert sidecar["name"] == "status" and sidecar["restartPolicy"] == "Always"  # kept: a native sidecar
    assert mounts(sidecar)["status-token"]["mountPath"] == C.SERVICE_ACCOUNT_DIR
    assert {e["name"] for e in sidecar["env"]} == {C.ENV_JOB_NAME, C.ENV_JOB_NAMESPACE}
    for name in ("job1-rollout-0", "job1-actor-0"):  # the other pods hold no token at all
        assert not token_volumes(pods[name]["spec"]), name


def test_the_relay_sends_the_summary_with_the_status_token_and_nothing_else(
        apiserver: ApiServer, jobs: Jobs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from asyncrl.trainer.driver.status.api import kubernetes_sender
    from asyncrl.trainer.driver.status.relay import register_driver
    from asyncrl.trainer.driver.status.relay_server import serve_in_thread

    jobs.create()
    wait_for(lambda: apiserver.kubectl("get", "rolebinding", "job1-status", "-n", jobs.ns,
                                       check=False).returncode == 0, message="the driver's RoleBinding")
    # the sidecar's identity: a token of job1-status, as the projected volume holds it
    monkeypatch.setenv("KUBECONFIG", str(apiserver.token_kubeconfig(jobs.ns, "job1-status")))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "status.sock"
    server, thread = serve_in_thread(path, kubernetes_sender("job1", jobs.ns))
    try:
        send = register_driver(path)
        send(training_patch(TrainingSummary(policy_version=5, keep_ratio=0.5)))
        wait_for(lambda: jobs.status().get("training", {}).get("policyVersion") == 5, message="the report landed")
        assert jobs.status()["training"]["keepPercent"] == 50.0
        # what the token itself may do (patch any status field) the relay does not pass on, not even for the
        # registered driver; and another process (no driver token) is refused before its summary is read
        from asyncrl.trainer.driver.status.relay import RelayError

        with pytest.raises(RelayError) as err:
            send({"status": {"training": {"policyVersion": 6}, "phase": "Succeeded"}})
        assert err.value.status == 400, err.value.reason
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.connect(str(path))
            conn.sendall(json.dumps({"status": {"training": {"policyVersion": 999}}}).encode() + b"\n")
            answer = json.loads(conn.makefile("rb").readline())
        assert answer["ok"] is False and answer["status"] == 401, answer
        assert jobs.status()["training"]["policyVersion"] == 5 and jobs.phase() != "Succeeded"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
