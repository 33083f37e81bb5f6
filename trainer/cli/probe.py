"""``asyncrl probe``: a worker pod's start-up and readiness checks against the job's Ray GCS.

    gcs      the worker pod's init container (KubeRay's ``wait-gcs-ready``): wait, at most
             ``--wait`` seconds, until the head's GCS answers an authenticated request; one log line
             per attempt that says what is missing. Exit 0 when it answers, 1 when the time is up,
             2 when the GCS refuses this pod's Ray token (waiting does not fix that).
    joined   the worker pod's readiness probe: exit 0 when the GCS lists an ALIVE node with this pod's
             IP that advertises ``--resource`` (the role resource of the pod's ``ray start``), i.e.
             this pod's raylet has joined the job's Ray cluster; 1 otherwise, with the reason.

Both talk to the GCS through Ray's own client, so they carry the pod's ``RAY_AUTH_MODE`` /
``RAY_AUTH_TOKEN`` exactly as ``ray start`` does; a plain TCP check first keeps a dead head from
costing the client's own connect timeout. The node IP is found as ``ray start`` finds it (the
address this host uses to reach the GCS), unless ``--node-ip`` names it.
"""

import socket
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

ALIVE = "ALIVE"


class TokenRefusedError(RuntimeError):
    """The GCS answered but refused this process's Ray token."""


@dataclass(frozen=True)
class NodeView:
    """What the probes need of one GCS node record."""

    ip: str
    state: str  # ALIVE | DEAD
    resources: Mapping[str, float]
    is_head: bool = False


# ------------------------------------------------------------------------- pure

def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port), or ValueError naming the expected form."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--address {address!r} must be HOST:PORT, e.g. job-driver-0.job.ns.svc:6379")
    return host, int(port)


def has_joined(nodes: Iterable[NodeView], node_ip: str, resource: str) -> bool:
    """Whether an ALIVE node at ``node_ip`` advertises ``resource`` (one pod = one such node)."""
    return any(n.state == ALIVE and n.ip == node_ip and n.resources.get(resource, 0.0) > 0 for n in nodes)


def describe(nodes: Iterable[NodeView], node_ip: str, resource: str) -> str:
    """Why :func:`has_joined` is False, for the probe's output (kubectl describe pod shows it)."""
    here = [n for n in nodes if n.ip == node_ip]
    if not here:
        return f"no Ray node with IP {node_ip} is registered with the GCS yet"
    alive = [n for n in here if n.state == ALIVE]
    if not alive:
        return f"the Ray node at {node_ip} is {here[0].state}, not ALIVE"
    return f"the Ray node at {node_ip} does not advertise the resource {resource!r} (ray start --resources)"


def wait_for(check: Callable[[], str | None], *, wait_s: float, interval_s: float = 2.0,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
             say: Callable[[str], None] = print) -> bool:
    """Call ``check`` (None: ready, else why not) until ready or ``wait_s`` passed; one line per attempt."""
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        why = check()
        waited = clock() - start
        if why is None:
            say(f"ready after {waited:.0f} s ({attempt} attempts)")
            return True
        if waited >= wait_s:
            say(f"gave up after {waited:.0f} s ({attempt} attempts): {why}")
            return False
        say(f"waiting ({waited:.0f} of {wait_s:g} s): {why}")
        sleep(interval_s)


# ------------------------------------------------------------------------- Ray's GCS

def port_open(host: str, port: int, timeout_s: float = 2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _untyped(module: str) -> Any:
    """One of Ray's compiled or generated modules (they ship no type information)."""
    import importlib

    return importlib.import_module(module)


def gcs_nodes(address: str, timeout_s: float = 5.0) -> list[NodeView]:
    """Every node the GCS at ``address`` knows (alive and dead), through Ray's authenticated client."""
    from ray.exceptions import AuthenticationError

    try:
        client = _untyped("ray._raylet").GcsClient(address=address)
        info = client.get_all_node_info(timeout=timeout_s)
    except AuthenticationError as exc:
        raise TokenRefusedError(
            f"the GCS at {address} refused this pod's Ray token ({exc}); the pods of one job must share "
            "RAY_AUTH_TOKEN (the job's Secret) -- recreate the job if its Secret was replaced"
        ) from exc
    return [_node_view(n) for n in info.values()]


def _node_view(n: Any) -> NodeView:
    state = _untyped("ray.core.generated.gcs_pb2").GcsNodeInfo.GcsNodeState.Name(n.state)
    return NodeView(ip=n.node_manager_address, state=state,
                    resources=dict(n.resources_total), is_head=bool(n.is_head_node))


def local_node_ip(address: str) -> str:
    """This host's IP as ``ray start --address`` picks it (the route to the GCS)."""
    from ray._private import services

    return str(services.get_node_ip_address(services.canonicalize_bootstrap_address_or_die(address)))


def gcs_check(address: str) -> str | None:
    """None when the GCS at ``address`` answers an authenticated request, else why not."""
    host, port = split_address(address)
    if not port_open(host, port):
        return f"nothing accepts connections on {address} yet (is the driver pod running?)"
    try:
        gcs_nodes(address)
    except TokenRefusedError:
        raise
    except Exception as exc:  # noqa: BLE001 -- not up yet: say so and try again
        return f"the GCS at {address} does not answer yet ({type(exc).__name__}: {exc})"
    return None


def joined_check(address: str, resource: str, node_ip: str | None = None) -> str | None:
    """None when this host's raylet is an ALIVE node advertising ``resource``, else why not."""
    host, port = split_address(address)
    if not port_open(host, port):
        return f"the GCS at {address} is unreachable"
    ip = node_ip or local_node_ip(address)
    nodes = gcs_nodes(address)
    return None if has_joined(nodes, ip, resource) else describe(nodes, ip, resource)


# ------------------------------------------------------------------------- the CLI commands

def run_gcs(address: str, wait_s: float, interval_s: float = 2.0) -> int:
    split_address(address)
    try:
        ok = wait_for(lambda: gcs_check(address), wait_s=wait_s, interval_s=interval_s,
                      say=lambda s: print(f"asyncrl probe gcs {address}: {s}", flush=True))
    except TokenRefusedError as exc:
        print(f"asyncrl probe gcs: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


def run_joined(address: str, resource: str, node_ip: str | None = None) -> int:
    try:
        why = joined_check(address, resource, node_ip)
    except TokenRefusedError as exc:
        print(f"asyncrl probe joined: {exc}", file=sys.stderr)
        return 1
    if why is not None:
        print(f"asyncrl probe joined: not ready: {why}", file=sys.stderr)
        return 1
    print(f"asyncrl probe joined: this pod's Ray node ({resource}) is ALIVE in the cluster at {address}")
    return 0
