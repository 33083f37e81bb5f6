"""The attacks of tests/rollout/test_hostile_agent_endpoint.py, one per row, run in a process of their own (the standard
library only, so that the attacker's CPU and memory are not the worker's): ``python hostile_agent_client.py HOST PORT
ROW WINDOW_S``; it prints ``ready`` and attacks once a line arrives on its input. Every loop is bounded (a count, and the window for the floods); the result is one JSON line.
Only ever sends to the loopback address the test gives it."""

import http.client
import json
import select
import socket
import sys
import threading
import time
from typing import Any

HOST, PORT, ROW, WINDOW_S = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
assert HOST == "127.0.0.1", "the hostile client only sends to loopback"
END = time.monotonic() + WINDOW_S
MIB = 1 << 20


def call(method: str, path: str, body: Any = None, key: str = "", raw: bytes | None = None) -> tuple[int, str, bytes]:
    c = http.client.HTTPConnection(HOST, PORT, timeout=60)
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        c.request(method, path, body=data, headers=headers)
        r = c.getresponse()
        return r.status, r.getheader("content-type") or "", r.read()
    finally:
        c.close()


def claim() -> dict[str, Any]:
    for _ in range(3000):  # the harness's own back-off while no session waits (429)
        status, _, out = call("POST", "/v1/sessions", {})
        if status == 200:
            return dict(json.loads(out))
        time.sleep(0.01)
    raise SystemExit("no session in 30 s")


def error(out: bytes) -> dict[str, Any]:
    try:
        return dict(json.loads(out)["error"])
    except (ValueError, KeyError, TypeError):
        return {"raw": out[:200].decode(errors="replace")}


def answer(status: int, ctype: str, out: bytes) -> dict[str, Any]:
    e = error(out) if status >= 400 else {}
    return {"status": status, "json": ctype.startswith("application/json"), "code": e.get("code"),
            "param": e.get("param"), "bytes": len(out)}


def chat(s: dict[str, Any], body: Any = None, raw: bytes | None = None) -> tuple[int, str, bytes]:
    return call("POST", "/v1/chat/completions", body, s["api_key"], raw)


def stream(head: bytes, total: int) -> dict[str, Any]:
    """Send ``head`` then ``total`` bytes in 1 MiB pieces of one buffer while reading the answer: how far the
    sending got before the server answered or cut the connection, and the answer's status."""
    sock = socket.create_connection((HOST, PORT), timeout=60)
    got = bytearray()
    done = threading.Event()

    def read() -> None:
        try:
            while chunk := sock.recv(65536):
                got.extend(chunk)
        except OSError:
            pass
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    piece, sent = b"a" * MIB, 0
    try:
        sock.sendall(head)
        while sent < total and not got:
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass
    done.wait(30)
    sock.close()
    line = bytes(got).split(b"\r\n", 1)[0].split()
    return {"status": int(line[1]) if len(line) > 1 else 0, "sent_mib": sent / MIB,
            "code": error(bytes(got).split(b"\r\n\r\n", 1)[-1]).get("code")}


def slowloris(n: int = 40) -> dict[str, Any]:
    """``n`` connections sending their header block a byte every 0.2 s: how each ends."""
    conns = [socket.create_connection((HOST, PORT), timeout=5) for _ in range(n)]
    for c in conns:
        c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    statuses: list[int] = []
    deadline = time.monotonic() + 30  # bounded by time, not by select calls: one call may return a single socket
    while conns and time.monotonic() < deadline:
        readable, _, _ = select.select(conns, [], [], 0.2)
        for c in readable:
            data = c.recv(4096)
            line = data.split(b"\r\n", 1)[0].split()
            statuses.append(int(line[1]) if len(line) > 1 else 0)
            conns.remove(c)
            c.close()
        for c in conns:
            try:
                c.sendall(b"a")
            except OSError:
                pass
    for c in conns:
        c.close()
    return {"statuses": statuses, "held": len(conns)}


def flood(n: int = 300) -> dict[str, Any]:
    """``n`` connections that send nothing: how each ends (503 at once over the cap, else the header timeout)."""
    conns = []
    for _ in range(n):
        try:
            conns.append(socket.create_connection((HOST, PORT), timeout=5))
        except OSError:
            break
    statuses: list[int] = []
    deadline = time.monotonic() + 30  # bounded by time, not by select calls: one call may return a single socket
    while conns and time.monotonic() < deadline:
        readable, _, _ = select.select(conns, [], [], 0.2)
        for c in readable:
            try:
                data = c.recv(4096)
            except OSError:
                data = b""
            line = data.split(b"\r\n", 1)[0].split()
            statuses.append(int(line[1]) if len(line) > 1 else 0)
            conns.remove(c)
            c.close()
    for c in conns:
        c.close()
    return {"statuses": statuses, "held": len(conns), "opened": len(statuses) + len(conns)}


def unauthorized(limit: int = 20000) -> dict[str, Any]:
    """Requests with an unknown key, one connection each (the endpoint closes it), until the window ends."""
    statuses: dict[int, int] = {}
    body = json.dumps({"model": "p", "messages": [{"role": "user", "content": "hi"}]}).encode()
    for _ in range(limit):
        if time.monotonic() > END:
            break
        try:
            status, _, _ = call("POST", "/v1/chat/completions", key="sk-nobody", raw=body)
        except OSError:
            status = 0
        statuses[status] = statuses.get(status, 0) + 1
    return {"statuses": statuses}


def budget() -> dict[str, Any]:
    """Turns with max_tokens far over the episode's maxNewTokens until one is cut: how each was answered."""
    s = claim()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    finishes: list[str] = []
    for _ in range(60):
        status, ctype, out = chat(s, {"model": "p", "messages": messages, "max_tokens": 1000})
        if status != 200:
            return {"finishes": finishes, **answer(status, ctype, out)}
        choice = json.loads(out)["choices"][0]
        finishes.append(choice["finish_reason"])
        if choice["finish_reason"] == "length":
            break
        messages += [{"role": "assistant", "content": choice["message"]["content"] or ""},
                     {"role": "user", "content": "more"}]
    return {"finishes": finishes, "status": 200}


def branches(n: int = 400) -> dict[str, Any]:
    """One session, then ``n`` requests each rewriting its history (a branch each), then the reward."""
    s = claim()
    statuses: dict[int, int] = {}
    codes: dict[str, int] = {}
    chat(s, {"model": "p", "messages": [{"role": "user", "content": "start"}], "max_tokens": 2})
    for i in range(n):
        status, _, out = chat(s, {"model": "p", "messages": [{"role": "user", "content": f"other {i}"}],
                                  "max_tokens": 2})
        statuses[status] = statuses.get(status, 0) + 1
        if status != 200:
            code = str(error(out).get("code"))
            codes[code] = codes.get(code, 0) + 1
    status, _, _ = call("POST", f"/v1/sessions/{s['id']}/reward", {"reward": 1.0}, s["api_key"])
    return {"statuses": statuses, "codes": codes, "reward_status": status, "session": s["id"]}


def row() -> dict[str, Any]:
    if ROW.startswith("reward:"):
        s = claim()
        raw = b'{"reward": ' + ROW.removeprefix("reward:").encode() + b"}"
        return answer(*call("POST", f"/v1/sessions/{s['id']}/reward", key=s["api_key"], raw=raw))
    if ROW == "after_abort":
        s = claim()
        chat(s, {"model": "p", "messages": []})  # malformed (no messages): 400, the session is aborted
        return answer(*call("POST", f"/v1/sessions/{s['id']}/reward", {"reward": 1.0}, s["api_key"]))
    if ROW == "context":
        s = claim()
        return answer(*chat(s, {"model": "p", "messages": [{"role": "user", "content": "x" * 20_000}],
                                "max_tokens": 8}))
    if ROW == "header":
        return stream(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ", 64 * MIB)
    if ROW == "body":
        s = claim()
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s['api_key']}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {512 * MIB}\r\n\r\n").encode()
        return stream(head, 512 * MIB)
    if ROW == "deep":
        s = claim()
        return answer(*chat(s, raw=b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"))
    if ROW == "role":
        s = claim()
        return answer(*chat(s, {"model": "p", "messages": [{"role": "x" * 1_000_000, "content": "hi"}]}))
    if ROW in ("tool_choice", "logit_bias"):
        s = claim()
        extra = {"tool_choice": "required"} if ROW == "tool_choice" else {"logit_bias": {"5": 100}}
        return answer(*chat(s, {"model": "p", "messages": [{"role": "user", "content": "hi"}], **extra}))
    if ROW == "slowloris":
        return slowloris()
    if ROW == "flood":
        return flood()
    if ROW == "unauthorized":
        return unauthorized()
    if ROW == "budget":
        return budget()
    if ROW.startswith("branches"):
        return branches(int(ROW.partition(":")[2] or 400))
    raise SystemExit(f"unknown row {ROW!r}")


print("ready", flush=True)  # the interpreter's start is not part of the measured window
sys.stdin.readline()
END = time.monotonic() + WINDOW_S
print(json.dumps(row()))
