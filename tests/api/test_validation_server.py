"""The one table of bad inputs, against the real API server: every input ``asyncrl validate`` refuses is
refused by the server too, at the same field path, with the same words where the rule is ours (CEL)."""

import json
from typing import Any

import pytest
from kubernetes.client import ApiException, CustomObjectsApi

from asyncrl.api.constants import GROUP, PLURAL, VERSION
from asyncrl.api.validation import SpecError, validate_job
from tests.support.bad_inputs import BAD_INPUTS, GOOD_INPUTS, BadInput, bad_manifest, good_manifest


def server_error(kube: Any, manifest: dict[str, Any]) -> tuple[int, str]:
    """(HTTP status, the server's messages with their field paths) of a dry-run create; (201, "") if accepted."""
    try:
        CustomObjectsApi(kube).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, manifest,
                                                               dry_run="All")
    except ApiException as exc:
        body = json.loads(exc.body)
        causes = [f"{c.get('field', '')}: {c.get('message', '')}" for c in body.get("details", {}).get("causes", [])]
        return exc.status, "\n".join([body.get("message", ""), *causes])
    return 201, ""


@pytest.mark.parametrize("case", BAD_INPUTS, ids=lambda c: c.id)
def test_the_server_refuses_what_validate_refuses(kube: Any, case: BadInput) -> None:
    manifest = bad_manifest(case, "bad-input")
    with pytest.raises(SpecError) as err:  # the model refuses it ...
        validate_job(manifest)
    assert any(p.path == case.path for p in err.value.problems), err.value
    status, text = server_error(kube, manifest)  # ... and so does the server, at the same field
    assert status == 422, f"the server accepted {case.id}: {manifest['spec']}"
    assert case.path in text, text
    assert case.message in text, text
    if case.message:
        assert any(case.message in p.message for p in err.value.problems)


@pytest.mark.parametrize("spec", [s for _, s in GOOD_INPUTS], ids=[i for i, _ in GOOD_INPUTS])
def test_the_server_accepts_what_validate_accepts(kube: Any, spec: dict[str, Any]) -> None:
    manifest = good_manifest(spec, "good-input")
    validate_job(manifest)
    assert server_error(kube, manifest) == (201, "")


def test_the_valid_base_job_is_accepted_and_defaulted_as_the_model_defaults_it(kube: Any) -> None:
    from tests.support.bad_inputs import BASE_SPEC

    manifest = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AsyncRLJob",
                "metadata": {"name": "good", "namespace": "default"}, "spec": BASE_SPEC}
    created = CustomObjectsApi(kube).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, manifest,
                                                                     dry_run="All")
    # the server's structural defaults give the same spec the model gives (one source: the models)
    model = validate_job(manifest).spec.to_spec_dict()
    served = validate_job({**manifest, "spec": created["spec"]}).spec.to_spec_dict()
    assert served == model
