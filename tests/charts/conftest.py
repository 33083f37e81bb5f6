"""Fixtures of the chart tests: the real helm binary (installed by .ci/install-k8s-tools.sh)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))
from tests.support.helpers import find_helm  # noqa: E402


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        # never a skip: `make test` installs helm first (make tools); a missing helm is a broken set-up
        pytest.fail("helm v3 not found in .tools/helm/helm or on PATH; run `make tools`", pytrace=False)
    return path
