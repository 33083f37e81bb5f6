"""The operator's dependency direction: it imports asyncrl.api, kopf and kubernetes, never torch or ray,
and nothing reads settings at import time."""

import subprocess
import sys

CODE = """
import os, sys
os.environ.pop("KUBECONFIG", None)
import asyncrl.operator.main, asyncrl.operator.handlers, asyncrl.operator.reconcile
heavy = sorted(m for m in ("torch", "ray", "asyncrl.trainer", "asyncrl.rollout") if m in sys.modules)
print(",".join(heavy))
"""


def test_operator_imports_neither_torch_nor_ray() -> None:
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"the operator pulled in: {out.stdout.strip()}"
