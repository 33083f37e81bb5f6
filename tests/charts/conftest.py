"""Fixtures of the chart tests: the real helm binary (installed by .ci/install-k8s-tools.sh)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # tests.support lives at the repository root
    sys.path.insert(0, str(ROOT))
CHART = ROOT / "charts" / "asyncrl"


def find_helm() -> str | None:
    """Kubernetes helm from .tools/helm/helm or PATH (Debian's `helm` is an Emacs package)."""
    for candidate in (ROOT / ".tools" / "helm" / "helm", shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            out = subprocess.run([str(candidate), "version", "--short"], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.startswith("v3."):
                return str(candidate)
    return None


@pytest.fixture(scope="session")
def helm() -> str:
    path = find_helm()
    if path is None:
        pytest.skip("helm v3 not found in .tools/helm/helm or on PATH; run .ci/install-k8s-tools.sh")
    return path
