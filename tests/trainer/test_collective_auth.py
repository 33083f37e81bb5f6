"""The collective groups' store is authenticated (trainer/collective): a process without the group's token is
refused and counted, cannot set or read a key, and the members still form the group and broadcast a version
bit for bit; a member refuses a store that cannot prove the token; the store binds the address it was given.

Before: ``TCPStore`` listened on every interface (``ss``: ``*:<port>``) and a foreign client listed the keys
and overwrote one. The groups here are real gloo groups of three members in threads of this process (the
store's server runs in rank 0's thread, as it does in rank 0's process); the foreign peer is a real process.
"""

import datetime
import json
import logging
import secrets
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from asyncrl.trainer.collective import wire
from asyncrl.trainer.collective.client import AuthStore, StoreAuthError
from asyncrl.trainer.collective.endpoint import LOOPBACK, Endpoint, bind_host, new_endpoint
from asyncrl.trainer.collective.groups import join
from asyncrl.trainer.collective.store import StoreServer
from asyncrl.trainer.megatron.parallel import Layout, rendezvous
from asyncrl.trainer.weight_sync.broadcast import SyncGroup, open_group, receive_version, send
from asyncrl.trainer.weight_sync.buckets import pack_buckets

WORLD = 3
TIMEOUT = datetime.timedelta(seconds=60)
FOREIGN = Path(__file__).resolve().parents[1] / "support" / "foreign_peer.py"


@pytest.fixture
def server() -> Any:
    s = StoreServer(new_endpoint(LOOPBACK))
    yield s
    s.close()


def _members(endpoint: Endpoint, body: Callable[[int], Any]) -> list[Any]:
    """``body(rank)`` for every rank of a WORLD-member group at once (each blocks in the rendezvous)."""
    with ThreadPoolExecutor(WORLD) as pool:
        return list(pool.map(body, range(WORLD)))


def _model(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {"w": torch.randn(40, 30, generator=g), "b": torch.randn(7, generator=g)}


def _broadcast(groups: list[SyncGroup], version: int) -> list[dict[str, torch.Tensor]]:
    def member(rank: int) -> dict[str, torch.Tensor]:
        if rank == 0:
            send(groups[0], pack_buckets(_model(version).items(), version=version, bucket_bytes=4096))
            return {}
        return {k: v.clone() for k, v in receive_version(groups[rank], version).state.items()}

    return _members(groups[0].server.endpoint, member)


def test_a_foreign_process_is_refused_counted_and_cannot_touch_the_group(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="asyncrl.trainer.collective.store")
    endpoint = new_endpoint(LOOPBACK)
    groups = _members(endpoint, lambda r: open_group(endpoint, r, WORLD, backend="gloo", timeout_s=60))
    server = groups[0].server
    keys_before = groups[1].store.num_keys()  # this thread's own connection (one per member and thread)
    members_in = server.accepted
    assert members_in >= WORLD and server.refused == 0

    out = subprocess.run([sys.executable, str(FOREIGN), endpoint.host, str(endpoint.port)], capture_output=True,
                         text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == {"tcpstore": "closed", "frame": "closed", "wrong_token": "closed"}
    assert (server.accepted, server.refused) == (members_in, 3)  # every attempt counted, none let in
    assert caplog.text.count("refused a connection from 127.0.0.1:") == 3

    # torch's own TCPStore client (what a stray `init_process_group(tcp://...)` would use) gets nowhere either.
    with pytest.raises(dist.DistError):
        dist.TCPStore(endpoint.host, endpoint.port, WORLD, False, timeout=datetime.timedelta(seconds=1))
    assert server.refused >= 4 and server.accepted == members_in
    # Nothing the foreign peers sent reached the store, and the group broadcasts a version bit for bit.
    assert groups[1].store.num_keys() == keys_before and not groups[1].store.check(["foreign"])
    got = _broadcast(groups, version=1)
    expected = _model(1)
    for state in got[1:]:
        assert sorted(state) == ["b", "w"] and all(torch.equal(state[k], expected[k]) for k in expected)


def test_a_member_with_another_token_is_refused_and_the_store_still_serves(server: StoreServer) -> None:
    ep = server.endpoint
    with pytest.raises(StoreAuthError, match="closed the connection on this member's token"):
        AuthStore(Endpoint(ep.host, ep.port, secrets.token_bytes(32)), TIMEOUT)
    assert (server.accepted, server.refused) == (0, 1)
    member = AuthStore(ep, TIMEOUT)
    member.set("k", b"\x00\xff v")
    assert member.get("k") == b"\x00\xff v" and member.add("n", 2) == 2 and member.add("n", 3) == 5
    assert member.compare_set("k", b"other", b"new") == b"\x00\xff v"  # no match: the value stays
    assert member.compare_set("k", b"\x00\xff v", b"new") == b"new"
    assert member.compare_set("fresh", b"", b"first") == b"first"  # a missing key with expected "" is set
    assert (server.accepted, server.refused) == (1, 1)


def test_a_member_refuses_a_store_that_cannot_prove_the_token() -> None:
    """Someone who took the port (the real server gone) and greets correctly but cannot prove the token."""
    listener = socket.create_server((LOOPBACK, 0))
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def impostor() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(wire.MAGIC + secrets.token_bytes(wire.NONCE_BYTES))
            seen.append(wire.recv_exact(conn, len(wire.MAGIC) + wire.NONCE_BYTES + wire.MAC_BYTES))
            conn.sendall(secrets.token_bytes(wire.MAC_BYTES))  # a guessed proof
            conn.recv(1)  # until the member hangs up

    t = threading.Thread(target=impostor)
    t.start()
    token = secrets.token_bytes(32)
    with pytest.raises(StoreAuthError, match="store's proof does not match"):
        AuthStore(Endpoint(LOOPBACK, port, token), TIMEOUT)
    t.join(timeout=30)
    listener.close()
    assert len(seen) == 1 and token not in seen[0]  # the token itself never crossed the socket


def test_the_store_waits_for_keys_and_times_out_with_torchs_error(server: StoreServer) -> None:
    a, b = AuthStore(server.endpoint, TIMEOUT), AuthStore(server.endpoint, TIMEOUT)
    done = threading.Event()
    got: list[bytes] = []

    def reader() -> None:
        got.append(a.get("late"))  # blocks until b sets it
        done.set()

    t = threading.Thread(target=reader)
    t.start()
    b.set("late", "v")
    assert done.wait(30) and got == [b"v"]
    t.join()
    b.set_timeout(datetime.timedelta(milliseconds=50))
    with pytest.raises(dist.DistStoreError, match=r"keys \['never'\] not set within 0.05 s"):
        b.get("never")
    with pytest.raises(ValueError, match="key must be a string of at most 4096"):
        b.set("x" * 5000, b"v")


def test_the_store_binds_only_the_address_it_was_given(server: StoreServer) -> None:
    assert server._sock.getsockname() == (LOOPBACK, server.endpoint.port)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # the machine's outward address (sends nothing)
        probe.connect(("10.255.255.255", 1))
        outward = probe.getsockname()[0]
    if outward.startswith("127."):
        pytest.fail("this machine has no address but loopback: the test needs one to connect from outside loopback")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((outward, server.endpoint.port), timeout=10).close()


def test_a_local_run_binds_loopback_and_a_cluster_the_pod_ip() -> None:
    assert bind_host("local") == LOOPBACK and bind_host("cluster") is None
    rdv = rendezvous(LOOPBACK)
    assert rdv.host == LOOPBACK and len(rdv.token) == 32 and rdv.token.hex() not in repr(rdv) + str(rdv)
    assert rendezvous(LOOPBACK).token != rdv.token  # one token per group
    with pytest.raises(ValueError, match="a tcp:// \\(TCPStore\\) rendezvous is open to anyone"):
        Layout(world=2, init_method=f"tcp://127.0.0.1:{rdv.port}")  # type: ignore[arg-type]


def test_a_group_is_reformed_with_a_new_token_and_the_old_store_stops(caplog: pytest.LogCaptureFixture) -> None:
    first = new_endpoint(LOOPBACK)
    old = _members(first, lambda r: open_group(first, r, WORLD, backend="gloo", timeout_s=60))
    old_server = old[0].server
    del old  # ActorSync / the hosts drop their group before joining the next one
    import gc

    gc.collect()
    assert old_server.closed
    with pytest.raises(ConnectionRefusedError):  # nothing listens on the old port any more
        socket.create_connection((first.host, first.port), timeout=10).close()
    second = new_endpoint(LOOPBACK)
    new = _members(second, lambda r: open_group(second, r, WORLD, backend="gloo", timeout_s=60))
    # A member still holding the old group's endpoint cannot reach the new group's store.
    with pytest.raises(StoreAuthError):
        AuthStore(Endpoint(second.host, second.port, first.token), TIMEOUT)
    got = _broadcast(new, version=2)
    assert all(torch.equal(got[r]["w"], _model(2)["w"]) for r in (1, 2))


def test_a_member_that_reaches_no_store_fails_within_its_timeout() -> None:
    ep = new_endpoint(LOOPBACK)  # its port is free again: nobody listens there
    with pytest.raises(dist.DistNetworkError, match=f"collective store {LOOPBACK}:{ep.port}: no connection within"):
        AuthStore(ep, datetime.timedelta(milliseconds=200))
    store, server = join(ep, 0, TIMEOUT)  # rank 0 serves it first, then connects as a member
    assert server is not None and server.accepted == 1 and isinstance(store, AuthStore)
    server.close()
    with pytest.raises(dist.DistNetworkError, match="set failed"):
        store.set("k", b"v")  # the server gone: one clear error, not a hang


def test_a_local_groups_sockets_all_listen_on_loopback() -> None:
    """The store and gloo's own pair sockets of a loopback group: nothing on another interface (before: the
    TCPStore on ``*``, every interface)."""
    import os
    import shutil

    if shutil.which("ss") is None:
        pytest.fail("needs ss (Debian iproute2) to list this process's listening sockets: apt-get install iproute2")
    endpoint = new_endpoint(LOOPBACK)
    groups = _members(endpoint, lambda r: open_group(endpoint, r, WORLD, backend="gloo", timeout_s=60))
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    mine = [line.split()[3] for line in out.splitlines() if f"pid={os.getpid()}," in line]
    assert f"{LOOPBACK}:{endpoint.port}" in mine and len(mine) > 1, mine  # the store and gloo's listeners
    assert all(addr.startswith(f"{LOOPBACK}:") for addr in mine), mine
    del groups
