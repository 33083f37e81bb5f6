#!/usr/bin/env bash
# install-k8s-node.sh : what the test cluster (make cluster-up, make test-cluster) needs on this machine, once.
#   - Debian packages: containerd, runc, the CNI plugins, iptables, conntrack, socat, ebtables, debootstrap,
#     gcc (the pause image), etcd, openssl, curl, prometheus (the metrics test scrapes with it)
#   - kubelet, kube-scheduler, kube-controller-manager, kube-proxy, kubectl and CoreDNS built from Go modules
#     (.ci/build-k8s-node.sh, cached per machine beside the kube-apiserver build)
#   - a Debian bookworm root filesystem (debootstrap --variant=minbase from the mirror apt uses) and the base
#     images made from it: Debian, Debian's Python 3.11, pause, CoreDNS (tests/support/cluster_images.py)
# Idempotent; a warm machine passes through in seconds. Writes the binaries' folder to .tools/kube-node.path.
# Runs as root (apt, debootstrap, overlay mounts for the image builds).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/cluster"
mkdir -p "$CACHE" "$ROOT/.tools"

pkgs=(containerd runc containernetworking-plugins iptables conntrack socat ebtables debootstrap gcc libc6-dev
      etcd-server openssl curl prometheus)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "packages: containerd $(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}')"

bash "$ROOT/.ci/build-kube-apiserver.sh" > "$ROOT/.tools/kube-apiserver.path"
KBIN="$(bash "$ROOT/.ci/build-k8s-node.sh")"
echo "$KBIN" > "$ROOT/.tools/kube-node.path"
echo "kubernetes binaries: $KBIN"

if [ ! -d "$CACHE/rootfs-bookworm/usr" ]; then
  MIRROR="$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
  rm -rf "$CACHE/rootfs-bookworm.tmp"
  nice -n 19 debootstrap --variant=minbase bookworm "$CACHE/rootfs-bookworm.tmp" ${MIRROR:+"$MIRROR"} >&2
  mv "$CACHE/rootfs-bookworm.tmp" "$CACHE/rootfs-bookworm"
fi
"$PY" -m tests.support.cluster_images bases --kube-bin "$KBIN"
echo "base images: done"
