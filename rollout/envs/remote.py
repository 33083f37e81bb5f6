"""HTTP services as tasks: a reward service (``spec.task.rewardService``, :class:`RemoteReward`) and
an environment service (:class:`RemoteEnvironment`, by import path), as sandboxed execution needs.

Protocol (version 1, documented in docs/tasks.md), JSON over ``POST``:

- reward: ``POST <url>`` ``{"completion": str, "answer": <the row's answerField>, "sample": <the
  whole row>}`` answers ``200 {"reward": <number>}``;
- environment: ``POST <url>/reset`` and ``POST <url>/step`` (see :class:`RemoteEnvironment`).

Values a JSON encoder does not know (a Parquet date, say) are sent as their ``str``. Both go
through one :class:`ServiceClient` per service and process.

Faults, each a :class:`~asyncrl.rollout.envs.runner.EnvFault` whose reason labels
``asyncrl_env_errors_total{reason}``; the episode is aborted, the job goes on:

| case | retried | reason |
|---|---|---|
| connection refused / reset, DNS failure (service down) | yes | ``remote_unreachable`` |
| no answer within ``timeoutSeconds`` (connect, or between bytes) | yes | ``remote_timeout`` |
| HTTP 5xx | yes | ``remote_http_error`` |
| HTTP 4xx (the request itself is wrong: retrying cannot help) | no | ``remote_http_error`` |
| 200 whose body is not the JSON object the protocol says | no | ``remote_bad_response`` |
| ``{"reward": NaN}`` / a non-number | no | ``nonfinite_reward`` (the environment's check) |

Retries wait ``backoffSeconds``, then twice that, and so on; the reason of a fault after retries is
the last attempt's. At most ``maxConcurrency`` requests of one worker are in flight at once; the
rest wait their turn. Connections go straight to the service (proxy variables are ignored: the
service is normally inside the cluster). The whole call, retries included, also runs under the
environment timeout ``spec.task.envTimeoutSeconds`` (``budget_s``): a retry that could not finish
within it is not made, so the fault keeps the service's reason rather than becoming a ``timeout``.
"""

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.api.dataset import RewardServiceSpec
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Sample, Turn
from asyncrl.rollout.envs.runner import EnvFault

PROTOCOL_VERSION = 1
REMOTE_ERROR_REASONS: tuple[str, ...] = (
    "remote_unreachable", "remote_timeout", "remote_http_error", "remote_bad_response",
)
_MAX_SHOWN = 200  # characters of a bad answer quoted in the fault message


@dataclass
class RemoteStats:
    """Counters of one client (per worker process): requests sent, retries, faults by reason."""

    requests: int = 0
    retries: int = 0
    faults: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REMOTE_ERROR_REASONS, 0))


class _Retry(Exception):
    """An attempt that failed in a way another attempt may not."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class ServiceClient:
    """POSTs JSON to a service with the timeout, retries, backoff and concurrency limit of ``spec``.

    Thread-safe: one client serves every episode of a worker (:func:`shared_client`); ``sleep`` is
    the backoff's wait; ``what`` names the service in fault messages.
    """

    def __init__(self, spec: RewardServiceSpec, *, what: str = "reward service", budget_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.what = what
        self.budget_s = budget_s  # the caller's own deadline (envTimeoutSeconds): no retry that cannot fit
        self._sleep = sleep
        self._slots = threading.BoundedSemaphore(spec.max_concurrency)
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._lock = threading.Lock()
        self.stats = RemoteStats()

    def post(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The JSON object ``url`` answers to ``payload``; an :class:`EnvFault` when it cannot be had."""
        body = json.dumps(payload, default=str, ensure_ascii=False).encode()
        attempts, tried, start = self.spec.retries + 1, 0, time.monotonic()
        for attempt in range(attempts):
            tried += 1
            try:
                return self._attempt(url, body)
            except _Retry as exc:
                last = exc
            except EnvFault as exc:
                self._count_fault(exc.reason)
                raise
            if attempt + 1 == attempts:
                break
            wait = self.spec.backoff_seconds * 2**attempt
            # A retry that cannot finish inside the caller's deadline would be cut off there and counted as
            # a plain timeout: stop now, with the service's own reason.
            if self.budget_s is not None and (time.monotonic() - start) + wait + self.spec.timeout_seconds \
                    > self.budget_s:
                break
            with self._lock:
                self.stats.retries += 1
            self._sleep(wait)
        self._count_fault(last.reason)
        left = "" if tried == attempts else (f" ({attempts - tried} retries left out: they would not finish within "
                                              f"spec.task.envTimeoutSeconds={self.budget_s:g})")
        raise EnvFault(last.reason, f"{self.what} {url}: {tried} attempt(s) failed{left}; last: {last}")

    def _count_fault(self, reason: str) -> None:
        with self._lock:
            self.stats.faults[reason] = self.stats.faults.get(reason, 0) + 1

    def _attempt(self, url: str, body: bytes) -> dict[str, Any]:
        request = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "Accept": "application/json",
            "X-Asyncrl-Protocol": str(PROTOCOL_VERSION),
        })
        timeout = self.spec.timeout_seconds
        with self._slots:
            with self._lock:
                self.stats.requests += 1
            try:
                with self._opener.open(request, timeout=timeout) as response:
                    raw = response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read(_MAX_SHOWN).decode(errors="replace")
                if exc.code >= 500:
                    raise _Retry("remote_http_error", f"HTTP {exc.code} {detail!r}") from None
                raise EnvFault("remote_http_error", f"{self.what} {url} refused the request with HTTP "
                               f"{exc.code} {detail!r} (not retried: a 4xx says the request is wrong)") from None
            except TimeoutError as exc:
                raise _Retry("remote_timeout", f"no answer within {timeout:g} s (timeoutSeconds)") from exc
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, TimeoutError):
                    raise _Retry("remote_timeout", f"no answer within {timeout:g} s (timeoutSeconds)") from exc
                raise _Retry("remote_unreachable", f"cannot connect ({exc.reason})") from exc
            except http.client.HTTPException as exc:  # not HTTP at all (a garbage status line)
                raise EnvFault("remote_bad_response", f"{self.what} {url} does not speak HTTP "
                               f"({type(exc).__name__}: {exc})") from None
            except OSError as exc:  # reset mid-answer, a closed socket
                raise _Retry("remote_unreachable", f"connection lost ({exc})") from exc
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise EnvFault("remote_bad_response", f"{self.what} {url} answered {raw[:_MAX_SHOWN]!r}, not JSON") \
                from None
        if not isinstance(answer, dict):
            raise EnvFault("remote_bad_response", f"{self.what} {url} answered {json.dumps(answer)[:_MAX_SHOWN]}, "
                           "not a JSON object")
        return answer


def need(answer: dict[str, Any], key: str, what: str, form: str) -> Any:
    """``answer[key]``, or a ``remote_bad_response`` fault saying the answer's expected ``form``."""
    if key not in answer:
        raise EnvFault("remote_bad_response", f"{what} answered {json.dumps(answer, default=str)[:_MAX_SHOWN]}; "
                       f"it must answer {form}")
    return answer[key]


class RemoteReward:
    """``RemoteReward(spec)(completion, answer, sample) -> reward``: a reward function over HTTP."""

    def __init__(self, spec: RewardServiceSpec, *, budget_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.client = ServiceClient(spec, what="reward service", budget_s=budget_s, sleep=sleep)

    @property
    def stats(self) -> RemoteStats:
        return self.client.stats

    def __call__(self, completion: str, answer: Any, sample: Sample) -> Any:
        """The service's reward (its finiteness is the environment's check: ``nonfinite_reward``)."""
        out = self.client.post(self.spec.url, {"completion": completion, "answer": answer, "sample": sample})
        return need(out, "reward", f"reward service {self.spec.url}", '{"reward": <number>}')

    def _attempt(self, body: bytes) -> Any:  # one request, no retry (tests)
        return self.client._attempt(self.spec.url, body)


_clients: dict[tuple[RewardServiceSpec, str], ServiceClient] = {}
_clients_lock = threading.Lock()


def shared_client(spec: RewardServiceSpec, what: str) -> ServiceClient:
    """One client per service per process, so ``maxConcurrency`` bounds every episode of a worker together."""
    with _clients_lock:
        client = _clients.get((spec, what))
        if client is None:
            client = _clients[(spec, what)] = ServiceClient(spec, what=what)
        return client


class RemoteEnvironment:
    """A turn-level environment served over HTTP: ``spec.task.environment:
    "asyncrl.rollout.envs.remote:RemoteEnvironment"`` with ``spec.task.args: {url: http://env:8000, ...}``
    (the other keys as ``rewardService``'s: timeoutSeconds, retries, backoffSeconds, maxConcurrency).

    Protocol (version 1, docs/tasks.md): ``POST <url>/reset`` ``{"sample": {...}}`` answers
    ``{"episode": str, "messages": [...], "tools": [...]?}``; ``POST <url>/step`` ``{"episode": str,
    "message": {role, content, tool_calls?}, "text": str, "malformed": [...]}`` answers
    ``{"observation": [...]}`` to go on or ``{"done": true, "reward": number, "success": bool?}``.
    Faults are those of :class:`ServiceClient`; messages that are not chat messages are the adapter's
    ``bad_messages``.
    """

    def __init__(self, **args: Any) -> None:
        from pydantic import ValidationError

        try:
            self.spec = RewardServiceSpec.model_validate(args)
        except ValidationError as exc:
            problems = "; ".join(f"spec.task.args.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ValueError(f"RemoteEnvironment: {problems} (args are url, timeoutSeconds, retries, "
                             "backoffSeconds, maxConcurrency)") from None
        self.base = self.spec.url.rstrip("/")
        self.client = shared_client(self.spec, "environment service")
        self.episode = ""
        self.truncated_reward = 0.0

    def reset(self, sample: Sample) -> Reset:
        out = self.client.post(f"{self.base}/reset", {"sample": sample})
        what = f"environment service {self.base}/reset"
        self.episode = str(need(out, "episode", what, '{"episode": str, "messages": [...]}'))
        messages = need(out, "messages", what, '{"episode": str, "messages": [...]}')
        tools = out.get("tools")
        stop = out.get("stop") or ()
        return Reset(messages, tools, tuple(stop) if isinstance(stop, list) else stop)

    def step(self, msg: AssistantMessage) -> Turn:
        out = self.client.post(f"{self.base}/step", {
            "episode": self.episode, "message": msg.to_message(), "text": msg.text, "malformed": list(msg.malformed),
        })
        what = f"environment service {self.base}/step"
        if out.get("done"):
            reward = need(out, "reward", what, '{"done": true, "reward": <number>}')
            return Turn(done=True, reward=reward, success=bool(out.get("success", False)),
                        reason=str(out.get("reason", "")))
        return Turn(need(out, "observation", what, '{"observation": [...]} or {"done": true, "reward": <number>}'))

    def info(self) -> dict[str, Any]:
        return {"episode": self.episode}
