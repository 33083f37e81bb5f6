"""The operator's own re-check before it creates anything (asyncrl.operator.admission), without a server:
a privileged template only where the cluster admin allows it, and every built pod passes the restricted
Pod Security level. The same on the real API server: tests/operator/test_server_security.py."""

import copy
from typing import Any

import pytest

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.operator.admission import admission_problems, pod_violations
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings

REF = JobRef("j", "ns", "uid-1", {})
PRIVILEGED_ROLLOUT = {"template": {"podSecurityLevel": "privileged",
                                   "securityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}},
                                   "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                                   "volumeMounts": [{"name": "root", "mountPath": "/host"}]}}


def spec_of(**sections: Any) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate(sections)


def problems(spec: AsyncRLJobSpec, namespace: str, cfg: OperatorSettings) -> list[str]:
    pods = desired(JobRef("j", namespace, "uid-1", {}), spec, cfg, 0).pods
    return [str(p) for p in admission_problems(spec, namespace, cfg, pods)]


def test_every_pod_the_operator_builds_passes_the_restricted_level() -> None:
    spec = spec_of(oldLogits={"strategy": "dedicated"}, correction={"reference": "exact"},
                   rollout={"template": {"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]},
                                                             "readOnlyRootFilesystem": True},
                                         "podSecurityContext": {"runAsUser": 2000, "seccompProfile": {
                                             "type": "Localhost", "localhostProfile": "profiles/ray.json"}},
                                         "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "x"}}]}})
    d = desired(REF, spec, OperatorSettings(), 0)
    assert {s.role.value for s in d.pods.values()} == {"driver", "rollout", "actor", "oldlogit"}
    for name, slot in d.pods.items():
        assert pod_violations(slot.manifest) == [], name
    assert admission_problems(spec, "ns", OperatorSettings(), d.pods) == []


def test_privileged_template_is_refused_outside_the_admins_namespaces() -> None:
    spec = spec_of(rollout=PRIVILEGED_ROLLOUT)  # the model and the CRD let it through: it asks for privileged
    found = problems(spec, "team-a", OperatorSettings(privileged_namespaces=("ml-debug",)))
    assert found[0].startswith("spec.rollout.template.podSecurityLevel: podSecurityLevel privileged is not allowed "
                               "in namespace 'team-a': the cluster admin allows it only in the namespaces of the "
                               "chart value podSecurity.privilegedNamespaces (now: ml-debug)")
    # the backstop names what the built pods would have carried, pod by pod
    assert "pod j-rollout-0: container rollout: privileged" in " ".join(found)
    assert any("volume type hostPath" in p for p in found)
    assert not any("j-actor-0" in p or "j-driver-0" in p for p in found)  # the actor's template is restricted


def test_the_admins_opt_in_admits_exactly_the_privileged_template() -> None:
    spec = spec_of(rollout=PRIVILEGED_ROLLOUT)
    cfg = OperatorSettings(privileged_namespaces=("ml-debug",))
    assert problems(spec, "ml-debug", cfg) == []
    pods = desired(JobRef("j", "ml-debug", "uid-1", {}), spec, cfg, 0).pods
    sc = pods["j-rollout-0"].manifest["spec"]["containers"][0]["securityContext"]
    assert sc["privileged"] is True and sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    # the actor's pods in the same namespace are still checked: the opt-in is per template
    actor = pods["j-actor-0"].manifest
    broken = copy.deepcopy(actor)
    broken["spec"]["containers"][0]["securityContext"]["privileged"] = True
    assert "container actor: privileged" in pod_violations(broken)


@pytest.mark.parametrize("mutate, expected", [
    (lambda s: s.update(hostNetwork=True), "spec.hostNetwork: true"),
    (lambda s: s.update(hostPID=True), "spec.hostPID: true"),
    (lambda s: s["volumes"].append({"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock"}}),
     "spec.volumes[sock]: volume type hostPath"),
    (lambda s: s["containers"][0]["ports"].append({"containerPort": 80, "hostPort": 80}), "container rollout: hostPort"),
    (lambda s: s["containers"][0]["securityContext"].update(allowPrivilegeEscalation=True),
     "container rollout: allowPrivilegeEscalation is not false"),
    (lambda s: s["containers"][0]["securityContext"].update(capabilities={"drop": []}),
     "container rollout: capabilities.drop lacks ALL"),
    (lambda s: s["securityContext"].update(runAsNonRoot=False), "container rollout: runAsNonRoot is not true"),
    (lambda s: s["securityContext"].update(seccompProfile={"type": "Unconfined"}),
     "container rollout: seccompProfile.type Unconfined"),
    (lambda s: s["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]),
     "spec.securityContext.sysctls: kernel.msgmax"),
])
def test_the_backstop_sees_every_restricted_violation_in_a_built_pod(mutate: Any, expected: str) -> None:
    pod = copy.deepcopy(desired(REF, spec_of(), OperatorSettings(), 0).pods["j-rollout-0"].manifest)
    mutate(pod["spec"])
    assert expected in pod_violations(pod)


@pytest.mark.parametrize("field", ["hostNetwork", "hostPID", "hostIPC", "ports", "hostUsers"])
def test_a_template_has_no_field_for_host_namespaces_or_ports(field: str) -> None:
    from asyncrl.api.validation import SpecError, validate_job

    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "j"},
           "spec": {"rollout": {"template": {field: True}}}}
    with pytest.raises(SpecError) as err:  # validate refuses it; the API server prunes it (no such field)
        validate_job(doc)
    assert [p.path for p in err.value.problems] == [f"spec.rollout.template.{field}"]
