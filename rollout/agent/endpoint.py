"""The rollout worker's OpenAI-compatible HTTP endpoint: Starlette routes served by uvicorn in a thread of its own.

Routes (errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``):

- ``GET  /v1/models``: the policy this worker holds;
- ``POST /v1/chat/completions``: one assistant turn of the session whose Bearer key the request carries;
- ``POST /v1/sessions``: an external harness takes the oldest session waiting for one (``agent: external``):
  ``{id, api_key, base_url, model, sample}``; 429 with ``Retry-After`` when none waits (the worker opens
  sessions only as fast as the staleness bound lets it start groups);
- ``POST /v1/sessions/{id}/reward``: ``{"reward": x}`` ends the session (its key in the Bearer header);
- ``GET  /health``;
- ``GET  /metrics``: ``asyncrl_agent_requests_refused_total{reason}`` in Prometheus' text format.

Every input is bounded (``spec.task.endpoint``, :class:`~asyncrl.rollout.agent.limits.EndpointLimits`): connections,
the header block's size and time and unknown keys below the app (:mod:`~asyncrl.rollout.agent.http_guard`), then the
body's size (``Content-Length`` first, then as it streams in), its nesting, its names, the reward's range and, in the
episode (:mod:`~asyncrl.rollout.agent.environment`), the prompt against the model's context and the branches of a
session. Each refusal answers OpenAI's error shape and is counted by reason.

Any other path gets 404, a known path asked with another method 405, both in OpenAI's error shape.

The stack is Starlette (FastAPI's core, without its dependency injection: the routes take raw bodies, checked by
:mod:`~asyncrl.rollout.agent.protocol`), uvicorn's ``httptools`` parser and its ``uvloop`` loop where installed
(the package depends on both on Linux): this cut the endpoint thread's CPU per request from 3.1 ms (h11,
FastAPI, asyncio's loop) to 1.1 ms (``bench/agent_endpoint.py --profile``, h64, 32 sessions), CPU that the
decode loop's GIL no longer waits for.

A request never blocks the server: the handler hands its request to the session's episode
(:class:`~asyncrl.rollout.agent.session.Mailbox`) and awaits the answer, which the episode sets once the engine
has sampled the turn. A repeated request (an SDK retry after a timeout or a dropped connection: the same
messages as the request in flight, or as the last one answered) gets that answer, not a second turn.
"""

import asyncio
import concurrent.futures
import hmac
import math
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import uvicorn
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from asyncrl.rollout.agent.http_guard import Guard, guarded_protocol
from asyncrl.rollout.agent.limits import EndpointLimits, RefusalReason, Refusals
from asyncrl.rollout.agent.protocol import (
    ChatRequest,
    RequestError,
    check_names,
    model_card,
    parse_json,
    reward_value,
)
from asyncrl.rollout.agent.session import AgentSession, Event, SessionTable
from asyncrl.rollout.envs.runner import last_line

_SESSION_ROUTES = ("/v1/chat/completions", "/v1/sessions/")  # the routes a session's key opens


@dataclass
class EndpointCounters:
    """The endpoint's monotonic counters (``asyncrl_agent_*_total``)."""

    requests: int = 0  # chat completions taken by a session
    retries: int = 0  # repeated requests answered with the recorded answer
    prefix_mismatch: int = 0  # requests that did not extend the session's history: a new branch
    bad_requests: int = 0  # malformed requests (400/413) of an open session: that episode is aborted
    unauthorized: int = 0  # no key or an unknown key (401), or an ended session (404)
    conflicts: int = 0  # a second, different request while one is in flight (409)
    sessions_claimed: int = 0  # external sessions handed to a harness
    sessions_refused: int = 0  # POST /v1/sessions with none waiting (429)
    sampling_overridden: int = 0  # requests asking for another temperature or a top_p < 1 (sampled as the job says)


def _error(exc: RequestError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    out = dict(headers or {})
    if exc.status == 413:  # the rest of the body is never read: close the connection rather than wait for it
        out["connection"] = "close"
    return JSONResponse(exc.body(), status_code=exc.status, headers=out)


def _bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    scheme, _, key = auth.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise RequestError(401, "missing API key: send 'Authorization: Bearer <the session's key>'",
                           type_="authentication_error", code="invalid_api_key")
    return key.strip()


class AgentEndpoint:
    """The endpoint of one rollout worker over its :class:`SessionTable`.

    Args:
        host, port: where to listen (a local run: ``127.0.0.1``, port 0 = a free one).
        advertise: the base URL sessions hand out (None: ``http://host:port``); in a cluster the pod's address.
        model: the model id ``/v1/models`` lists (any ``model`` a request names is served by this policy).
        limits: ``spec.task.endpoint``'s bounds (None: the spec's defaults, the context unchecked).
        session_key: the key a harness sends to take a session (``spec.task.endpoint.sessionKeyFrom``, else the
            operator's ``<job>-agent-key``; checked by :func:`~asyncrl.rollout.agent.keys.session_key`).
        hidden_fields: fields of a session's sample the harness is not handed (the dataset's answer: the worker
            scores it, and held-out rows never leave the worker with their answers).
        temperature: ``spec.task.temperature``; a request asking for another (or for ``top_p`` < 1) is answered at
            this one and counted (``sampling_overridden``).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, advertise: str | None = None,
                 model: str = "asyncrl-policy", limits: EndpointLimits | None = None,
                 temperature: float = 1.0, session_key: str | None = None,
                 hidden_fields: tuple[str, ...] = ()) -> None:
        self.sessions = SessionTable()
        self.counters = EndpointCounters()
        self.refusals = Refusals()  # asyncrl_agent_requests_refused_total{reason}, this worker's registry
        self._clock = threading.Lock()
        self.model = model
        self.limits = limits if limits is not None else EndpointLimits.from_spec()
        self.temperature = temperature  # spec.task.temperature: what every training turn is sampled at
        self._session_key = session_key  # what POST /v1/sessions must carry (None: nothing)
        self._hidden = frozenset(hidden_fields)  # never in a session's handed-out sample
        self._created = int(time.time())
        self._sock = socket.create_server((host, port), reuse_port=False)  # listening now: no start-up race
        # answers leave at once: without it Nagle holds a response's body behind its head until the client's
        # delayed ACK, ~40 ms per request (bench/agent_endpoint.py); Linux copies the option to accepted sockets
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host, self.port = self._sock.getsockname()[:2]
        shown = f"[{self.host}]" if ":" in str(self.host) else str(self.host)
        self.base_url = (advertise.rstrip("/") if advertise else f"http://{shown}:{self.port}") + "/v1"
        # httptools under the guard (http_guard.py); uvicorn's default loop ("auto") picks uvloop, a dependency on Linux
        guard = Guard(self.limits, self.refuse, self._key_refusal)
        config = uvicorn.Config(self._app(), http=guarded_protocol(guard), log_level="warning", access_log=False,
                                lifespan="off", timeout_keep_alive=60, limit_concurrency=None)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="asyncrl-agent-endpoint", daemon=True)
        self._thread.start()

    def count(self, name: str, n: int = 1) -> None:
        with self._clock:
            setattr(self.counters, name, getattr(self.counters, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._clock:
            return asdict(self.counters)

    def refuse(self, reason: RefusalReason) -> None:
        """Count one refused request (``asyncrl_agent_requests_refused_total{reason}``)."""
        self.refusals.count(reason)
        if reason == "unauthorized":
            self.count("unauthorized")

    def _key_refusal(self, method: str, path: str, authorization: str) -> RequestError | None:
        """The 401 of a request whose key can open nothing, the 409 of an aborted session's (checked on its headers,
        before its body is read)."""
        if method != "POST":
            return None
        scheme, _, key = authorization.partition(" ")
        key = key.strip() if scheme.lower() == "bearer" else ""
        if path == "/v1/sessions":
            if self._session_key is None or (key and hmac.compare_digest(key.encode(), self._session_key.encode())):
                return None
            return RequestError(401, "wrong or missing key to take a session: send the value of "
                                "spec.task.endpoint.sessionKeyFrom as the Bearer key", type_="authentication_error",
                                code="invalid_api_key")
        if not path.startswith(_SESSION_ROUTES):
            return None
        s = self.sessions.get(key) if key else None
        if s is None:
            return RequestError(401, "missing or unknown API key: use the key of an open session (POST /v1/sessions, "
                                "or the client asyncrl hands the agent function)", type_="authentication_error",
                                code="invalid_api_key")
        if s.aborted:
            return RequestError(409, f"session {s.id} was aborted ({s.aborted[:200]}); its reward and requests are "
                                "no longer taken", code="session_aborted")
        return None

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    # ------------------------------------------------------------------ routes
    def _app(self) -> Starlette:
        async def health(request: Request) -> JSONResponse:
            return JSONResponse({"ok": True, "sessions_waiting": self.sessions.waiting})

        async def metrics(request: Request) -> Response:
            return Response(self.refusals.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list",
                                 "data": [model_card(self.model, self._created).model_dump(mode="json")]})

        async def chat(request: Request) -> JSONResponse:
            try:
                return JSONResponse(await self._chat(request))
            except RequestError as exc:
                return _error(exc)

        async def open_session(request: Request) -> JSONResponse:
            if self._session_key is not None:
                try:
                    given = _bearer(request)
                except RequestError as exc:
                    self.refuse("unauthorized")
                    return _error(exc)
                if not hmac.compare_digest(given.encode(), self._session_key.encode()):
                    self.refuse("unauthorized")
                    return _error(RequestError(401, "wrong key to take a session: send the value of "
                                               "spec.task.endpoint.sessionKeyFrom as the Bearer key",
                                               type_="authentication_error", code="invalid_api_key"))
            s = self.sessions.claim()
            if s is None:
                self.count("sessions_refused")
                return _error(RequestError(429, "no session is waiting for a harness now: the job opens sessions as "
                                           "its staleness bound admits new groups; retry shortly",
                                           type_="rate_limit_error", code="no_session_waiting"), {"Retry-After": "1"})
            self.count("sessions_claimed")
            shown = {k: v for k, v in s.sample.items() if k not in self._hidden}  # the answer stays here
            return JSONResponse({"id": s.id, "api_key": s.key, "base_url": self.base_url, "model": self.model,
                                 "sample": shown})

        async def reward(request: Request) -> JSONResponse:
            sid = str(request.path_params["sid"])
            try:
                s = self._session(request)
                if s.id != sid:
                    raise RequestError(401, f"the key is not session {sid}'s", type_="authentication_error",
                                       code="invalid_api_key")
                body = await self._json(request, s)
                try:
                    value = reward_value(body, self.limits.max_reward_magnitude)
                except RequestError as exc:
                    raw = body.get("reward") if isinstance(body, dict) else None
                    nonfinite = isinstance(raw, float) and not math.isfinite(raw)
                    self.refuse("reward_out_of_range")
                    s.abort(f"reward refused: {exc}")
                    s.mailbox.put(Event("fault", reason="nonfinite_reward" if nonfinite else "agent_bad_request",
                                        message=f"POST /v1/sessions/{sid}/reward: {exc}"))
                    raise
                s.mailbox.put(Event("end", reward=value))
                return JSONResponse({"id": sid, "reward": value})
            except RequestError as exc:
                return _error(exc)

        async def no_route(request: Request, exc: Exception) -> JSONResponse:
            """404 (no such path) and 405 (a known path, another method) in OpenAI's error shape."""
            assert isinstance(exc, HTTPException)  # the only exception class this handler is registered for
            status = exc.status_code
            if status == 405:
                message = f"{request.method} is not allowed on {request.url.path}"
            elif status == 404:
                message = (f"no route {request.method} {request.url.path}: this endpoint serves /v1/chat/completions, "
                           "/v1/models, /v1/sessions and /v1/sessions/{id}/reward")
            else:
                message = str(exc.detail)
            return _error(RequestError(status, message, code="not_found" if status == 404 else None), exc.headers)

        return Starlette(routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/sessions", open_session, methods=["POST"]),
            Route("/v1/sessions/{sid}/reward", reward, methods=["POST"]),
        ], exception_handlers={HTTPException: no_route})

    def _session(self, request: Request) -> AgentSession:
        try:
            return self.sessions.by_key(_bearer(request))
        except RequestError as exc:
            if exc.status == 401:
                self.refuse("unauthorized")
            elif exc.status == 409:
                self.refuse("session_aborted")
            else:
                self.count("unauthorized")  # an ended session (404), counted as before
            raise

    async def _json(self, request: Request, s: AgentSession) -> Any:
        """The body as JSON, bounded: ``Content-Length`` over ``maxRequestBytes`` is refused before a byte of the
        body is read, a body without it is cut off there as it streams in; then :func:`parse_json`'s nesting bound.
        A refused body aborts the session's episode (``agent_bad_request``)."""
        cap = self.limits.max_request_bytes
        try:
            declared = request.headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > cap):
                raise RequestError(413, f"request body of {declared[:20]} bytes (Content-Length) is over "
                                   f"spec.task.endpoint.maxRequestBytes={cap}", code="request_too_large")
            chunks: list[bytes] = []
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > cap:
                    raise RequestError(413, f"request body over spec.task.endpoint.maxRequestBytes={cap}",
                                       code="request_too_large")
                chunks.append(chunk)
        except RequestError as exc:
            self._bad(s, str(exc), "body_too_large")
            raise
        try:
            return parse_json(b"".join(chunks), self.limits.max_json_depth)
        except RequestError as exc:
            self._bad(s, str(exc), "bad_request")
            raise

    def _bad(self, s: AgentSession, message: str, reason: RefusalReason) -> None:
        self.count("bad_requests")
        self.refuse(reason)
        s.abort(message)
        s.mailbox.put(Event("fault", reason="agent_bad_request", message=message))

    async def _chat(self, request: Request) -> dict[str, Any]:
        s = self._session(request)
        body = await self._json(request, s)
        try:
            chat = ChatRequest.model_validate(body)
            check_names(chat, self.limits.max_name_chars)
            messages = chat.normal_messages()
            chat.normal_tools()
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            self._bad(s, f"POST /v1/chat/completions: {where}: {err['msg']}", "bad_request")
            raise RequestError(400, f"{where}: {err['msg']}", param=where) from None
        except RequestError as exc:
            self._bad(s, f"POST /v1/chat/completions: {exc}", "bad_request")
            raise
        if (chat.temperature is not None and chat.temperature != self.temperature) or (chat.top_p or 1.0) < 1.0:
            self.count("sampling_overridden")  # answered at the job's temperature, the policy's own mu
        loop = asyncio.get_running_loop()
        with s.lock:
            if s.state == "finished":
                raise RequestError(404, f"session {s.id} has ended", code="session_finished")
            if s.current is not None:
                if s.current[0] != messages:
                    self.count("conflicts")
                    raise RequestError(409, "another request of this session is being answered; send one request "
                                       "at a time per session", code="request_in_flight")
                fut = s.current[1]  # an SDK retry of the request in flight: it gets that answer
                s.retries += 1
                self.count("retries")
            elif s.answered is not None and s.answered[0] == messages:
                s.retries += 1
                self.count("retries")  # a retry of an answered request (the answer was lost on the way)
                return dict(s.answered[1])
            else:
                fut = concurrent.futures.Future()
                s.current = (messages, fut)
                s.requests += 1
                self.count("requests")
                s.mailbox.put(Event("request", request=chat, messages=messages, reply=fut))
        try:
            # shielded: a client that disconnects cancels this handler, never the episode's answer (a retry takes it)
            return dict(await asyncio.shield(asyncio.wrap_future(fut, loop=loop)))
        except RequestError:
            raise
        except Exception as exc:  # the episode failed while answering
            raise RequestError(500, f"the turn could not be sampled: {last_line(exc)}", type_="server_error") from exc


__all__ = ["AgentEndpoint", "EndpointCounters"]
