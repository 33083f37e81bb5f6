"""A real one-node Kubernetes on this machine, for the ``cluster`` tests and for ``make cluster-up``.

The kubelet runs real containers (containerd + runc) from images built here (:mod:`tests.support.cluster_images`);
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy and CoreDNS run beside it.
``.ci/cluster/up.sh`` and ``down.sh`` do the work; this module runs them, finds the binaries, and gives the
tests ``kubectl``/``helm`` bound to the cluster's admin kubeconfig and :func:`leftovers`, the check that
teardown left nothing behind (processes, shims, the bridge, ``KUBE-*`` iptables chains, network namespaces,
mounts). One cluster per machine at a time: it owns fixed ports, the bridge ``k8sreal0`` and the host's
iptables. Every address it uses is on that bridge, in the pods' network namespaces or on loopback.
"""

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_DIR = ROOT / ".ci" / "cluster"
RUN_DIR = Path(os.environ.get("ASYNCRL_CLUSTER_DIR", Path(os.environ.get(
    "XDG_CACHE_HOME", Path.home() / ".cache")) / "asyncrl" / "cluster" / "run"))
RELEASE, OPERATOR_NAMESPACE = "asyncrl", "asyncrl-system"  # the chart's helm release in the tests
_FIX = "run `make cluster-images` (bash .ci/install-k8s-node.sh) once on this machine"


class ClusterError(RuntimeError):
    pass


def kube_bin() -> Path:
    """The folder of kubelet & co. (``.tools/kube-node.path``, written by .ci/install-k8s-node.sh)."""
    marker = ROOT / ".tools" / "kube-node.path"
    env = os.environ.get("ASYNCRL_KUBE_BIN")
    path = Path(env) if env else Path(marker.read_text().strip()) if marker.is_file() else None
    if path is None or not (path / "kubelet").is_file():
        raise ClusterError(f"the Kubernetes node binaries are not built; {_FIX}")
    return path


def helm_bin() -> Path:
    path = ROOT / ".tools" / "helm" / "helm"
    if not path.is_file():
        raise ClusterError("helm is missing: run `make tools`")
    return path


def _env(bin_dir: Path) -> dict[str, str]:
    return {**os.environ, "ASYNCRL_KUBE_BIN": str(bin_dir), "ASYNCRL_CLUSTER_DIR": str(RUN_DIR),
            "PYTHON": str(ROOT / ".venv" / "bin" / "python")}


@dataclass(frozen=True)
class Cluster:
    kubeconfig: Path
    bin: Path
    started_s: float

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": f"{self.bin}:{os.environ['PATH']}"}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cp = subprocess.run([str(self.bin / "kubectl"), *args], input=input, capture_output=True, text=True,
                            env=self.env(), timeout=timeout)
        if check and cp.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({cp.returncode}): {cp.stderr.strip()}")
        return cp

    def helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        cp = subprocess.run([str(helm_bin()), *args], capture_output=True, text=True, env=self.env(),
                            timeout=timeout)
        if cp.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed ({cp.returncode}): {cp.stderr.strip()}")
        return cp

    def apply(self, docs: Sequence[dict[str, Any]] | dict[str, Any]) -> None:
        items = [docs] if isinstance(docs, dict) else list(docs)
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(items))

    def get(self, kind: str, name: str, namespace: str = "default") -> dict[str, Any]:
        return json.loads(self.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)

    def wait(self, kind: str, name: str, condition: str, namespace: str = "default", timeout: int = 120) -> None:
        """``kubectl wait --for=<condition>`` (the API server's watch, not a poll of ours)."""
        self.kubectl("wait", f"{kind}/{name}", "-n", namespace, f"--for={condition}", f"--timeout={timeout}s",
                     timeout=timeout + 30)

    def logs(self, pod: str, namespace: str = "default", container: str | None = None) -> str:
        return self.kubectl("logs", pod, "-n", namespace, *(["-c", container] if container else [])).stdout

    def namespace(self, name: str, pod_security: str | None = "restricted") -> str:
        labels = {f"pod-security.kubernetes.io/{m}": pod_security for m in ("enforce", "warn")} if pod_security else {}
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        return name


def up() -> Cluster:
    """Start the cluster (``.ci/cluster/up.sh``: ~30 s on 2 cores, plus image imports the first time)."""
    bin_dir = kube_bin()
    t0 = time.monotonic()
    cp = subprocess.run(["bash", str(CLUSTER_DIR / "up.sh")], capture_output=True, text=True, env=_env(bin_dir))
    if cp.returncode != 0:
        down()
        raise ClusterError(f"cluster up failed ({cp.returncode}):\n{cp.stderr[-4000:]}")
    return Cluster(Path(cp.stdout.strip().splitlines()[-1]), bin_dir, time.monotonic() - t0)


def attach() -> Cluster:
    """The cluster ``make cluster-up`` started (``ASYNCRL_CLUSTER_REUSE=1``: tests run on it and leave it up)."""
    kubeconfig = RUN_DIR / "admin.kubeconfig"
    if not (RUN_DIR / "pids").is_file() or not kubeconfig.is_file():
        raise ClusterError(f"no cluster is up ({RUN_DIR}): run `make cluster-up` or unset ASYNCRL_CLUSTER_REUSE")
    return Cluster(kubeconfig, kube_bin(), 0.0)


def down() -> str:
    """Tear the cluster down (``.ci/cluster/down.sh``); returns its log."""
    try:
        bin_dir = kube_bin()
    except ClusterError:
        bin_dir = Path("/nonexistent")
    cp = subprocess.run(["bash", str(CLUSTER_DIR / "down.sh")], capture_output=True, text=True, env=_env(bin_dir))
    return cp.stderr


def _lines(cmd: list[str]) -> list[str]:
    cp = subprocess.run(cmd, capture_output=True, text=True)
    return cp.stdout.splitlines() if cp.returncode == 0 else []


def leftovers() -> list[str]:
    """What a torn-down cluster must not leave: one line per thing found."""
    found: list[str] = []
    pids = RUN_DIR / "pids"
    if pids.is_file():
        found.append(f"{pids} still lists processes")
    for line in _lines(["ps", "-eo", "pid,args"]):
        if "/run/asyncrl-cluster/" in line or str(RUN_DIR) in line:
            found.append(f"process: {line.strip()}")
    if _lines(["ip", "link", "show", "k8sreal0"]):
        found.append("bridge k8sreal0")
    for tool in ("iptables", "iptables-legacy"):
        for table in ("filter", "nat", "mangle"):
            found += [f"{tool} -t {table}: {r}" for r in _lines([tool, "-t", table, "-S"])
                      if "KUBE-" in r or "asyncrl-cluster" in r]
    found += [f"netns {n}" for n in _lines(["ip", "netns", "list"]) if n.startswith("cni-")]
    found += [f"mount {m.split()[1]}" for m in Path("/proc/mounts").read_text().splitlines()
              if "/run/asyncrl-cluster" in m or str(RUN_DIR) in m or "asyncrl/cluster/containerd" in m]
    return found


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(description="The test cluster for people: up, down, or what teardown left.")
    p.add_argument("what", choices=["up", "down", "leftovers"])
    a = p.parse_args(argv)
    if a.what == "up":
        c = up()
        print(f"cluster up in {c.started_s:.0f} s\nexport KUBECONFIG={c.kubeconfig}")
    elif a.what == "down":
        print(down().strip())
        left = leftovers()
        print("\n".join(left) if left else "nothing left behind")
        return 1 if left else 0
    else:
        left = leftovers()
        print("\n".join(left) if left else "nothing left behind")
        return 1 if left else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
