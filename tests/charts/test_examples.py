"""Every AsyncRLJob in examples/ is accepted by the shipped CRD (schema + CEL) and by the typed
model, and every object the operator would build from it is a valid Kubernetes object."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from asyncrl.api.validation import load_jobs
from asyncrl.operator.builders import JobRef, desired
from asyncrl.operator.config import OperatorSettings
from tests.support.crvalidate import CRValidator
from tests.support.helpers import ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def test_examples_exist() -> None:
    assert {"small.yaml", "production.yaml", "quickstart.yaml"} <= {p.name for p in EXAMPLES}


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
            kubernetes_validate.validate(obj, "1.33", strict=True)
