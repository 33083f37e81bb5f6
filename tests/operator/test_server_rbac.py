"""RBAC on the real API server: the driver's Role reaches its own job's status and nothing else; the
operator's chart ClusterRole is enough for the operator and not more than it needs."""

from pathlib import Path

import pytest
from kubernetes.client import ApiException

from asyncrl.api.status import TrainingSummary, training_patch
from tests.support.apiserver import ApiServer
from tests.support.jobs import Jobs, wait_for
from tests.support.operator_proc import OPERATOR_NAMESPACE, RELEASE, OperatorProcess
from tests.support.step_reports import step_report


def driver_identity(apiserver: ApiServer, jobs: Jobs, job: str) -> Path:
    """The credentials the operator gives the driver pod: a token of ServiceAccount ``<job>-status``."""
    wait_for(lambda: jobs.core.list_namespaced_service_account(
        jobs.ns, field_selector=f"metadata.name={job}-status").items, message="driver ServiceAccount")
    wait_for(lambda: apiserver.kubectl("get", "rolebinding", f"{job}-status", "-n", jobs.ns, check=False).returncode == 0,
             message="driver RoleBinding")
    return apiserver.token_kubeconfig(jobs.ns, f"{job}-status")


def test_driver_role_patches_only_its_own_jobs_status(apiserver: ApiServer, jobs: Jobs,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.trainer.driver.status.reporter import StatusReporter, kubernetes_sender

    jobs.create("job1")
    jobs.create("job2")
    kubeconfig = driver_identity(apiserver, jobs, "job1")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    # the driver's real reporter, with the driver's real credentials
    reporter = StatusReporter(kubernetes_sender("job1", jobs.ns))
    reporter(step_report(7, valid=100.0, keep=0.93, staleness=2))  # an applied step's report
    assert reporter.flush() and reporter.failures == 0
    wait_for(lambda: jobs.status("job1").get("training", {}).get("policyVersion") == 7, message="report landed")
    assert jobs.status("job1")["training"]["keepPercent"] == 93.0

    other = kubernetes_sender("job2", jobs.ns)
    with pytest.raises(ApiException) as err:
        other(training_patch(TrainingSummary(policy_version=1)))
    assert err.value.status == 403 and "asyncrljobs/status" in err.value.body

    as_driver = apiserver.api_client(kubeconfig)
    driver_jobs = Jobs(as_driver, jobs.ns)
    with pytest.raises(ApiException) as err:  # the spec is not the driver's to change
        driver_jobs.patch({"spec": {"train": {"steps": 1}}}, "job1")
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:  # nor are the pods, secrets or other jobs
        driver_jobs.pods("job1")
    assert err.value.status == 403
    for verb, what in (("get", "secrets"), ("list", "asyncrljobs"), ("delete", "asyncrljobs/job1"),
                       ("create", "pods")):
        out = apiserver.kubectl("auth", "can-i", verb, what, "-n", jobs.ns, kubeconfig=kubeconfig, check=False)
        assert out.stdout.strip() == "no", (verb, what, out.stdout)
    as_driver.close()


def test_operator_service_account_is_least_privilege(apiserver: ApiServer, operator_process: OperatorProcess) -> None:
    sa = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{RELEASE}-asyncrl-operator"

    def can(verb: str, what: str) -> bool:
        resource, _, sub = what.partition("/")  # `kubectl auth can-i` reads "a/b" as resource a named b
        extra = [f"--subresource={sub}"] if sub else []
        out = apiserver.kubectl("auth", "can-i", verb, resource, *extra, "--as", sa, "-A", check=False)
        return out.stdout.strip() == "yes"

    # what the operator does (every test above proves it works with these rules)
    for verb, what in (("watch", "asyncrljobs.asyncrl.io"), ("patch", "asyncrljobs.asyncrl.io/status"),
                       ("update", "asyncrljobs.asyncrl.io/finalizers"), ("create", "pods"), ("delete", "pods"),
                       ("create", "events"), ("create", "roles.rbac.authorization.k8s.io"),
                       ("create", "secrets"), ("create", "networkpolicies.networking.k8s.io"),
                       ("create", "podgroups.scheduling.volcano.sh")):
        assert can(verb, what), (verb, what)
    # and what it never needs
    for verb, what in (("list", "secrets"), ("watch", "secrets"), ("delete", "secrets"), ("patch", "secrets"),
                       ("delete", "nodes"), ("update", "pods"), ("create", "clusterroles"),
                       ("patch", "asyncrljobs.asyncrl.io/finalizers"), ("create", "pods/exec"),
                       ("escalate", "roles.rbac.authorization.k8s.io"), ("bind", "clusterroles"),
                       ("delete", "customresourcedefinitions")):
        assert not can(verb, what), (verb, what)
