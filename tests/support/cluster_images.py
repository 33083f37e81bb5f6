"""The test cluster's images: bases made here from Debian bookworm, the project's images from its own Dockerfiles.

``python -m tests.support.cluster_images bases``   pause, CoreDNS, Debian bookworm and the Python base (once)
``python -m tests.support.cluster_images project`` docker/operator.Dockerfile and docker/job.Dockerfile
``python -m tests.support.cluster_images import``  every image into the cluster's containerd (skips what it has)

The project's images are tagged with the names the chart uses by default (``asyncrl/operator:<appVersion>``,
``asyncrl/job:<appVersion>``, which containerd spells ``docker.io/asyncrl/...``), so ``helm install`` and a job
without ``template.image`` find them as a kind user's ``kind load docker-image`` would give them. The job
image is built with ``VLLM_VERSION=`` (empty): its CPU pods run the transformers engine, and vLLM's GPU build
cannot run on a CPU; the Dockerfile's default stays vLLM 0.32.0 for GPU clusters.
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.support import dockerfile, oci

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_CACHE = dockerfile.CACHE.parent
ROOTFS = CLUSTER_CACHE / "rootfs-bookworm"
SOCK = "/run/asyncrl-cluster/containerd/containerd.sock"
CTR = ["ctr", "--address", SOCK, "-n", "k8s.io"]
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

DEBIAN, PYTHON, PAUSE, COREDNS = ("asyncrl.local/debian:bookworm", "asyncrl.local/python:3.11-bookworm",
                                  "asyncrl.local/pause:1", "asyncrl.local/coredns:1")


def app_version() -> str:
    return str(yaml.safe_load((ROOT / "charts" / "asyncrl" / "Chart.yaml").read_text())["appVersion"])


def operator_ref() -> str:
    return f"docker.io/asyncrl/operator:{app_version()}"


def job_ref() -> str:
    return f"docker.io/asyncrl/job:{app_version()}"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bases(kube_bin: Path) -> None:
    """pause (static C), CoreDNS (its binary and the libraries it links), Debian bookworm, the Python base."""
    if not (ROOTFS / "usr").is_dir():
        raise SystemExit(f"{ROOTFS} is missing: run .ci/install-k8s-node.sh (debootstrap)")
    pause = CLUSTER_CACHE / "pause-root"
    if not (pause / "pause").is_file():
        pause.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-Os", "-static", "-o", str(pause / "pause"), str(ROOT / ".ci/cluster/pause.c")],
                       check=True)
        subprocess.run(["strip", str(pause / "pause")], check=True)
    dockerfile.image_from_folder(PAUSE, pause, {"Entrypoint": ["/pause"], "Env": [PATH_ENV]}, excludes=())
    coredns_bin = (kube_bin / "coredns").resolve()
    cdns = CLUSTER_CACHE / f"coredns-root-{coredns_bin.name}"
    if not (cdns / "coredns").is_file():
        shutil.rmtree(cdns, ignore_errors=True)
        cdns.mkdir(parents=True)
        shutil.copy(coredns_bin, cdns / "coredns")
        ldd = subprocess.run(["ldd", str(coredns_bin)], capture_output=True, text=True).stdout
        for lib in [w for line in ldd.splitlines() for w in line.split() if w.startswith("/lib")]:
            (cdns / lib.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(lib, cdns / lib.lstrip("/"))
    dockerfile.image_from_folder(COREDNS, cdns, {"Entrypoint": ["/coredns"], "Env": [PATH_ENV]}, excludes=())
    dockerfile.image_from_folder(DEBIAN, ROOTFS, {"Env": [PATH_ENV], "Cmd": ["/bin/sh"]})
    dockerfile.build(ROOT / ".ci/cluster/python.Dockerfile", ROOT / ".ci/cluster", PYTHON)


def project() -> None:
    """Both images from docker/*.Dockerfile, with the bases made here standing in for their FROM lines."""
    t0 = time.monotonic()
    dockerfile.build(ROOT / "docker/operator.Dockerfile", ROOT, operator_ref(), {"BASE": PYTHON})
    _log(f"operator image: {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    dockerfile.build(ROOT / "docker/job.Dockerfile", ROOT, job_ref(), {"BASE": DEBIAN, "VLLM_VERSION": ""})
    _log(f"job image: {time.monotonic() - t0:.0f} s")


def _present() -> tuple[dict[str, str], set[str]]:
    """containerd's images (ref -> manifest digest) and the blob digests its content store holds."""
    images = {}
    for line in subprocess.run([*CTR, "images", "ls"], capture_output=True, text=True, check=True).stdout.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3:
            images[parts[0]] = parts[2]
    blobs = set(subprocess.run([*CTR, "content", "ls", "-q"], capture_output=True, text=True,
                               check=True).stdout.split())
    return images, blobs


def import_image(ref: str) -> bool:
    """Import ``ref`` from the local store unless containerd has the same manifest; layers it holds stay out."""
    image = dockerfile.load(ref)
    images, blobs = _present()
    want = oci.manifest_digest(image.layers, image.config)
    if images.get(ref) == want:
        return False
    t0 = time.monotonic()
    proc = subprocess.Popen([*CTR, "images", "import", "-"], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        oci.write_archive(proc.stdin, ref, image.layers, image.config, skip=blobs)
    finally:
        proc.stdin.close()
    if proc.wait() != 0:
        raise RuntimeError(f"ctr images import of {ref} failed (exit {proc.returncode})")
    _log(f"imported {ref} in {time.monotonic() - t0:.0f} s")
    return True


def stored_refs() -> list[str]:
    refs = [PAUSE, COREDNS, DEBIAN, PYTHON]
    return refs + [r for r in (operator_ref(), job_ref()) if dockerfile._ref_file(r, dockerfile.CACHE).is_file()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["bases", "project", "import"])
    p.add_argument("--kube-bin", type=Path, default=Path(os.environ.get("ASYNCRL_KUBE_BIN", ".")))
    a = p.parse_args(argv)
    if a.what == "bases":
        bases(a.kube_bin)
    elif a.what == "project":
        project()
    else:
        for ref in stored_refs():
            import_image(ref)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
