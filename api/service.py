"""The outbound HTTP services of a job (``spec.task.rewardService``, a ``RemoteEnvironment``'s ``args``):
the headers they send from Secrets, the form of a URL that may be shown, and the destinations a job
should not call.

- **Headers from Secrets.** ``headersFrom: [{name: Authorization, secretKeyRef: {name, key}}]``. The
  value never enters the spec: in a cluster the operator gives the pods that build and call the
  service the environment variable :func:`header_env_var` names, from the Secret (``valueFrom``);
  locally the same variable is read from the environment of ``asyncrl run``. The client reads it once
  (:func:`header_values`) and never shows it.
- **Shown URLs.** Metric labels, logs and fault messages carry :func:`redact_url` (scheme, host,
  port, path): a token in a query string or userinfo stays in the job file.
- **Destinations.** :func:`destination_warnings`: a link-local or cloud metadata address, the cluster's
  API server, or loopback in a cluster is almost always a mistake or an attack (SSRF); ``asyncrl
  validate`` says so (docs/security.md, "Reward and environment services").
"""

import ipaddress
import os
import re
from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from asyncrl.api.base import SpecModel

HEADER_ENV_PREFIX: Final = "ASYNCRL_SERVICE_HEADER_"
HEADER_NAME_PATTERN: Final = r"^[A-Za-z0-9][A-Za-z0-9-]*$"
# Headers the client sets itself (or that frame the request): a Secret cannot replace them.
RESERVED_HEADERS: Final = frozenset({
    "accept", "connection", "content-length", "content-type", "host", "transfer-encoding", "x-asyncrl-protocol",
})
SECRET_NAME_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN: Final = r"^[-._a-zA-Z0-9]+$"
_HEADER_NAME = re.compile(HEADER_NAME_PATTERN)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # HTTP field values allow tab, never CR/LF/NUL


class SecretKeyRef(SpecModel):
    """A key of a Secret in the job's namespace (Kubernetes ``SecretKeySelector``)."""

    name: str = Field(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN,
                      description="Name of the Secret, in the job's namespace.")
    key: str = Field(min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN,
                     description="Key in the Secret whose value is the header's value.")


class HeaderFromSecret(SpecModel):
    """One header of every request to the service, its value from a Secret."""

    name: str = Field(
        min_length=1, max_length=64, pattern=HEADER_NAME_PATTERN,
        description="HTTP header name, e.g. Authorization or X-Api-Key (letters, digits, '-'). In the pods it is "
        "the environment variable ASYNCRL_SERVICE_HEADER_<NAME> (upper case, '-' as '_'); locally asyncrl run "
        "reads that variable from its environment.",
    )
    secret_key_ref: SecretKeyRef = Field(
        description="The Secret and key holding the value (e.g. 'Bearer <token>'). The value is never logged, "
        "counted or shown in an error.",
    )

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v.lower() in RESERVED_HEADERS:
            raise ValueError(f"header {v!r} is set by the client itself ({', '.join(sorted(RESERVED_HEADERS))}); "
                             "name another header, e.g. Authorization")
        return v


def header_env_var(header: str) -> str:
    """The environment variable that carries ``header``'s value: ``X-Api-Key`` -> ``ASYNCRL_SERVICE_HEADER_X_API_KEY``.

    One spelling for the operator (which sets it from the Secret) and the client (which reads it); header
    names are case-insensitive and hold no ``_``, so two different headers never share a variable."""
    return HEADER_ENV_PREFIX + header.upper().replace("-", "_")


def duplicate_headers(headers: Iterable[HeaderFromSecret]) -> list[str]:
    """Header names given more than once (case-insensitively, as HTTP compares them)."""
    seen: set[str] = set()
    twice = []
    for h in headers:
        if h.name.lower() in seen:
            twice.append(h.name)
        seen.add(h.name.lower())
    return twice


def header_values(headers: Iterable[HeaderFromSecret], field: str,
                  environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{header: value}`` from the environment; a ``ValueError`` naming the header and its variable (never the
    value) when a variable is missing or its value could not be sent. Surrounding whitespace (the newline a
    Secret made from a file keeps) is stripped."""
    env = os.environ if environ is None else environ
    values, problems = {}, []
    for i, h in enumerate(headers):
        var = header_env_var(h.name)
        raw = env.get(var)
        where = f"{field}.headersFrom[{i}] ({h.name})"
        if raw is None:
            problems.append(f"{where}: the environment variable {var} is not set; in a cluster the operator sets it "
                            f"from Secret {h.secret_key_ref.name!r} key {h.secret_key_ref.key!r}; locally export "
                            f"{var} before asyncrl run")
            continue
        value = raw.strip()
        if not value or _CONTROL.search(value):
            problems.append(f"{where}: the value in {var} is empty or holds a line break or control character "
                            "(not shown); fix the Secret's value")
            continue
        values[h.name] = value
    if problems:
        raise ValueError("; ".join(problems))
    return values


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: no userinfo, query or fragment (what logs and labels may show)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:  # a port that is not a number: show no authority at all
        return f"{url.split(':', 1)[0]}://(unparsable host)"
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}{parts.path}"


# Cloud instance-metadata endpoints (AWS, GCP, Azure, Oracle: 169.254.169.254; AWS IPv6; Alibaba).
METADATA_HOSTS: Final = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
})
METADATA_ADDRESSES: Final = (ipaddress.ip_network("169.254.169.254/32"), ipaddress.ip_network("fd00:ec2::254/128"),
                              ipaddress.ip_network("100.100.100.200/32"))
LINK_LOCAL: Final = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def destination_warnings(url: str, field: str, *, local: bool) -> list[str]:
    """Why ``url`` (of ``field``) is a destination a job should not call; empty when none.

    By name and literal address only (no DNS lookup: a name that resolves to such an address is not
    caught here; the chart's egress policy is the enforcement). ``local``: the job runs on this machine,
    where loopback is where a local service listens."""
    host = (urlsplit(url).hostname or "").rstrip(".").lower()
    shown = redact_url(url)
    address = _address(host)
    if host in METADATA_HOSTS or (address is not None and any(address in n for n in METADATA_ADDRESSES)):
        return [f"{field}: {shown} is a cloud instance-metadata endpoint (it hands out the node's credentials); "
                "a reward or environment service never lives there"]
    if address is not None and any(address in n for n in LINK_LOCAL):
        return [f"{field}: {shown} is a link-local address (169.254.0.0/16, fe80::/10: instance metadata, the "
                "node's own agents); point it at the service's cluster DNS name"]
    if host == "kubernetes" or host.startswith("kubernetes.default"):
        return [f"{field}: {shown} is the cluster's API server; the job would post completions to it; point it "
                "at the service's own address"]
    loopback = host == "localhost" or host.endswith(".localhost") or host in ("0.0.0.0", "::") or (
        address is not None and address.is_loopback)
    if loopback and not local:
        return [f"{field}: {shown} is loopback: in a cluster that is the rollout pod itself, where no service "
                "runs; give the service's cluster address (http://<service>.<namespace>.svc:<port>/...), or "
                "validate with --local for a run on this machine"]
    return []
