#!/usr/bin/env bash
# build-k8s-node.sh [VERSION]
# Builds the rest of a real one-node Kubernetes beside the kube-apiserver that build-kube-apiserver.sh
# makes: kubelet, kube-scheduler, kube-controller-manager, kube-proxy and kubectl from the same release,
# and CoreDNS, all from Go modules (no source checkout, no prebuilt download). Cached per machine under
# the same folder, keyed by Kubernetes and Go version (CoreDNS by its own version), so only a new machine
# pays: ~15-20 min for Kubernetes on 2 cores once the apiserver's Go build cache is warm, ~7 min for CoreDNS.
# Prints the folder of the binaries on stdout (progress goes to stderr).
#
# The wrapper module is the one build-kube-apiserver.sh explains: k8s.io/kubernetes replaces its staging
# modules with ./staging/..., so each is pinned to its published v0.<minor>.<patch>.
set -euo pipefail
V="${1:-${ASYNCRL_KUBE_VERSION:-1.36.3}}"
COREDNS_V="${ASYNCRL_COREDNS_VERSION:-v1.15.0}"
PROM_V="${ASYNCRL_PROMETHEUS_MODULE_VERSION:-v0.316.0}"   # the Go module of Prometheus 3.16 (tags v3.x = v0.3xx)
GOV="$(go env GOVERSION)"
GOMINOR="$(echo "$GOV" | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/kube/v$V-go$GOMINOR"
BINS=(kubelet kube-scheduler kube-controller-manager kube-proxy kubectl)
mkdir -p "$CACHE"
NICE=(nice -n 19)   # a shared 2-core machine: the compile yields to everything else

have_all=1
for b in "${BINS[@]}"; do
  if [ "$b" = kubectl ]; then ask=(version --client); else ask=(--version); fi
  # the output is captured, not piped into `grep -q`: under pipefail, grep leaving at its first match can end
  # kubectl's second line with SIGPIPE, which read as "not built" and rebuilt every binary
  out="$([ -x "$CACHE/$b" ] && "$CACHE/$b" "${ask[@]}" 2>/dev/null || true)"
  [[ "$out" == *"v$V"* ]] || { have_all=0; break; }
done
if [ "$have_all" = 0 ]; then
  MINOR="${V#*.}"; MINOR="${MINOR%%.*}"
  W="$(mktemp -d)"; trap 'rm -rf "$W"' EXIT; cd "$W"
  echo "building ${BINS[*]} v$V with $GOV (one time per machine) ..." >&2
  start=$(date +%s)
  KMOD="$(go mod download -json "k8s.io/kubernetes@v$V" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  WANT_GO="$(awk '$1=="go"{print $2; exit}' "$KMOD")"
  {
    printf 'module local/k8s-node\n\ngo %s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$WANT_GO" "$V"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$KMOD" | sort -u |
      while read -r m; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${V#*.}"; done
    printf ')\n'
  } > go.mod
  P=k8s.io/component-base/version
  mkdir -p "$W/out"
  "${NICE[@]}" go build -mod=mod -trimpath -o "$W/out/" \
    -ldflags "-s -w -X $P.gitVersion=v$V -X $P.gitMajor=1 -X $P.gitMinor=$MINOR -X $P.gitTreeState=clean" \
    $(printf 'k8s.io/kubernetes/cmd/%s ' "${BINS[@]}") >&2
  for b in "${BINS[@]}"; do mv "$W/out/$b" "$CACHE/$b"; done
  echo "built ${BINS[*]} in $(( $(date +%s) - start )) s" >&2
fi

go_tool() {  # go_tool NAME MODULE@VERSION : one binary from Go modules, once per machine, as $CACHE/NAME-VERSION
  local name=$1 pkg=$2 version=${2##*@} dest G start
  dest="$CACHE/$name-$version"
  if [ ! -x "$dest" ]; then
    echo "building $name $version (one time per machine) ..." >&2
    start=$(date +%s)
    G="$(mktemp -d)"
    GOBIN="$G" "${NICE[@]}" go install -trimpath -ldflags '-s -w' "$pkg" >&2
    mv "$G/$name" "$dest"; rm -rf "$G"
    echo "built $name in $(( $(date +%s) - start )) s" >&2
  fi
  ln -sfn "$name-$version" "$CACHE/$name"
}
go_tool coredns "github.com/coredns/coredns@$COREDNS_V"
# Prometheus with Kubernetes service discovery (Debian's package is built without it): the cluster test scrapes
# the pods as the chart's PodMonitor declares (tests/support/cluster_prometheus.py). ~60 min once at load 40-100.
go_tool prometheus "github.com/prometheus/prometheus/cmd/prometheus@$PROM_V"
echo "$CACHE"
