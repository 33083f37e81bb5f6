"""A real Prometheus for the test cluster, configured from the chart alone.

Debian's package is built without Kubernetes service discovery, so this is Prometheus built from its Go module
beside the node binaries (.ci/build-k8s-node.sh); Debian's promtool still checks the rule file.

It runs on the host, listens on loopback, discovers its targets through the cluster's API server (Kubernetes
service discovery, on the bridge address) and scrapes pod IPs on the bridge: nothing leaves the machine. Its scrape
configs are the chart's PodMonitor (the jobs' drivers) and ServiceMonitor (the operator), rendered by ``helm
template`` and translated by :mod:`tests.support.monitor_config`; its rule file is the chart's PrometheusRule. So the
cluster test checks the chart's own selection, relabelling and rules against real pods.
"""

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.cluster import ROOT, Cluster, helm_bin
from tests.support.monitor_config import scrape_configs

SCRAPE_INTERVAL = "2s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rendered_chart(release: str, namespace: str) -> list[dict[str, Any]]:
    """The chart as ``helm template`` renders it with its monitors and rules on (scraping every 2 s)."""
    sets = ["metrics.enabled=true", "metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true",
            "prometheusRule.enabled=true", f"metrics.serviceMonitor.interval={SCRAPE_INTERVAL}",
            f"metrics.podMonitor.interval={SCRAPE_INTERVAL}", "metrics.serviceMonitor.scrapeTimeout=2s",
            "metrics.podMonitor.scrapeTimeout=2s"]
    args = [str(helm_bin()), "template", release, str(ROOT / "charts" / "asyncrl"), "-n", namespace]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@dataclass
class Prometheus:
    port: int
    proc: subprocess.Popen[bytes]
    folder: Path
    rule_groups: int

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        if body["status"] != "success":
            raise AssertionError(body)
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> str:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return (self.folder / "prometheus.log").read_text()[-4000:]


def start(cluster: Cluster, release: str, namespace: str, folder: Path) -> Prometheus:
    """Prometheus with the chart's monitors and rules; returns once it answers ``/-/ready``."""
    prometheus, promtool = cluster.bin / "prometheus", shutil.which("promtool")
    if not prometheus.is_file() or not promtool:
        raise RuntimeError("prometheus (with Kubernetes discovery) or promtool is missing: run `make cluster-images`")
    docs = rendered_chart(release, namespace)
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    api_server = kubeconfig["clusters"][0]["cluster"]["server"]  # the bridge address
    pki = Path(kubeconfig["clusters"][0]["cluster"]["certificate-authority"]).parent
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rules.yml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    config = {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
              "rule_files": [str(folder / "rules.yml")],
              "scrape_configs": scrape_configs(docs, api_server, pki)}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run([promtool, "check", "rules", str(folder / "rules.yml")], check=True, capture_output=True,
                   timeout=60)
    port = free_port()
    log = (folder / "prometheus.log").open("wb")
    proc = subprocess.Popen([str(prometheus), f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    prom = Prometheus(port, proc, folder, len(rule["spec"]["groups"]))
    deadline = time.monotonic() + 120
    while True:  # readiness: the server's own /-/ready, polled until it answers (or the process died)
        if proc.poll() is not None:
            raise RuntimeError(f"prometheus exited ({proc.returncode}):\n{prom.stop()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=5) as r:
                if r.status == 200:
                    return prom
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"prometheus not ready within 120 s:\n{prom.stop()}")
        time.sleep(0.5)
