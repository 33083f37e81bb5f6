"""A member's side of the group's store: :class:`AuthStore`, a ``torch.distributed.Store``.

``ProcessGroupGloo``, ``ProcessGroupNCCL`` and ``init_process_group(store=...)`` use it as they would a
``TCPStore``: they exchange rank addresses and NCCL's unique id through it and wait on each other's keys.
Every call is one request frame and one reply frame on an authenticated session (:mod:`.wire`) with
rank 0's :class:`~.store.StoreServer`. A member opens one connection per thread that uses the store
(NCCL's watchdog checks keys from its own thread while the main thread may be blocked in a ``get``).
"""

import datetime
import socket
import threading
import time
from typing import Any

import torch.distributed as dist

from asyncrl.trainer.collective.endpoint import Endpoint, family
from asyncrl.trainer.collective.store import HANDSHAKE_TIMEOUT_S, MAX_TIMEOUT_S
from asyncrl.trainer.collective.wire import (
    AuthError,
    Session,
    WireError,
    client_handshake,
    decode_bytes,
    encode_bytes,
)


class StoreAuthError(ConnectionError):
    """This member could not authenticate with the group's store (or the store with it)."""


_CONNECT_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # the server may not listen yet: rank 0 starts with the others
_REPLY_MARGIN_S = 30.0  # a blocking call's socket waits this much longer than the call's own timeout


class AuthStore(dist.Store):
    """A member's view of the group's store at ``endpoint`` (``timeout``: how long ``get``/``wait`` block, and
    how long the first connection may take while rank 0's server starts). Connects and authenticates at once,
    so a wrong token fails here (:class:`StoreAuthError`).

    Keep the object alive as long as torch may use it: a process group holds only the C++ side, and once the
    Python object is collected torch cannot find these methods any more ("fn INTERNAL ASSERT FAILED ... Not
    implemented" at the group's next use of the store, e.g. megatron's ``new_group``)."""

    def __init__(self, endpoint: Endpoint, timeout: datetime.timedelta) -> None:
        super().__init__()
        self.set_timeout(timeout)
        self._endpoint = endpoint
        self._deadline = time.monotonic() + timeout.total_seconds()  # for connections of the rendezvous
        self._local = threading.local()
        self._clones: list[AuthStore] = []
        self._session()

    def _session(self) -> Session:
        session: Session | None = getattr(self._local, "session", None)
        if session is None:
            session = self._connect()
            self._local.session = session
        return session

    def _connect(self) -> Session:
        ep = self._endpoint
        attempt = 0
        while True:
            sock = socket.socket(family(ep.host))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            try:
                sock.connect((ep.host, ep.port))
                session = client_handshake(sock, ep.token)
                sock.settimeout(None)
                return session
            except AuthError as exc:
                sock.close()
                raise StoreAuthError(f"collective store {ep}: {exc}") from None
            except (OSError, EOFError) as exc:  # not listening yet, or turned away unread while busy
                sock.close()
                if time.monotonic() >= self._deadline:
                    raise dist.DistNetworkError(f"collective store {ep}: no connection within the store's "
                                                f"timeout ({type(exc).__name__}: {exc})") from None
                time.sleep(_CONNECT_RETRY_S[min(attempt, len(_CONNECT_RETRY_S) - 1)])
                attempt += 1

    def _call(self, op: str, wait_s: float = 0.0, **args: Any) -> Any:
        session = self._session()
        session.sock.settimeout(wait_s + _REPLY_MARGIN_S)
        try:
            session.send({"op": op, **args})
            reply = session.recv()
        except (OSError, EOFError, WireError) as exc:
            self._local.session = None
            session.sock.close()
            raise dist.DistNetworkError(f"collective store {self._endpoint}: {op} failed "
                                        f"({type(exc).__name__}: {exc})") from None
        if "error" in reply:
            kind = dist.DistStoreError if reply.get("kind") == "timeout" else ValueError
            raise kind(f"collective store {self._endpoint}: {op}: {reply['error']}")
        return reply.get("ok")

    def _store_timeout(self) -> datetime.timedelta:
        """``Store.timeout`` (what ``set_timeout`` and torch's ``init_process_group(timeout=)`` set)."""
        return self.timeout  # type: ignore[attr-defined,no-any-return]  # the property is missing from torch's stubs

    def _timeout_s(self, timeout: datetime.timedelta | None = None) -> float:
        t = (timeout if timeout is not None else self._store_timeout()).total_seconds()
        return MAX_TIMEOUT_S if t <= 0 else min(t, MAX_TIMEOUT_S)  # torch's 0 means "no timeout"

    # ------------------------------------------------------------------ torch.distributed.Store
    def clone(self) -> "AuthStore":  # type: ignore[override]
        """Another client of the same store (as ``TCPStore.clone``); kept alive with this one (see below)."""
        twin = AuthStore(self._endpoint, self._store_timeout())
        self._clones.append(twin)
        return twin

    def set(self, key: str, value: bytes | str) -> None:  # type: ignore[override]
        self._call("set", key=key, value=encode_bytes(_bytes(value)))

    def get(self, key: str) -> bytes:  # type: ignore[override]
        t = self._timeout_s()
        return decode_bytes("value", self._call("get", t, key=key, timeout_s=t))

    def add(self, key: str, value: int) -> int:  # type: ignore[override]
        return int(self._call("add", key=key, amount=int(value)))

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:  # type: ignore[override]
        out = self._call("compare_set", key=key, expected=encode_bytes(_bytes(expected_value)),
                         desired=encode_bytes(_bytes(desired_value)))
        return decode_bytes("value", out)

    def check(self, keys: list[str]) -> bool:  # type: ignore[override]
        return bool(self._call("check", keys=list(keys)))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:  # type: ignore[override]
        t = self._timeout_s(timeout)
        self._call("wait", t, keys=list(keys), timeout_s=t)

    def delete_key(self, key: str) -> bool:  # type: ignore[override]
        return bool(self._call("delete_key", key=key))

    def num_keys(self) -> int:  # type: ignore[override]
        return int(self._call("num_keys"))

    def append(self, key: str, value: bytes | str) -> None:  # type: ignore[override]
        self._call("append", key=key, value=encode_bytes(_bytes(value)))

    def multi_get(self, keys: list[str]) -> list[bytes]:  # type: ignore[override]
        t = self._timeout_s()
        return [decode_bytes("value", v) for v in self._call("multi_get", t, keys=list(keys), timeout_s=t)]

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:  # type: ignore[override]
        self._call("multi_set", keys=list(keys), values=[encode_bytes(_bytes(v)) for v in values])


def _bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
