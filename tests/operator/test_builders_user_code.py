"""The driver pod keeps user code away from the status token, and mounts the volumes its task names.

Before: the driver pod set ``automountServiceAccountToken: true``, so the ServiceAccount admission put
the ``<job>-status`` token into the one container that imports the task's code; and it mounted none of
the template's volumes, so a dataset on a volume was "no such file" there. Now the token is a projected
volume of the ``status`` sidecar alone, and the rollout template's mounts that hold a task path reach
the driver container read-only. On the real API server: ``tests/operator/test_server_dataset_volume.py``.
"""

from typing import Any

import kubernetes_validate
import pytest

from asyncrl.api import constants as C
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.validation import SpecError, validate_job
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.driver_pod import task_paths
from asyncrl.trainer.cli.commands import build_parser

REF = JobRef("j", "ns", "uid-1")
CFG = OperatorSettings(job_image="img:1")
DATASET_TASK = {"dataset": {"path": "/data/prompts/train.jsonl"}, "reward": "my_reward:score",
                "pythonPath": ["/opt/code"], "args": {}}
ROLLOUT_TEMPLATE = {
    "volumes": [
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}},
        {"name": "code", "configMap": {"name": "reward-code"}},
        {"name": "cache", "emptyDir": {}},
        {"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"path": "t", "audience": "s3"}}]}},
    ],
    "volumeMounts": [
        {"name": "data", "mountPath": "/data", "subPath": "v2"},
        {"name": "code", "mountPath": "/opt/code"},
        {"name": "cache", "mountPath": "/cache"},
        {"name": "tok", "mountPath": "/tok"},
    ],
}


def pods(**sections: Any) -> dict[str, dict[str, Any]]:
    spec = AsyncRLJobSpec.model_validate(sections)
    return {name: slot.manifest for name, slot in desired(REF, spec, CFG, 0, ray_token="t").pods.items()}


def driver(**sections: Any) -> dict[str, Any]:
    return pods(**sections)["j-driver-0"]["spec"]


def token_volumes(spec: dict[str, Any]) -> set[str]:
    """Names of the pod's volumes that project a ServiceAccount token."""
    return {v["name"] for v in spec["volumes"]
            if any("serviceAccountToken" in s for s in (v.get("projected") or {}).get("sources", []))}


def test_no_pod_automounts_a_token_and_only_the_sidecar_mounts_the_drivers() -> None:
    all_pods = pods(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE}, task=DATASET_TASK)
    for name, pod in all_pods.items():
        assert pod["spec"]["automountServiceAccountToken"] is False, name  # the admission plugin injects nothing
    spec = all_pods["j-driver-0"]["spec"]
    assert spec["serviceAccountName"] == "j-status"
    assert token_volumes(spec) == {"status-token"}  # "tok" of the rollout template is not copied (below)
    (sidecar,) = spec["initContainers"]
    main = spec["containers"][0]
    mounting = {c["name"] for c in [sidecar, main] for m in c["volumeMounts"] if m["name"] in token_volumes(spec)}
    assert mounting == {"status"}
    assert {"name": "status-token", "mountPath": C.SERVICE_ACCOUNT_DIR, "readOnly": True} in sidecar["volumeMounts"]
    assert not [m for m in main["volumeMounts"] if m["mountPath"].startswith("/var/run/secrets")]


def test_the_sidecar_is_a_native_sidecar_that_runs_only_the_relay() -> None:
    actor_template = {"env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}]}
    spec = driver(actor={"replicas": 1, "template": actor_template})
    (sidecar,) = spec["initContainers"]
    main = spec["containers"][0]
    assert sidecar["name"] == "status" and sidecar["restartPolicy"] == "Always"  # up before, stopped after the driver
    args = build_parser().parse_args(sidecar["command"][1:])
    assert sidecar["command"][0] == "asyncrl" and args.func.__name__ == "_cmd_status_relay"
    assert args.socket == C.STATUS_RELAY_SOCKET
    # the job's identity and nothing else: no Ray token, no template env, no API address of its own
    assert {e["name"]: e["value"] for e in sidecar["env"]} == {C.ENV_JOB_NAME: "j", C.ENV_JOB_NAMESPACE: "ns"}
    assert sidecar["securityContext"] == {**main["securityContext"], "readOnlyRootFilesystem": True}
    assert sidecar["image"] == main["image"]
    # the driver finds the relay's socket on a folder both containers mount
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env[C.ENV_STATUS_RELAY] == C.STATUS_RELAY_SOCKET
    for c in (sidecar, main):
        assert {"name": "status-relay", "mountPath": C.STATUS_RELAY_DIR} in c["volumeMounts"], c["name"]
    relay = next(v for v in spec["volumes"] if v["name"] == "status-relay")
    assert relay["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    token = next(v for v in spec["volumes"] if v["name"] == "status-token")["projected"]["sources"]
    # what Kubernetes' kube-api-access volume holds: the token, the cluster's CA, the namespace
    assert [sorted(s) for s in token] == [["serviceAccountToken"], ["configMap"], ["downwardAPI"]]


def test_the_driver_pod_is_a_valid_kubernetes_pod() -> None:
    for pod in pods(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE}, task=DATASET_TASK).values():
        kubernetes_validate.validate(pod, "1.33", strict=True)  # raises with the field path


def test_task_paths() -> None:
    spec = AsyncRLJobSpec.model_validate({"task": {
        "environment": "envs:Maze", "pythonPath": ["/opt/code", "relative/dir"],
        "args": {"maps": "/data/maps.json", "n": 3, "more": [{"f": "/mnt/x"}, "not-a-path"]}}})
    assert task_paths(spec) == ["/opt/code", "/data/maps.json", "/mnt/x"]


def test_the_driver_mounts_the_rollout_mounts_that_hold_a_task_path_read_only() -> None:
    spec = driver(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE}, task=DATASET_TASK)
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    # the dataset (/data/prompts/train.jsonl) and pythonPath (/opt/code); not /cache (no task path), not /tok
    assert mounts["data"] == {"name": "data", "mountPath": "/data", "subPath": "v2", "readOnly": True}
    assert mounts["code"] == {"name": "code", "mountPath": "/opt/code", "readOnly": True}
    assert "cache" not in mounts and "tok" not in mounts
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}
    assert volumes["code"] == {"name": "code", "configMap": {"name": "reward-code"}}
    assert "cache" not in volumes and "tok" not in volumes
    # the rollout pods keep their own mounts as written
    rollout = pods(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE}, task=DATASET_TASK)["j-rollout-0"]
    assert {"name": "data", "mountPath": "/data", "subPath": "v2", "readOnly": False} in rollout["spec"]["containers"][0][
        "volumeMounts"]


def test_an_environment_arg_on_a_volume_is_mounted_and_a_path_elsewhere_is_not() -> None:
    task = {"environment": "envs:Maze", "args": {"maps": "/cache/maps.json"}}
    mounts = {m["name"] for m in driver(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE},
                                        task=task)["containers"][0]["volumeMounts"]}
    assert "cache" in mounts and "data" not in mounts
    # /database is not below /data: a prefix of the string is not a folder above the path
    task = {"dataset": {"path": "/database/train.jsonl"}, "reward": "my_reward:score"}
    mounts = {m["name"] for m in driver(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE},
                                        task=task)["containers"][0]["volumeMounts"]}
    assert mounts == {"spec", "dshm", "status-relay"}


def test_a_job_without_task_paths_mounts_no_template_volume_on_the_driver() -> None:
    spec = driver(rollout={"replicas": 1, "template": ROLLOUT_TEMPLATE})  # the built-in task
    assert {m["name"] for m in spec["containers"][0]["volumeMounts"]} == {"spec", "dshm", "status-relay"}
    assert {v["name"] for v in spec["volumes"]} == {"spec", "dshm", "status-relay", "status-token"}


@pytest.mark.parametrize("template, field", [
    ({"volumes": [{"name": "status-token", "emptyDir": {}}]}, "status-token"),
    ({"volumes": [{"name": "status-relay", "emptyDir": {}}]}, "status-relay"),
    ({"volumes": [{"name": "d", "emptyDir": {}}],
      "volumeMounts": [{"name": "d", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]},
     "/var/run/secrets/kubernetes.io/serviceaccount"),
    ({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/var/run/asyncrl/x"}]},
     "/var/run/asyncrl/x"),
])
def test_the_sidecars_volumes_and_paths_are_reserved(template: dict[str, Any], field: str) -> None:
    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "j"},
           "spec": {"rollout": {"template": template}}}
    with pytest.raises(SpecError) as err:
        validate_job(doc, "job.yaml")
    (found,) = err.value.problems
    problem = str(found)
    assert "spec.rollout.template" in problem and field in problem and "the operator's own" in problem, problem
