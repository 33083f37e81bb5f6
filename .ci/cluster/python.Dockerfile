# The stand-in for python:3.11-slim-bookworm (docker/operator.Dockerfile's BASE in the test cluster):
# Debian bookworm's own Python 3.11 in a venv whose bin/ is first on PATH, so `python` and `pip` are the
# image's as in the official image. Built by tests/support/cluster_images.py from asyncrl.local/debian:bookworm.
FROM asyncrl.local/debian:bookworm
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/python
ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
