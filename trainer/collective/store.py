"""The group's key-value store, authenticated: :class:`StoreServer`, run by rank 0 (the members' side is
:class:`~.client.AuthStore`).

The semantics follow ``TCPStore``'s, which gloo, NCCL and ``init_process_group`` expect: ``get`` and
``wait`` block until the keys exist or the given timeout passes, ``add`` keeps a decimal counter,
``compare_set`` sets when the value (or, for a missing key, the empty ``expected``) matches and returns
the value after.

The server (threads in rank 0's process, started before rank 0 joins) binds the endpoint's address only
and serves a connection only after it proved the token (:mod:`.wire`). A connection that does not is
closed and counted (:attr:`StoreServer.refused`, a warning in the log); at most :data:`MAX_PENDING`
connections may be in their handshake at once (each has :data:`HANDSHAKE_TIMEOUT_S`), the rest are closed
unread, so silent connections cannot pile up threads. What members send is checked too: key lengths,
list lengths, timeouts, and a cap on what the store holds (:data:`MAX_STORED_BYTES`).
"""

import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from asyncrl.trainer.collective.endpoint import Endpoint, family
from asyncrl.trainer.collective.wire import AuthError, WireError, decode_bytes, encode_bytes, server_handshake

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0  # a member's handshake takes milliseconds; a silent connection is dropped after this
MAX_PENDING = 32  # connections in their handshake at once (more are closed unread)
MAX_KEY_CHARS = 4096
MAX_KEYS_PER_CALL = 65536
MAX_STORED_BYTES = 256 << 20  # keys and values together; torch keeps KiB per rank in a group's store
MAX_TIMEOUT_S = 7 * 24 * 3600.0
_LOGGED_REFUSALS = 5  # the first refusals are logged one by one, then every 100th


class StoreServer:
    """The group's store on ``endpoint`` (binds ``endpoint.host`` only); :meth:`close` stops it."""

    def __init__(self, endpoint: Endpoint, *, handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 max_pending: int = MAX_PENDING) -> None:
        self.endpoint = endpoint
        self._handshake_timeout_s = handshake_timeout_s
        self._max_pending = max_pending
        try:
            self._sock = socket.create_server((endpoint.host, endpoint.port), family=family(endpoint.host),
                                              backlog=128)
        except OSError as exc:
            raise OSError(f"collective store: cannot listen on {endpoint} ({exc.strerror}); the port was taken "
                          "after it was picked, start the group again for a new one") from exc
        self._data: dict[str, bytes] = {}
        self._stored = 0
        self._cond = threading.Condition()
        self._lock = threading.Lock()  # counters and the connection set
        self._conns: set[socket.socket] = set()
        self._pending = 0
        self.accepted = 0  # connections that proved the token
        self.refused = 0  # connections closed for a missing or wrong proof, or unread when too many were pending
        self.closed = False
        self._ops: dict[str, Callable[[dict[str, Any]], Any]] = {
            "set": self._set, "get": self._get, "add": self._add, "compare_set": self._compare_set,
            "check": self._check, "wait": self._wait, "delete_key": self._delete_key, "num_keys": self._num_keys,
            "append": self._append, "multi_get": self._multi_get, "multi_set": self._multi_set,
        }
        threading.Thread(target=self._accept_loop, name=f"collective-store-{endpoint.port}", daemon=True).start()

    # ------------------------------------------------------------------ connections
    def close(self) -> None:
        """Stop listening, drop every connection and wake every blocked ``get``/``wait`` (they fail)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            conns = list(self._conns)
        try:  # wakes the thread blocked in accept() (close() alone leaves it listening on Linux)
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._cond:
            self._cond.notify_all()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, addr = self._sock.accept()
            except OSError:
                return  # closed
            if self.closed:
                conn.close()
                return
            with self._lock:
                busy = self._pending >= self._max_pending
                if not busy:
                    self._pending += 1
                    self._conns.add(conn)
            if busy:
                self._refuse(addr, f"{self._max_pending} connections already in their handshake")
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def _refuse(self, addr: Any, why: str) -> None:
        with self._lock:
            self.refused += 1
            n = self.refused
        if n <= _LOGGED_REFUSALS or n % 100 == 0:
            log.warning("collective store %s: refused a connection from %s (%s); %d refused so far",
                        self.endpoint, _peer(addr), why, n)

    def _serve(self, conn: socket.socket, addr: Any) -> None:
        admitted = threading.Event()  # the proof checked: counted as accepted, no longer pending

        def admit() -> None:
            with self._lock:
                self._pending -= 1
                self.accepted += 1
            admitted.set()

        try:
            conn.settimeout(self._handshake_timeout_s)
            try:
                session = server_handshake(conn, self.endpoint.token, admit)
            except (AuthError, WireError, EOFError, OSError) as exc:
                if not admitted.is_set():
                    self._refuse(addr, str(exc) if not isinstance(exc, TimeoutError) else "no proof within "
                                 f"{self._handshake_timeout_s:g} s")
                return
            conn.settimeout(None)
            while not self.closed:
                request = session.recv()
                session.send(self._answer(request))
        except (WireError, EOFError, OSError) as exc:
            if not self.closed and not isinstance(exc, EOFError):
                log.warning("collective store %s: dropped a member's connection: %s", self.endpoint, exc)
        finally:
            with self._lock:
                if not admitted.is_set():
                    self._pending -= 1
                self._conns.discard(conn)
            conn.close()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        handler = self._ops.get(op) if isinstance(op, str) else None
        if handler is None:
            return {"error": f"unknown op {op!r}; valid: {sorted(self._ops)}", "kind": "bad"}
        try:
            return {"ok": handler(request)}
        except TimeoutError as exc:
            return {"error": str(exc), "kind": "timeout"}
        except (ValueError, WireError) as exc:
            return {"error": str(exc), "kind": "bad"}

    # ------------------------------------------------------------------ operations (hold self._cond)
    def _store(self, key: str, value: bytes) -> None:
        old = self._data.get(key)
        grow = len(value) + (len(key) if old is None else -len(old))
        if self._stored + grow > MAX_STORED_BYTES:
            raise ValueError(f"the store would hold more than {MAX_STORED_BYTES} bytes")
        self._data[key] = value
        self._stored += grow
        self._cond.notify_all()

    def _until(self, keys: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(k in self._data for k in keys):
            left = deadline - time.monotonic()
            if self.closed:
                raise TimeoutError("the store is closing")
            if left <= 0:
                missing = [k for k in keys if k not in self._data]
                raise TimeoutError(f"keys {missing[:4]} not set within {timeout_s:g} s")
            self._cond.wait(left)

    def _set(self, r: dict[str, Any]) -> None:
        with self._cond:
            self._store(_key(r), decode_bytes("value", r.get("value")))

    def _get(self, r: dict[str, Any]) -> str:
        key = _key(r)
        with self._cond:
            self._until([key], _timeout(r))
            return encode_bytes(self._data[key])

    def _add(self, r: dict[str, Any]) -> int:
        key, amount = _key(r), _int(r, "amount")
        with self._cond:
            raw = self._data.get(key, b"0")
            try:
                value = int(raw.decode("ascii")) + amount
            except (UnicodeDecodeError, ValueError):
                raise ValueError(f"add: key {key!r} holds a value that is not a counter") from None
            self._store(key, str(value).encode("ascii"))
            return value

    def _compare_set(self, r: dict[str, Any]) -> str:
        key = _key(r)
        expected, desired = decode_bytes("expected", r.get("expected")), decode_bytes("desired", r.get("desired"))
        with self._cond:
            current = self._data.get(key)
            if (current is None and expected == b"") or (current is not None and current == expected):
                self._store(key, desired)
                return encode_bytes(desired)
            return encode_bytes(expected if current is None else current)

    def _check(self, r: dict[str, Any]) -> bool:
        keys = _keys(r)
        with self._cond:
            return all(k in self._data for k in keys)

    def _wait(self, r: dict[str, Any]) -> None:
        keys, timeout_s = _keys(r), _timeout(r)
        with self._cond:
            self._until(keys, timeout_s)

    def _delete_key(self, r: dict[str, Any]) -> bool:
        key = _key(r)
        with self._cond:
            value = self._data.pop(key, None)
            if value is not None:
                self._stored -= len(key) + len(value)
            return value is not None

    def _num_keys(self, r: dict[str, Any]) -> int:
        with self._cond:
            return len(self._data)

    def _append(self, r: dict[str, Any]) -> None:
        key, value = _key(r), decode_bytes("value", r.get("value"))
        with self._cond:
            self._store(key, self._data.get(key, b"") + value)

    def _multi_get(self, r: dict[str, Any]) -> list[str]:
        keys = _keys(r)
        with self._cond:
            self._until(keys, _timeout(r))
            return [encode_bytes(self._data[k]) for k in keys]

    def _multi_set(self, r: dict[str, Any]) -> None:
        keys, values = _keys(r), r.get("values")
        if not isinstance(values, list) or len(values) != len(keys):
            raise ValueError(f"multi_set: values must be a list as long as keys ({len(keys)})")
        decoded = [decode_bytes(f"values[{i}]", v) for i, v in enumerate(values)]
        with self._cond:
            for k, v in zip(keys, decoded, strict=True):
                self._store(k, v)


def _peer(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


def _key(r: dict[str, Any], field: str = "key") -> str:
    key = r.get(field)
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
        raise ValueError(f"{field} must be a string of at most {MAX_KEY_CHARS} characters")
    return key


def _keys(r: dict[str, Any]) -> list[str]:
    keys = r.get("keys")
    if not isinstance(keys, list) or len(keys) > MAX_KEYS_PER_CALL:
        raise ValueError(f"keys must be a list of at most {MAX_KEYS_PER_CALL} strings")
    return [_key({"k": k}, "k") for k in keys]


def _int(r: dict[str, Any], field: str) -> int:
    v = r.get(field)
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"{field} must be an integer, got {v!r}")
    return v


def _timeout(r: dict[str, Any]) -> float:
    v = r.get("timeout_s")
    if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or not 0 <= v <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be a number of seconds in [0, {MAX_TIMEOUT_S:g}], got {v!r}")
    return float(v)
