#!/usr/bin/env bash
# build-kube-apiserver.sh [VERSION]
# Builds a real kube-apiserver from Go modules (no source checkout, no prebuilt download) and caches
# it under the user's cache directory keyed by Kubernetes and Go version, so only a new machine pays
# the 10-20 minute compile. Prints the binary's path on stdout (progress goes to stderr).
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every k8s.io/<staging> module with
# ./staging/... at v0.0.0. A throwaway wrapper module pins each of them to the published v0.<minor>.<patch>;
# the list is generated from the release's own go.mod so none is missed. Build with the Go minor the
# release's go.mod names (a newer Go served a broken /openapi/v2 in the feasibility study).
set -euo pipefail
V="${1:-${ASYNCRL_KUBE_VERSION:-1.36.3}}"
GOV="$(go env GOVERSION)"                         # e.g. go1.26.8
GOMINOR="$(echo "$GOV" | sed -E 's/^go([0-9]+\.[0-9]+).*/\1/')"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/kube/v$V-go$GOMINOR"
BIN="$CACHE/kube-apiserver"
have="$([ -x "$BIN" ] && "$BIN" --version 2>/dev/null || true)"  # captured: no grep -q under pipefail (SIGPIPE)
if [[ "$have" == *"v$V"* ]]; then echo "$BIN"; exit 0; fi

MINOR="${V#*.}"; MINOR="${MINOR%%.*}"             # 1.36.3 -> 36
mkdir -p "$CACHE"
W="$(mktemp -d)"; trap 'rm -rf "$W"' EXIT; cd "$W"
echo "building kube-apiserver v$V with $GOV (one time per machine, 10-20 min on 2 cores) ..." >&2
start=$(date +%s)
KMOD="$(go mod download -json "k8s.io/kubernetes@v$V" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
WANT_GO="$(awk '$1=="go"{print $2; exit}' "$KMOD")"
case "$WANT_GO" in
  "$GOMINOR"|"$GOMINOR".*) ;;
  *) echo "kube-apiserver v$V wants Go $WANT_GO but this machine has $GOV; build with that Go minor" >&2; exit 1;;
esac
{
  printf 'module local/kube-apiserver\n\ngo %s\n\nrequire k8s.io/kubernetes v%s\n\nreplace (\n' "$WANT_GO" "$V"
  sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$KMOD" | sort -u |
    while read -r m; do printf '\t%s => %s v0.%s\n' "$m" "$m" "${V#*.}"; done
  printf ')\n'
} > go.mod
cat > main.go <<'GO'
package main

import (
	"os"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
GO
go mod tidy >&2
P=k8s.io/component-base/version
go build -trimpath -o "$BIN.tmp" \
  -ldflags "-s -w -X $P.gitVersion=v$V -X $P.gitMajor=1 -X $P.gitMinor=$MINOR -X $P.gitTreeState=clean -X $P.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)" . >&2
mv "$BIN.tmp" "$BIN"
echo "built $BIN in $(( $(date +%s) - start )) s" >&2
echo "$BIN"
