"""Every AsyncRLJob in examples/ is accepted by the shipped CRD (schema + CEL, offline and by a real API
server's dry run) and by the typed model, and every object the operator would build from it is a valid
Kubernetes object; there is one example per old-logit strategy and one with the audit on."""

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from asyncrl.api.constants import GROUP, PLURAL, VERSION
from asyncrl.api.correction import ReferencePolicy
from asyncrl.api.old_logits import OldLogitStrategy
from asyncrl.api.validation import load_jobs
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from tests.support.crvalidate import CRValidator
from tests.support.helpers import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    assert {"small.yaml", "production.yaml", "quickstart.yaml", "exact-snapshot.yaml", "exact-dedicated.yaml",
            "exact-interrupt-sync.yaml", "audit-ewma.yaml"} <= {p.name for p in EXAMPLES}


def test_one_example_per_strategy_and_one_audited_cheap_reference() -> None:
    jobs = [job for path in EXAMPLES for job in load_jobs(path)]
    strategies = {j.spec.old_logits.strategy for j in jobs if j.spec.correction.reference is ReferencePolicy.EXACT}
    assert strategies == set(OldLogitStrategy)
    assert any(j.spec.correction.reference is ReferencePolicy.EWMA and j.spec.correction.audit.enabled for j in jobs)
    (quickstart,) = load_jobs(ROOT / "examples" / "quickstart.yaml")
    for name in ("exact-snapshot", "exact-dedicated", "exact-interrupt-sync", "audit-ewma"):
        (job,) = load_jobs(ROOT / "examples" / f"{name}.yaml")
        assert job.metadata.name == name
        # quickstart scale (so `asyncrl run <file> --steps 5` runs on a laptop): only the correction differs
        same = {k: v for k, v in job.spec.to_spec_dict().items() if k not in ("correction", "oldLogits")}
        assert same == {k: v for k, v in quickstart.spec.to_spec_dict().items() if k not in ("correction", "oldLogits")}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_accepted_by_the_real_api_server(kube: Any, path: Path) -> None:
    from kubernetes.client import CustomObjectsApi

    for doc in yaml.safe_load_all(path.read_text()):
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": "default"}}
        created = CustomObjectsApi(kube).create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, doc,
                                                                         dry_run="All")
        assert created["metadata"]["name"] == doc["metadata"]["name"], path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates_everywhere(path: Path) -> None:
    validator = CRValidator.from_file()
    for doc in yaml.safe_load_all(path.read_text()):
        assert validator.validate(doc) == [], path
    for job in load_jobs(path):
        ref = JobRef(job.metadata.name, job.metadata.namespace or "default", "00000000-0000-0000-0000-000000000001",
                     dict(job.metadata.labels))
        built = desired(ref, job.spec, OperatorSettings(), epoch=0)
        for obj in [s.manifest for s in built.pods.values()] + [c.manifest for c in built.children]:
            if obj["kind"] == "PodGroup":  # a gang scheduler's kind: no schema here (the real API server
                continue                   # creates one in tests/operator/test_server_gang.py)
            kubernetes_validate.validate(obj, "1.33", strict=True)
