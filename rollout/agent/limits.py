"""The agent endpoint's bounds and its refusal counter.

:class:`EndpointLimits` is ``spec.task.endpoint``'s bound fields as the endpoint reads them (the defaults live in
:class:`~asyncrl.api.agent.AgentEndpointSpec` only). :class:`Refusals` counts every request the endpoint refuses
under ``asyncrl_agent_requests_refused_total{reason}``: a Prometheus counter in the worker's own registry, every
reason pre-set to 0, served on the endpoint's ``GET /metrics``; the job's driver adds up its workers' counts into the
same name at every step (``trainer/driver/run/metrics.py``, from :data:`REFUSED_METRIC` and :data:`REFUSED_HELP`,
which also generates its line of ``docs/metrics.md``).
"""

from dataclasses import dataclass
from typing import Final, Literal, get_args

from prometheus_client import CollectorRegistry, Counter, generate_latest

from asyncrl.api.agent import AgentEndpointSpec

RefusalReason = Literal[
    "unauthorized",  # 401: no key, an unknown key, a wrong session key
    "header_too_large",  # 431: the header block is over maxHeaderBytes (cut before the parser)
    "header_timeout",  # the header block took over headerTimeoutSeconds (a slowloris client): closed
    "too_many_connections",  # 503: the worker holds maxConnections already
    "body_too_large",  # 413: Content-Length or the body read so far over maxRequestBytes
    "bad_request",  # 400: not JSON, nested deeper than maxJsonDepth, a field too long or malformed, a parameter
    # the endpoint cannot honour (tool_choice, logit_bias, n, stream)
    "context_length_exceeded",  # 400: the prompt plus max_tokens over the model's context
    "reward_out_of_range",  # 400: not a number, not finite, or |reward| over maxRewardMagnitude
    "session_aborted",  # 409: a reward for a session already aborted
    "too_many_branches",  # 400: a branch over maxBranches
]
REFUSAL_REASONS: Final[tuple[str, ...]] = get_args(RefusalReason)

REFUSED_METRIC: Final = "asyncrl_agent_requests_refused_total"
REFUSED_HELP: Final = (
    "Requests the agent endpoint refused, by reason (spec.task.endpoint's bounds; served by each rollout worker's "
    "endpoint on GET /metrics): unauthorized (401), header_too_large (431), header_timeout (closed), "
    "too_many_connections (503), body_too_large (413), bad_request (400: not JSON, too deep, a field too long, a "
    "parameter it cannot honour), context_length_exceeded (400), reward_out_of_range (400), session_aborted (409), "
    "too_many_branches (400)."
)


@dataclass(frozen=True)
class EndpointLimits:
    """``spec.task.endpoint``'s bounds (see :class:`~asyncrl.api.agent.AgentEndpointSpec` for each one's meaning);
    ``context``: the model's context in tokens (the rollout worker's ``arch.max_sequence_length``), 0 = unchecked."""

    max_request_bytes: int
    max_header_bytes: int
    header_timeout_s: float
    max_connections: int
    max_json_depth: int
    max_name_chars: int
    max_reward_magnitude: float
    max_branches: int
    context: int = 0

    @classmethod
    def from_spec(cls, spec: AgentEndpointSpec | None = None, *, context: int = 0) -> "EndpointLimits":
        s = spec if spec is not None else AgentEndpointSpec()
        return cls(max_request_bytes=s.max_request_bytes, max_header_bytes=s.max_header_bytes,
                   header_timeout_s=s.header_timeout_seconds, max_connections=s.max_connections,
                   max_json_depth=s.max_json_depth, max_name_chars=s.max_name_chars,
                   max_reward_magnitude=s.max_reward_magnitude, max_branches=s.max_branches, context=context)


class Refusals:
    """``asyncrl_agent_requests_refused_total{reason}`` in ``registry`` (a fresh one per endpoint by default)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._counter = Counter(REFUSED_METRIC.removesuffix("_total"), REFUSED_HELP, ["reason"],
                                registry=self.registry)
        for reason in REFUSAL_REASONS:  # pre-set to 0: the series exist before the first refusal
            self._counter.labels(reason)

    def count(self, reason: RefusalReason) -> None:
        self._counter.labels(reason).inc()

    def snapshot(self) -> dict[str, int]:
        """Every reason's count so far."""
        return {r: int(self.registry.get_sample_value(REFUSED_METRIC, {"reason": r}) or 0) for r in REFUSAL_REASONS}

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format (``GET /metrics``)."""
        return generate_latest(self.registry)


__all__ = ["REFUSAL_REASONS", "REFUSED_HELP", "REFUSED_METRIC", "EndpointLimits", "RefusalReason", "Refusals"]
