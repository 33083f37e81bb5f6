"""The store's handshake and framing: each side proves the group's token, then every frame is tagged.

Handshake (``K`` = the group's token, ``|`` = concatenation, ``H(k, m)`` = HMAC-SHA256)::

    server -> client   MAGIC | n_s                        (n_s: 32 random bytes)
    client -> server   MAGIC | n_c | H(K, "client" | n_s | n_c)
    server -> client   H(K, "server" | n_c | n_s)

The server checks the client's proof before it reads anything else and closes the connection
otherwise; the client checks the server's proof before it trusts a single value (a process that took
the port after the real server died cannot feed the members). The token itself never crosses the
socket. Both sides derive the session key ``k = H(K, "session" | n_s | n_c)``.

Frames, both ways: ``length`` (4 bytes, big endian, at most :data:`MAX_FRAME_BYTES`, checked before
anything is allocated) | ``body`` (UTF-8 JSON, an object) | ``H(k, direction | seq | body)``, where
``seq`` counts the frames of that direction (a replayed, reordered or injected frame fails its tag).
Bytes values travel base64-encoded. This gives integrity, not secrecy: someone who can read the
pod network sees the keys and values (rank addresses) but cannot forge or alter a request.
"""

import base64
import hashlib
import hmac
import json
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any

MAGIC = b"asyncrl-store/1\n"  # 16 bytes: what a client and a server say first
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_FRAME_BYTES = 4 << 20  # a frame's body; the largest value torch stores is a rank's address list (KiB)
_LEN = struct.Struct(">I")
_SEQ = struct.Struct(">Q")


class AuthError(ConnectionError):
    """The peer did not prove the group's token (or is not an asyncrl store peer at all)."""


class WireError(ConnectionError):
    """A frame broke the framing rules (length over the cap, bad tag, not a JSON object)."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly ``n`` bytes from ``sock``; :class:`EOFError` when the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError(f"the peer closed the connection after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def recv_magic(sock: socket.socket) -> None:
    """Read :data:`MAGIC`, refusing at the first byte that differs: a foreign client (a ``TCPStore``
    speaking its own protocol, a port scanner) is refused at once instead of after the handshake timeout."""
    got = b""
    while len(got) < len(MAGIC):
        chunk = sock.recv(len(MAGIC) - len(got))
        if not chunk:
            raise EOFError(f"the peer closed the connection after {len(got)} bytes of the greeting")
        got += chunk
        if not MAGIC.startswith(got):
            raise AuthError(f"not an asyncrl store peer: the greeting starts {got[:8]!r}")


class Session:
    """One authenticated connection: :meth:`send` and :meth:`recv` JSON objects as tagged frames."""

    def __init__(self, sock: socket.socket, key: bytes, *, out_dir: bytes, in_dir: bytes) -> None:
        self.sock = sock
        self._key = key
        self._out, self._in = out_dir, in_dir
        self._sent = self._received = 0

    def send(self, obj: dict[str, Any]) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        if len(body) > MAX_FRAME_BYTES:
            raise WireError(f"collective store: a {len(body)}-byte frame is over the {MAX_FRAME_BYTES}-byte cap")
        tag = _mac(self._key, self._out, _SEQ.pack(self._sent), body)
        self._sent += 1
        self.sock.sendall(_LEN.pack(len(body)) + body + tag)

    def recv(self) -> dict[str, Any]:
        (n,) = _LEN.unpack(recv_exact(self.sock, _LEN.size))
        if n > MAX_FRAME_BYTES:
            raise WireError(f"collective store: a frame announces {n} bytes; the cap is {MAX_FRAME_BYTES}")
        body = recv_exact(self.sock, n)
        tag = recv_exact(self.sock, MAC_BYTES)
        if not hmac.compare_digest(tag, _mac(self._key, self._in, _SEQ.pack(self._received), body)):
            raise WireError(f"collective store: frame {self._received} fails its HMAC (altered or injected)")
        self._received += 1
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise WireError(f"collective store: frame {self._received - 1} is not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise WireError(f"collective store: frame {self._received - 1} is a {type(obj).__name__}, not an object")
        return obj


def server_handshake(sock: socket.socket, token: bytes, on_verified: Callable[[], None] = lambda: None) -> Session:
    """The server's side: greet, check the client's proof (:class:`AuthError` if wrong), call ``on_verified``
    (so what it counts is counted before the client can know it got in), prove ours."""
    nonce_s = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(MAGIC + nonce_s)
    recv_magic(sock)
    nonce_c = recv_exact(sock, NONCE_BYTES)
    proof = recv_exact(sock, MAC_BYTES)
    if not hmac.compare_digest(proof, _mac(token, b"client", nonce_s, nonce_c)):
        raise AuthError("the client's proof does not match this group's token")
    on_verified()
    sock.sendall(_mac(token, b"server", nonce_c, nonce_s))
    return Session(sock, _mac(token, b"session", nonce_s, nonce_c), out_dir=b"S", in_dir=b"C")


def client_handshake(sock: socket.socket, token: bytes) -> Session:
    """The client's side: read the greeting, prove the token, check the server's proof (:class:`AuthError`).

    :class:`EOFError` before the greeting means the server turned the connection away unread (busy:
    worth retrying); after our proof it means the server refused the token."""
    recv_magic(sock)
    nonce_s = recv_exact(sock, NONCE_BYTES)
    nonce_c = secrets.token_bytes(NONCE_BYTES)
    sock.sendall(MAGIC + nonce_c + _mac(token, b"client", nonce_s, nonce_c))
    try:
        proof = recv_exact(sock, MAC_BYTES)
    except EOFError:
        raise AuthError("the store closed the connection on this member's token (another group's endpoint?)") from None
    if not hmac.compare_digest(proof, _mac(token, b"server", nonce_c, nonce_s)):
        raise AuthError("the store's proof does not match this group's token (not the group's store)")
    return Session(sock, _mac(token, b"session", nonce_s, nonce_c), out_dir=b"C", in_dir=b"S")


def encode_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def decode_bytes(field: str, value: object) -> bytes:
    """A base64 string from a frame back to bytes; :class:`WireError` naming ``field`` otherwise."""
    if not isinstance(value, str):
        raise WireError(f"collective store: {field} must be a base64 string, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise WireError(f"collective store: {field} is not valid base64") from None
