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
| no whole answer within the call's deadline (``timeoutSeconds``, all attempts; a dripped answer too) | no time left | ``remote_timeout`` |
| HTTP 5xx | yes | ``remote_http_error`` |
| HTTP 4xx (the request itself is wrong: retrying cannot help) | no | ``remote_http_error`` |
| HTTP 3xx (redirects are never followed) | no | ``remote_http_error`` |
| 200 whose body is not the JSON object the protocol says, or longer than ``maxResponseBytes`` | no | ``remote_bad_response`` |
| ``{"reward": NaN}`` / a non-number | no | ``nonfinite_reward`` (the environment's check) |

Retries wait ``backoffSeconds``, then twice that, and so on, inside the one deadline; the reason of a
fault after retries is the last attempt's. The HTTP side (deadline, body cap, headers from Secrets,
concurrency limit, redacted URLs) is :mod:`asyncrl.rollout.envs.service_client`'s.
"""

import json
import threading
import time
from collections.abc import Callable
from typing import Any

from asyncrl.api.dataset import RewardServiceSpec
from asyncrl.api.service import redact_url
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Sample, Turn
from asyncrl.rollout.envs.runner import EnvFault
from asyncrl.rollout.envs.service_client import MAX_SHOWN, RemoteStats, ServiceClient


def need(answer: dict[str, Any], key: str, what: str, form: str) -> Any:
    """``answer[key]``, or a ``remote_bad_response`` fault saying the answer's expected ``form``."""
    if key not in answer:
        raise EnvFault("remote_bad_response", f"{what} answered {json.dumps(answer, default=str)[:MAX_SHOWN]}; "
                       f"it must answer {form}")
    return answer[key]


class RemoteReward:
    """``RemoteReward(spec)(completion, answer, sample) -> reward``: a reward function over HTTP."""

    def __init__(self, spec: RewardServiceSpec, *, budget_s: float | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.spec = spec
        self.client = ServiceClient(spec, what="reward service", field="spec.task.rewardService", budget_s=budget_s,
                                    sleep=sleep)

    @property
    def stats(self) -> RemoteStats:
        return self.client.stats

    def __call__(self, completion: str, answer: Any, sample: Sample) -> Any:
        """The service's reward (its finiteness is the environment's check: ``nonfinite_reward``)."""
        out = self.client.post(self.spec.url, {"completion": completion, "answer": answer, "sample": sample})
        return need(out, "reward", f"reward service {redact_url(self.spec.url)}", '{"reward": <number>}')

    def _attempt(self, body: bytes) -> Any:  # one request, no retry (tests)
        return self.client._attempt(self.spec.url, body, time.monotonic() + self.client.deadline_s)


_clients: dict[tuple[str, str], ServiceClient] = {}
_clients_lock = threading.Lock()


def shared_client(spec: RewardServiceSpec, what: str, field: str) -> ServiceClient:
    """One client per service per process, so ``maxConcurrency`` bounds every episode of a worker together."""
    key = (spec.model_dump_json(), what)  # the spec holds a list (headersFrom): not hashable itself
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = ServiceClient(spec, what=what, field=field)
        return client


class RemoteEnvironment:
    """A turn-level environment served over HTTP: ``spec.task.environment:
    "asyncrl.rollout.envs.remote:RemoteEnvironment"`` with ``spec.task.args: {url: http://env:8000, ...}``
    (the other keys as ``rewardService``'s: timeoutSeconds, retries, backoffSeconds, maxConcurrency,
    maxResponseBytes, headersFrom).

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
                             "backoffSeconds, maxConcurrency, maxResponseBytes, headersFrom)") from None
        self.base = self.spec.url.rstrip("/")
        self.client = shared_client(self.spec, "environment service", "spec.task.args")
        self.shown = redact_url(self.base)
        self.episode = ""
        self.truncated_reward = 0.0

    def reset(self, sample: Sample) -> Reset:
        out = self.client.post(f"{self.base}/reset", {"sample": sample})
        what = f"environment service {self.shown}/reset"
        self.episode = str(need(out, "episode", what, '{"episode": str, "messages": [...]}'))
        messages = need(out, "messages", what, '{"episode": str, "messages": [...]}')
        tools = out.get("tools")
        stop = out.get("stop") or ()
        return Reset(messages, tools, tuple(stop) if isinstance(stop, list) else stop)

    def step(self, msg: AssistantMessage) -> Turn:
        out = self.client.post(f"{self.base}/step", {
            "episode": self.episode, "message": msg.to_message(), "text": msg.text, "malformed": list(msg.malformed),
        })
        what = f"environment service {self.shown}/step"
        if out.get("done"):
            reward = need(out, "reward", what, '{"done": true, "reward": <number>}')
            return Turn(done=True, reward=reward, success=bool(out.get("success", False)),
                        reason=str(out.get("reason", "")))
        return Turn(need(out, "observation", what, '{"observation": [...]} or {"done": true, "reward": <number>}'))

    def info(self) -> dict[str, Any]:
        return {"episode": self.episode}
