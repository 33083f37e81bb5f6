"""Where a collective group meets: :class:`Endpoint` (host, port and the group's secret token).

Rank 0's node draws one per group (:func:`new_endpoint`): a free port on the address the members reach
and 32 random bytes. The members get it through Ray (the job's Ray token guards that channel) and
prove the token to the group's store on connect (:mod:`.wire`). The token never crosses the store's
socket, and ``repr``/``str`` of an endpoint leave it out, so it does not reach logs.

Which address (:func:`bind_host`): in a single-node local run (``asyncrl run``) every member is on this
machine, so the store binds loopback and nothing off the machine can reach it; in a cluster it binds
the pod's IP (what Ray reports as the node address), which the job's NetworkPolicy admits from the
job's own pods only.
"""

import ipaddress
import secrets
import socket
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"
TOKEN_BYTES = 32


@dataclass(frozen=True)
class Endpoint:
    """A group's store address ``host:port`` and its ``token`` (``TOKEN_BYTES`` random bytes)."""

    host: str
    port: int
    token: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 < self.port < 65536:
            raise ValueError(f"collective endpoint: port {self.port!r} must be an int in [1, 65535]")
        if not isinstance(self.token, bytes) or len(self.token) != TOKEN_BYTES:
            raise ValueError(f"collective endpoint: the token must be {TOKEN_BYTES} bytes (new_endpoint() draws one)")
        if not self.host:
            raise ValueError("collective endpoint: host is empty")

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def family(host: str) -> socket.AddressFamily:
    """The socket family of a numeric ``host`` (a pod IP may be IPv6 in a dual-stack cluster)."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def bind_host(placement: str) -> str | None:
    """The address a group's store binds: loopback for a local run, None (this node's address as Ray
    sees it, the pod IP) for ``placement == "cluster"``."""
    return None if placement == "cluster" else LOOPBACK


def new_endpoint(host: str | None = None) -> Endpoint:
    """A fresh endpoint on this node: a free port on ``host`` (default: this node's address as Ray sees it,
    the address the other members reach) and a new random token."""
    if host is None:
        import ray

        host = ray.util.get_node_ip_address()
    with socket.socket(family(host)) as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    return Endpoint(host, port, secrets.token_bytes(TOKEN_BYTES))
