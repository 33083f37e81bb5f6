"""Security on the real API server with the real operator: pod hardening that a job file cannot switch off,
the cluster admin's opt-in, and status fields a driver token cannot steer."""

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiException, CustomObjectsApi

from asyncrl.api.constants import GROUP, PLURAL, VERSION
from tests.support.apiserver import ApiServer
from tests.support.jobs import Jobs, wait_for
from tests.support.kubelet import Kubelet
from tests.support.operator_proc import OperatorProcess

# The rollout template asks for the privileged level: the CRD lets it through, the operator decides.
PRIVILEGED_ROLLOUT = {"replicas": 1, "gpusPerReplica": 0, "template": {
    "podSecurityLevel": "privileged",
    "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    "volumeMounts": [{"name": "root", "mountPath": "/host"}],
}}


# What the admin's opt-in is shown with: this test API server runs without --allow-privileged (no kubelet
# could run such a pod), so `privileged: true` itself is "disallowed by cluster policy" here; a node's root
# and SYS_ADMIN are what the restricted level forbids and the server still admits.
HOST_ROOT_ROLLOUT = {"replicas": 1, "gpusPerReplica": 0, "template": {
    "podSecurityLevel": "privileged",
    "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}, "runAsUser": 0, "runAsNonRoot": False},
    "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    "volumeMounts": [{"name": "root", "mountPath": "/host"}],
}}


def _drop_jobs(kube: Any, namespace: str) -> None:
    api = CustomObjectsApi(kube)
    for job in api.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]:
        name = job["metadata"]["name"]
        api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        try:
            api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"finalizers": None}})
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_privileged_template_outside_the_admins_namespaces_creates_nothing(jobs: Jobs) -> None:
    # The session operator lists no privileged namespace (the chart's default).
    jobs.create(rollout=PRIVILEGED_ROLLOUT)
    st = jobs.wait_phase("ValidationFailed")
    assert "spec.rollout.template.podSecurityLevel: podSecurityLevel privileged is not allowed in namespace" \
        in st["message"] and "podSecurity.privilegedNamespaces (now: none)" in st["message"]
    assert jobs.condition("SpecValid")["status"] == "False"
    wait_for(lambda: "ValidationFailed" in jobs.reasons(), message="the ValidationFailed event")
    core = jobs.core
    assert jobs.pods() == {}
    assert not core.list_namespaced_config_map(jobs.ns, label_selector="asyncrl.io/job=job1").items
    assert not core.list_namespaced_service(jobs.ns, label_selector="asyncrl.io/job=job1").items


@pytest.fixture(scope="module")
def admin_opted_in(apiserver: ApiServer) -> Iterator[tuple[str, str, OperatorProcess]]:
    """An operator whose admin lists namespace ``sec-allowed`` (no Pod Security enforcement there, so the
    opt-in is all that stands between the job and its pods) and watches ``sec-denied`` too."""
    allowed, denied = apiserver.namespace("sec-allowed", pod_security=None), apiserver.namespace(
        "sec-denied", pod_security=None)
    op = OperatorProcess(apiserver, ["sec-*"], settings={"ASYNCRL_OPERATOR_PRIVILEGED_NAMESPACES": '["sec-allowed"]'})
    op.start()
    try:
        yield allowed, denied, op
    finally:
        client = apiserver.api_client()
        try:
            for ns in (allowed, denied):
                _drop_jobs(client, ns)
        finally:
            client.close()
            op.stop()


@pytest.mark.slow  # its own operator process: ~17 s to start on the shared cores
def test_the_admins_opt_in_admits_a_privileged_template_only_in_its_namespace(
        admin_opted_in: tuple[str, str, OperatorProcess], kube: Any) -> None:
    allowed, denied, op = admin_opted_in
    there, elsewhere = Jobs(kube, allowed), Jobs(kube, denied)
    there.create(rollout=HOST_ROOT_ROLLOUT)
    elsewhere.create(rollout=HOST_ROOT_ROLLOUT)
    try:
        pods = there.wait_pods(3)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\noperator log:\n{op.log(40)}") from None
    rollout = pods["job1-rollout-0"]["spec"]
    sc = rollout["containers"][0]["securityContext"]
    assert sc["capabilities"] == {"add": ["SYS_ADMIN"], "drop": ["ALL"]} and sc["runAsUser"] == 0
    assert "allowPrivilegeEscalation" not in sc  # SYS_ADMIN needs it (Kubernetes refuses false with it)
    assert {"name": "root", "hostPath": {"path": "/", "type": ""}} in rollout["volumes"]
    driver = pods["job1-driver-0"]["spec"]["containers"][0]["securityContext"]  # the actor's template: restricted
    assert driver["allowPrivilegeEscalation"] is False and driver["capabilities"] == {"drop": ["ALL"]}
    st = elsewhere.wait_phase("ValidationFailed")  # same operator, same job, a namespace it was not given
    assert f"not allowed in namespace '{denied}'" in st["message"] and "(now: sec-allowed)" in st["message"]
    assert elsewhere.pods() == {}


def test_a_driver_token_patch_of_operator_fields_changes_no_decision(
        apiserver: ApiServer, jobs: Jobs, kubelet: Kubelet) -> None:
    jobs.create()  # backoffLimit 2
    pods = jobs.wait_pods(4)
    for name in pods:
        kubelet.run(name)
    jobs.wait_phase("Running")
    started = jobs.status()["startTime"]
    wait_for(lambda: apiserver.kubectl("get", "rolebinding", "job1-status", "-n", jobs.ns, check=False).returncode
             == 0, message="driver RoleBinding")
    as_driver = apiserver.api_client(apiserver.token_kubeconfig(jobs.ns, "job1-status"))
    try:
        driver = CustomObjectsApi(as_driver)
        # what code inside the job can do with the driver's token: patch the whole status
        driver.patch_namespaced_custom_object_status(GROUP, VERSION, jobs.ns, PLURAL, "job1", {"status": {
            "restarts": 2, "startTime": "2000-01-01T00:00:00Z", "training": {"policyVersion": 1}}})
        # ... but not the operator's own copy on the job object
        with pytest.raises(ApiException) as err:
            driver.patch_namespaced_custom_object(GROUP, VERSION, jobs.ns, PLURAL, "job1", {"metadata": {
                "annotations": {"asyncrl.io/operator-status": "{}"}}})
        assert err.value.status == 403
    finally:
        as_driver.close()
    wait_for(lambda: jobs.status().get("restarts") == 0 and jobs.status().get("startTime") == started,
             message="the operator's restarts and startTime restored")
    assert jobs.status()["training"]["policyVersion"] == 1  # the driver's own field is kept
    wait_for(lambda: "StatusOverwritten" in jobs.reasons(), message="the StatusOverwritten event")
    # the decision after a real failure counts from the operator's record: restart 1 of 2, not Failed
    kubelet.terminate("job1-driver-0", exit_code=1)
    wait_for(lambda: jobs.status().get("restarts") == 1, message="restart 1")
    assert jobs.phase() in ("Restarting", "Pending", "Initializing")
