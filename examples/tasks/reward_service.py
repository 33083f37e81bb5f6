"""A reward service speaking asyncrl's protocol (docs/tasks.md), serving my_reward.score over HTTP.

    python examples/tasks/reward_service.py --port 8000

then set, instead of spec.task.reward and pythonPath:

    rewardService: {url: "http://127.0.0.1:8000/score"}

Protocol (version 1): POST <url> with {"completion": str, "answer": ..., "sample": {...}} answers
200 {"reward": <number>}. Answer 4xx when the request is wrong (asyncrl does not retry it) and 5xx
when a retry may succeed. Standard library only; put your sandbox, your judge model or your test
runner where score() is called.
"""

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from my_reward import score


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            args = body["completion"], body.get("answer"), body.get("sample", {})
        except (ValueError, KeyError, TypeError) as exc:
            return self._send(400, {"error": f"not a scoring request: {exc}"})
        try:
            reward = score(*args)
        except Exception as exc:  # the scorer's bug: 500, so asyncrl retries and then counts it
            return self._send(500, {"error": repr(exc)})
        self._send(200, {"reward": reward})

    def _send(self, code: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"scoring on http://{args.host}:{server.server_address[1]}/score", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
