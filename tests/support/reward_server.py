"""A loopback HTTP reward service for tests: the protocol of docs/tasks.md, with faults on demand.

``RewardServer()`` listens on 127.0.0.1 (a free port) in a daemon thread; ``url`` is its endpoint.
Set ``mode`` at any time:

- ``"ok"``: ``{"reward": 1.0}`` when the completion (stripped) equals ``str(answer)``, else 0.0;
- ``"slow"``: like ok after ``delay_s``, or at once when the server stops (so a test that waits for a
  client's deadline can give a delay far past it and still end as soon as it is done);
- ``"500"``: HTTP 500 for every request; ``"flaky"``: 500 for the first ``fail_first`` requests, then ok;
- ``"400"``: HTTP 400; ``"garbage"``: 200 with a body that is not JSON; ``"nan"``: ``{"reward": NaN}``.

Paths ending in ``/reset`` and ``/step`` speak the environment protocol instead (in mode ok): a
two-turn episode that asks "Sure?" once, then scores the second answer against the sample's answer.

``stop()`` closes the port (the service is then *down*: connections are refused). ``requests``
counts requests; ``bodies`` the decoded requests, ``headers`` their headers. How many requests are in
flight at once is the client's to count (``RemoteStats``): a server sees a request as in flight until its
handler returns, which is after the client already has its answer.
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that gave up (timed out) leaves a broken pipe behind: expected here


class RewardServer:
    def __init__(self, mode: str = "ok", *, delay_s: float = 0.0, fail_first: int = 0) -> None:
        self.mode, self.delay_s, self.fail_first = mode, delay_s, fail_first
        self.requests = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._stopped = threading.Event()
        self.episodes: dict[str, dict[str, Any]] = {}  # the environment protocol's state
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server._lock:
                    server.requests += 1
                    n = server.requests
                    server.bodies.append(body)
                    server.headers.append(dict(self.headers.items()))
                self._answer(body, n)

            def _answer(self, body: dict[str, Any], n: int) -> None:
                mode = server.mode
                if mode == "slow" or server.delay_s:
                    server._stopped.wait(server.delay_s)
                if mode == "500" or (mode == "flaky" and n <= server.fail_first):
                    return self._send(500, b'{"error": "internal"}')
                if mode == "400":
                    return self._send(400, b'{"error": "bad request"}')
                if mode == "garbage":
                    return self._send(200, b"<html>not json</html>")
                if mode == "nan":
                    return self._send(200, b'{"reward": NaN}')
                if self.path.endswith("/reset"):  # the environment protocol: a two-turn episode
                    episode = f"e{n}"
                    server.episodes[episode] = {"answer": str(body["sample"]["answer"]), "turns": 0}
                    prompt = [{"role": "user", "content": str(body["sample"]["prompt"])}]
                    return self._send(200, json.dumps({"episode": episode, "messages": prompt}).encode())
                if self.path.endswith("/step"):
                    state = server.episodes[body["episode"]]
                    state["turns"] += 1
                    if state["turns"] == 1:
                        return self._send(200, json.dumps({"observation": [
                            {"role": "user", "content": "Sure?"}]}).encode())
                    ok = body["message"]["content"].strip() == state["answer"]
                    return self._send(200, json.dumps({"done": True, "reward": float(ok), "success": ok}).encode())
                ok = str(body["completion"]).strip() == str(body["answer"])
                self._send(200, json.dumps({"reward": float(ok)}).encode())

            def _send(self, code: int, payload: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/score"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="reward-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the port: from now on connections are refused (the service is down)."""
        self._stopped.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "RewardServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
