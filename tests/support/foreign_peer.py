"""A process from outside the job that tries a group's store: ``python foreign_peer.py HOST PORT``.

Three attempts, each on its own connection, and one JSON line on stdout saying how each ended:

- ``tcpstore``: speaks first, as torch's ``TCPStore`` client does (a query byte and its 4-byte validation
  number), then would send a ``set``;
- ``frame``: skips the handshake and sends a well-formed store frame (``set`` of a key) straight away;
- ``wrong_token``: runs the real handshake with a token of its own (a guess), then tries a ``set``.

``closed`` = the store hung up on it; ``answered`` = it got a reply to its ``set`` (the store let it in).
Stdlib only (and the wire module, which is stdlib only): it starts in milliseconds.
"""

import json
import secrets
import socket
import struct
import sys

from asyncrl.trainer.collective import wire


def _drain(sock: socket.socket) -> str:
    try:
        while sock.recv(4096):
            pass
    except OSError:  # a reset (the store closed with our bytes unread) is a hang-up too
        pass
    return "closed"


def tcpstore(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01set-me-if-you-can")
        return _drain(s)


def frame(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=30) as s:
        body = json.dumps({"op": "set", "key": "foreign", "value": "ZXZpbA=="}).encode()
        s.sendall(struct.pack(">I", len(body)) + body + bytes(32))
        return _drain(s)


def wrong_token(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=30) as s:
        try:
            session = wire.client_handshake(s, secrets.token_bytes(32))
        except (wire.AuthError, EOFError, OSError):
            return _drain(s)
        session.send({"op": "set", "key": "foreign", "value": "ZXZpbA=="})
        session.recv()
        return "answered"


if __name__ == "__main__":
    host, port = sys.argv[1], int(sys.argv[2])
    print(json.dumps({f.__name__: f(host, port) for f in (tcpstore, frame, wrong_token)}))
