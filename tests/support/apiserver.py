"""A real ``kube-apiserver`` + ``etcd`` on loopback, for the tests of the operator, the chart and the driver.

What a test gets:

- etcd (Debian ``etcd-server``) with the progress-notify flag etcd 3.4 needs under a 1.36 server, and
  kube-apiserver (built from Go modules by ``.ci/build-kube-apiserver.sh``) with RBAC on, the default
  admission plugins (PodSecurity, ServiceAccount, ResourceQuota, ...) plus
  ``OwnerReferencesPermissionEnforcement`` (so ``blockOwnerDeletion`` needs ``asyncrljobs/finalizers``),
  on free ports, in a private folder;
- the CRD from ``crds/`` installed with ``kubectl apply --server-side`` and ``Established``;
- an admin kubeconfig, and kubeconfigs for ServiceAccounts from the TokenRequest API.

There is no kube-controller-manager, scheduler or kubelet: namespaces get no ``default``
ServiceAccount by themselves (:meth:`ApiServer.namespace` creates it), owner references are not
garbage-collected, and tests play the kubelet by patching pod status (``tests/support/kubelet.py``).
Binaries: ``ASYNCRL_KUBE_APISERVER`` or ``.tools/kube-apiserver.path`` (written by ``make tools``),
``etcd`` on PATH, ``kubectl`` in ``.tools/kubectl`` or on PATH. A missing one fails the test with the fix
(it never skips: CI can install every one of them).
"""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "asyncrl.io_asyncrljobs.yaml"
CRD_NAME = "asyncrljobs.asyncrl.io"
THIRD_PARTY_CRDS = Path(__file__).resolve().parent / "crds" / "third-party.yaml"
_FIX = "run `make tools` (or bash .ci/install-k8s-tools.sh) once on this machine"


class ToolMissing(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_tools() -> dict[str, str]:
    """Paths of kube-apiserver, etcd, kubectl and openssl; :class:`ToolMissing` names what is missing."""
    found: dict[str, str] = {}
    api = os.environ.get("ASYNCRL_KUBE_APISERVER")
    marker = ROOT / ".tools" / "kube-apiserver.path"
    if not api and marker.is_file():
        api = marker.read_text().strip()
    if api and Path(api).is_file():
        found["kube-apiserver"] = api
    kubectl = ROOT / ".tools" / "kubectl" / "kubectl"
    if kubectl.is_file():
        found["kubectl"] = str(kubectl)
    for tool in ("etcd", "kubectl", "openssl"):
        if tool not in found and (path := shutil.which(tool)):
            found[tool] = path
    missing = [t for t in ("kube-apiserver", "etcd", "kubectl", "openssl") if t not in found]
    if missing:
        raise ToolMissing(f"{', '.join(missing)} not found; {_FIX}")
    return found


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(pki: Path) -> None:
    """CA, serving certificate for 127.0.0.1, an admin client certificate, and the ServiceAccount key pair."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=asyncrl-test-ca", cwd=pki)
    (pki / "server.ext").write_text("subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
                                    "DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.0.0.1\n"
                                    "extendedKeyUsage=serverAuth\n")
    (pki / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("apiserver", "/CN=kube-apiserver", "server.ext"),
                            ("admin", "/O=system:masters/CN=admin", "client.ext")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subj, cwd=pki)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "30", "-extfile", ext, cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


@dataclass
class ApiServer:
    """One etcd + kube-apiserver pair in ``workdir``; :meth:`start` / :meth:`stop`."""

    workdir: Path
    tools: dict[str, str] = field(default_factory=find_tools)
    port: int = 0
    start_seconds: float = 0.0
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        """The admin (``system:masters``) kubeconfig."""
        return self.workdir / "admin.kubeconfig"

    # ---------------------------------------------------------------- life cycle
    def start(self, timeout: float = 90.0) -> "ApiServer":
        t0 = time.monotonic()
        pki = self.workdir / "pki"
        make_pki(pki)
        etcd_client, etcd_peer, self.port = free_port(), free_port(), free_port()
        etcd = [self.tools["etcd"], "--name", "test", "--data-dir", str(self.workdir / "etcd-data"),
                "--logger=zap", "--log-level=warn",
                "--listen-client-urls", f"http://127.0.0.1:{etcd_client}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_client}",
                "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
                "--initial-cluster", f"test=http://127.0.0.1:{etcd_peer}", "--unsafe-no-fsync",
                # etcd 3.4 lacks RequestWatchProgress: without this, quiet watches die with 504 (§3.5)
                "--experimental-watch-progress-notify-interval=1s"]
        self._spawn(etcd, "etcd.log")
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{etcd_client}/health"), timeout, "etcd /health")
        api = [self.tools["kube-apiserver"], f"--etcd-servers=http://127.0.0.1:{etcd_client}",
               "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
               f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
               f"--client-ca-file={pki / 'ca.crt'}", "--authorization-mode=RBAC",
               "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
               "--service-account-issuer=https://kubernetes.default.svc",
               f"--service-account-key-file={pki / 'sa.pub'}",
               f"--service-account-signing-key-file={pki / 'sa.key'}",
               "--service-cluster-ip-range=10.0.0.0/24", "--endpoint-reconciler-type=none",
               "--profiling=false", "--event-ttl=1h"]
        self._spawn(api, "apiserver.log")
        self._write_kubeconfig(self.kubeconfig, {"client-certificate": str(pki / "admin.crt"),
                                                 "client-key": str(pki / "admin.key")})
        self._wait(lambda: self.kubectl("get", "--raw", "/readyz", check=False).returncode == 0, timeout,
                   "kube-apiserver /readyz")
        self.start_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        for proc in reversed(self._procs):  # apiserver first, then etcd
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()

    def _spawn(self, cmd: list[str], log: str) -> None:
        out = open(self.workdir / log, "wb")  # noqa: SIM115 -- lives as long as the process
        # own session, no stdin: the servers must not hold the test's terminal
        self._procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, cwd=self.workdir))

    def _wait(self, ready: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for proc in self._procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{what}: {proc.args!s:.60} exited with {proc.returncode}; "
                                       f"see {self.workdir}/*.log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {timeout:g} s:\n{self.log_tail()}")
            time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for log in ("etcd.log", "apiserver.log"):
            path = self.workdir / log
            if path.exists():
                out.append(f"--- {log}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    # ---------------------------------------------------------------- clients
    def _write_kubeconfig(self, path: Path, user: dict[str, str]) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url,
                                                      "certificate-authority": str(self.workdir / "pki" / "ca.crt")}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        }))
        return path

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None,
                check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this server (admin unless ``kubeconfig`` says otherwise)."""
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}
        out = subprocess.run([self.tools["kubectl"], *args], input=input, capture_output=True, text=True,
                             env=env, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}):\n{out.stdout}{out.stderr}")
        return out

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        """A ``kubernetes.client.ApiClient`` with its own Configuration (never the process-wide default)."""
        import kubernetes

        conf = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=str(kubeconfig or self.kubeconfig), client_configuration=conf)
        return kubernetes.client.ApiClient(conf)

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path | None = None,
                         duration: str = "2h") -> Path:
        """A kubeconfig that authenticates as ``system:serviceaccount:<namespace>:<service_account>``
        with a token from the TokenRequest API (no client certificate: it would win over the token)."""
        token = self.kubectl("create", "token", service_account, "-n", namespace,
                             f"--duration={duration}").stdout.strip()
        path = path or self.workdir / f"sa-{namespace}-{service_account}.kubeconfig"
        return self._write_kubeconfig(path, {"token": token})

    # ---------------------------------------------------------------- objects
    def apply(self, docs: Sequence[dict[str, Any]] | dict[str, Any], *extra: str,
              kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``kubectl apply --server-side`` of manifests (a dict or a list of them)."""
        items = [docs] if isinstance(docs, dict) else list(docs)
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        return self.kubectl("apply", "--server-side", "--field-manager=asyncrl-tests", "-f", "-", *extra,
                            input=body, kubeconfig=kubeconfig, check=check)

    def install_crd(self, path: Path = CRD_FILE) -> float:
        """Apply the CRD server-side and wait for ``Established``; the seconds it took."""
        t0 = time.monotonic()
        self.kubectl("apply", "--server-side", "--field-manager=asyncrl-tests", "-f", str(path))
        self.wait_established([CRD_NAME])
        # discovery of the new resource can lag Established by a moment
        deadline = time.monotonic() + 30
        while self.kubectl("get", "asyncrljobs", "-A", check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("asyncrljobs not served 30 s after the CRD was Established")
            time.sleep(0.2)
        return time.monotonic() - t0

    def install_third_party_crds(self) -> None:
        """Stand-in CRDs of prometheus-operator (monitors, rules) and of the gang schedulers (PodGroup)."""
        out = self.kubectl("apply", "--server-side", "--field-manager=asyncrl-tests", "-f", str(THIRD_PARTY_CRDS),
                           "-o", "name")
        self.wait_established([line.split("/", 1)[1] for line in out.stdout.split()])

    def wait_established(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Poll until every CRD reports ``Established=True`` (``kubectl wait`` fails on a CRD that has no
        status conditions yet, which a fresh one may not)."""
        path = '{.status.conditions[?(@.type=="Established")].status}'
        for name in names:
            self._wait(lambda n=name: self.kubectl("get", "crd", n, "-o", f"jsonpath={path}",
                                                   check=False).stdout.strip() == "True",
                       timeout, f"CRD {name} Established")

    def namespace(self, name: str, pod_security: str | None = "restricted") -> str:
        """Create a namespace with its ``default`` ServiceAccount (no controller-manager makes one) and,
        unless None, the Pod Security level enforced by the real admission plugin."""
        labels = {} if pod_security is None else {
            "pod-security.kubernetes.io/enforce": pod_security,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}},
                    {"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "default", "namespace": name}}])
        return name


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 -- loopback only
            return bool(resp.status == 200)
    except OSError:
        return False


def started(workdir: Path) -> Iterator[ApiServer]:
    """Start a server with the CRD installed; stop it afterwards (the body of the session fixture)."""
    server = ApiServer(workdir)
    server.start()
    try:
        server.install_crd()
        yield server
    finally:
        server.stop()
