"""Small helpers shared by the operator and chart tests."""

import importlib.util
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "asyncrl"


def job_manifest(name: str = "job1", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """A small valid AsyncRLJob (CPU pods) with ``spec`` sections merged over it."""
    base: dict[str, Any] = {
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"rollout": {"replicas": 2, "gpusPerReplica": 0},
                 "actor": {"replicas": 1, "gpusPerReplica": 0},
                 "runPolicy": {"backoffLimit": 2}},
    }
    for key, value in spec.items():
        if isinstance(value, dict):
            base["spec"].setdefault(key, {}).update(value)
        else:
            base["spec"][key] = value
    return base


def wait_for(what: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, message: str = "") -> Any:
    """Poll ``what`` until it is truthy; fail with the last value after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = what()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {message or what}; last value: {last!r}")


def find_helm() -> str | None:
    """Kubernetes helm 3 from .tools/helm/helm or PATH (Debian's `helm` is an Emacs package)."""
    for candidate in (ROOT / ".tools" / "helm" / "helm", shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            out = subprocess.run([str(candidate), "version", "--short"], capture_output=True, text=True)
            if out.returncode == 0 and out.stdout.startswith("v3."):
                return str(candidate)
    return None


PAPER = ROOT / "bench" / "paper"


def bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module, registered as ``bench_<name>`` (dataclasses look their module up by name)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def paper_module(name: str) -> ModuleType:
    """``bench/paper/<name>.py`` as a module, registered as ``bench_paper_<name>`` (dataclasses and pickling see
    it). The scripts import their siblings, some inside functions, so ``bench/paper`` stays on the path."""
    if str(PAPER) not in sys.path:
        sys.path.insert(0, str(PAPER))
    spec = importlib.util.spec_from_file_location(f"bench_paper_{name}", PAPER / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
