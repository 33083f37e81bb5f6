"""The real operator process (``python -m asyncrl.operator.main``, i.e. ``kopf.run``) under the chart's RBAC.

The chart is rendered with the real helm; its ServiceAccount, ClusterRoles and ClusterRoleBindings are
applied to the real API server, and the operator authenticates with a TokenRequest token of that
ServiceAccount — never as admin. Every test that runs the operator therefore also proves that the
chart's rules suffice for what the operator does.
"""

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.apiserver import ApiServer, free_port
from tests.support.helpers import CHART, find_helm

OPERATOR_NAMESPACE = "asyncrl-system"
RELEASE = "rel"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def render_chart(*values: str, namespace: str = OPERATOR_NAMESPACE, chart: Path = CHART) -> list[dict[str, Any]]:
    """``helm template`` of the chart (CRDs included) as a list of objects."""
    helm = find_helm()
    if helm is None:
        raise RuntimeError("helm v3 not found in .tools/helm/helm; run `make tools`")
    out = subprocess.run([helm, "template", RELEASE, str(chart), "-n", namespace, "--include-crds", *values],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def install_operator_rbac(server: ApiServer) -> str:
    """Apply the chart's ServiceAccount and RBAC objects; the ServiceAccount's name."""
    docs = [d for d in render_chart() if d["kind"] in RBAC_KINDS]
    server.namespace(OPERATOR_NAMESPACE, pod_security=None)
    server.apply(docs)
    (sa,) = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    return str(sa)


@dataclass
class OperatorProcess:
    """One operator process; ``namespaces`` are kopf namespace patterns (e.g. ``e2e-*``)."""

    server: ApiServer
    namespaces: list[str]
    settings: dict[str, str] = field(default_factory=dict)
    workdir: Path | None = None
    liveness_port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> "OperatorProcess":
        sa = install_operator_rbac(self.server)
        workdir = self.workdir or self.server.workdir
        kubeconfig = self.server.token_kubeconfig(OPERATOR_NAMESPACE, sa, workdir / f"operator-{id(self)}.kubeconfig")
        self.liveness_port, self.metrics_port = free_port(), free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ASYNCRL_OPERATOR_", "KUBERNETES_SERVICE"))}
        env.update({
            "KUBECONFIG": str(kubeconfig),
            "ASYNCRL_OPERATOR_RESYNC_SECONDS": "1",
            "ASYNCRL_OPERATOR_RESTART_BACKOFF_SECONDS": "0.3",
            "ASYNCRL_OPERATOR_RESTART_BACKOFF_MAX_SECONDS": "2",
            "ASYNCRL_OPERATOR_FINALIZER_TIMEOUT_SECONDS": "8",
            "ASYNCRL_OPERATOR_METRICS_PORT": str(self.metrics_port),
            **self.settings,
        })
        cmd = [sys.executable, "-m", "asyncrl.operator.main", f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
               "--log-level=INFO", *[f"--namespace={ns}" for ns in self.namespaces]]
        self.log_path = workdir / f"operator-{self.liveness_port}.log"
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=open(self.log_path, "wb"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.alive():
            if self.proc.poll() is not None:
                raise RuntimeError(f"the operator exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the operator's liveness endpoint did not answer in {timeout:g} s:\n{self.log()}")
            time.sleep(0.2)
        return self

    def alive(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as r:  # noqa: S310
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:  # noqa: S310
            return str(r.read().decode())

    def log(self, lines: int = 80) -> str:
        path = getattr(self, "log_path", None)
        if path is None or not path.exists():
            return "(no operator log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # kopf stops gracefully (cleanup handlers run)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
