# The asyncrl operator: kopf + the asyncrl API and operator packages only (no torch, no ray).
# Build from the repository root:  docker build -f docker/operator.Dockerfile -t asyncrl/operator:0.1.0 .
# BASE: any Debian-like image with Python 3.11's `python` and `pip` on PATH (the test cluster builds this file
# with a base made from Debian bookworm's own Python 3.11: docs/cluster.md).
ARG BASE=python:3.11.9-slim-bookworm
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# Pinned to what the tests run against; the operator imports neither torch nor ray, so the
# package is installed without its dependencies and these are the whole runtime.
RUN pip install "kopf==1.45.2" "kubernetes==37.0.2" "pydantic==2.14.4" "prometheus-client==0.26.0" \
        "PyYAML==6.0.4"

WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY api ./api
COPY operator ./operator
COPY trainer ./trainer
COPY rollout ./rollout
RUN pip install --no-deps . && rm -rf /src

# Non-root, matching the chart's securityContext (runAsUser 10001, read-only root filesystem).
RUN groupadd --gid 10001 asyncrl && useradd --uid 10001 --gid 10001 --no-create-home asyncrl
USER 10001:10001
WORKDIR /tmp

EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "asyncrl.operator.main"]
