"""``spec.task.agent`` and ``spec.task.endpoint``: a user's OpenAI-API agent trained through the rollout
workers' OpenAI-compatible endpoint (``docs/agents.md``).

Two ways in:

- ``agent: "pkg.mod:fn"``: asyncrl calls ``async def fn(client, sample) -> float | None`` once per episode,
  ``client`` an ``openai.AsyncOpenAI`` pointed at the worker's endpoint with a key of that episode only;
  the float is the reward, ``None`` means "score with ``task.reward``";
- ``agent: "external"``: another process or pod opens sessions (``POST /v1/sessions``), calls the endpoint
  with each session's key and posts the reward (``POST /v1/sessions/{id}/reward``).

The endpoint listens on loopback in a local run and for an in-process agent; an external agent's, in a cluster,
on ``endpoint.port`` of each rollout pod, behind a NetworkPolicy that admits the job's own pods and the peers of
``endpoint.allowFrom``, and taking a session needs a key (``sessionKeyFrom``, else one the operator makes).
"""

import ipaddress
from typing import ClassVar, Final

from pydantic import Field, field_validator, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule
from asyncrl.api.kube_types import KubeModel
from asyncrl.api.service import SecretKeyRef

EXTERNAL: Final = "external"
AGENT_PATTERN = r"^(external|[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*)$"
AGENT_MESSAGE = (
    "task.agent is 'package.module:function' (an async function (client, sample) -> reward) or 'external' "
    "(a harness outside the job opens sessions), e.g. 'my_agent:run'"
)
AGENT_WITH_ENVIRONMENT_MESSAGE = (
    "task.agent and task.environment are two ways to bring a multi-turn task; set one of them"
)
_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"


def _check_labels(labels: dict[str, str], what: str) -> dict[str, str]:
    import re

    for k, v in labels.items():
        if len(k) > 316 or not re.match(_LABEL_KEY, k):
            raise ValueError(f"{what}: {k!r} is not a label key (prefix/name, e.g. app.kubernetes.io/name)")
        if not isinstance(v, str) or len(v) > 63 or not re.match(_LABEL_VALUE, v):
            raise ValueError(f"{what}[{k!r}]: {v!r} is not a label value (at most 63 of A-Z a-z 0-9 - _ .)")
    return labels


class LabelSelector(KubeModel):
    """A Kubernetes label selector by equality (``matchLabels``)."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels the selected objects all carry; {} selects every one."
    )

    _labels_ok = field_validator("match_labels")(lambda v: _check_labels(v, "matchLabels"))


class IPBlock(KubeModel):
    """An address range a NetworkPolicy admits."""

    cidr: str = Field(description="The range, e.g. 10.0.0.0/16.")
    except_: list[str] = Field(default_factory=list, alias="except",
                               description="Ranges inside cidr that stay refused.")

    @field_validator("cidr")
    @classmethod
    def _cidr_ok(cls, v: str) -> str:
        try:
            ipaddress.ip_network(v, strict=False)
        except ValueError as exc:
            raise ValueError(f"ipBlock.cidr {v!r} is not an address range like 10.0.0.0/16 ({exc})") from None
        return v


class EndpointPeer(KubeModel):
    """Who else may call the endpoint: pods (in namespaces) by label, or an address range."""

    pod_selector: LabelSelector | None = Field(default=None, description="Pods by label (in namespaceSelector's "
                                               "namespaces, else in the job's own).")
    namespace_selector: LabelSelector | None = Field(default=None, description="Namespaces by label.")
    ip_block: IPBlock | None = Field(default=None, description="An address range (e.g. a harness outside the cluster).")

    cel_rules: ClassVar[tuple[CelRule, ...]] = (CelRule("has(self.podSelector) || has(self.namespaceSelector) || has(self.ipBlock)",
                         "an allowFrom entry names podSelector, namespaceSelector or ipBlock"),
                 CelRule("!has(self.ipBlock) || (!has(self.podSelector) && !has(self.namespaceSelector))",
                         "an allowFrom entry with ipBlock names no selector (Kubernetes refuses the mix)"))

    @model_validator(mode="after")
    def _one_kind(self) -> "EndpointPeer":
        if self.pod_selector is None and self.namespace_selector is None and self.ip_block is None:
            raise ValueError("an allowFrom entry names podSelector, namespaceSelector or ipBlock")
        if self.ip_block is not None and (self.pod_selector is not None or self.namespace_selector is not None):
            raise ValueError("an allowFrom entry with ipBlock names no selector (Kubernetes refuses the mix)")
        return self


class AgentEndpointSpec(SpecModel):
    """``spec.task.endpoint``: where the rollout workers' OpenAI-compatible endpoint listens, and who may call it."""

    port: int = Field(
        default=8100, ge=1024, le=65535,
        description="Port of the endpoint on each rollout pod (a local run binds loopback on a free port).",
    )
    allow_from: list[EndpointPeer] = Field(
        default_factory=list,
        description="Peers admitted besides the job's own pods (NetworkPolicy 'from' entries): an external "
        "harness's pods or address range. Empty: only the job's pods reach the endpoint.",
    )
    session_key_from: SecretKeyRef | None = Field(
        default=None,
        description="A Secret key whose value an external harness must send as 'Authorization: Bearer <value>' to "
        "take a session (POST /v1/sessions); the value may not be empty nor start or end with whitespace. In the "
        "rollout pods it is ASYNCRL_AGENT_SESSION_KEY; locally asyncrl run reads that variable (and refuses to "
        "start without it). Null: in a cluster the operator makes the Secret <job>-agent-key (key 'key', 192 random "
        "bits, created once); locally taking a session needs no key (loopback), unless ASYNCRL_AGENT_SESSION_KEY "
        "is set. External agents only.",
    )
    # ---- bounds on every input (docs/agents.md, "Bounds"): each refusal answers OpenAI's error shape and counts
    # under asyncrl_agent_requests_refused_total{reason}
    max_request_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024,
        description="Largest request body: a Content-Length above it is refused with 413 before any byte of the "
        "body is read, and a body without one is cut off there (reason body_too_large).",
    )
    max_header_bytes: int = Field(
        default=64 * 1024, ge=4096, le=1024 * 1024,
        description="Largest header block (request line and headers); a longer one is refused with 431 before it "
        "reaches the HTTP parser, and the connection closed (reason header_too_large).",
    )
    header_timeout_seconds: float = Field(
        default=10.0, gt=0.0, le=600.0,
        description="Time a connection has to send a complete header block, from its first byte (or from "
        "connecting); after it the connection is closed (reason header_timeout: a slowloris client).",
    )
    max_connections: int = Field(
        default=512, ge=8, le=65536,
        description="Open connections per rollout worker; one more is answered 503 and closed at once (reason "
        "too_many_connections). Keep it under the worker's file-descriptor limit.",
    )
    max_json_depth: int = Field(
        default=32, ge=4, le=512,
        description="Deepest nesting of a request's JSON (objects and arrays); deeper is refused with 400 "
        "(reason bad_request).",
    )
    max_name_chars: int = Field(
        default=256, ge=16, le=65536,
        description="Longest name-like string of a request (model, role, tool and function names, tool-call ids, "
        "stop strings); a longer one is refused with 400 and never echoed back (reason bad_request). Contents are "
        "bounded by maxRequestBytes and the model's context.",
    )
    max_reward_magnitude: float = Field(
        default=1.0e6, gt=0.0, le=1.0e9,
        description="Largest |reward| a harness may post or an agent function return; a larger, non-finite or "
        "non-number reward is refused with 400 (reason reward_out_of_range) and the session is aborted. "
        "Advantages are differences of rewards times log-probability ratios: 1e6 keeps them and their gradient "
        "far inside float32 while leaving any sensible reward scale free.",
    )
    max_branches: int = Field(
        default=8, ge=0, le=1024,
        description="Branches a session may start (requests that do not extend its conversation); one more is "
        "refused with 400 (reason too_many_branches) and the session is aborted: none of its branches trains.",
    )


# ---- keys and peers (issue 35, part C): what an in-process agent cannot use, and the session key's value
IN_PROCESS_ENDPOINT_MESSAGE = (
    "task.endpoint.allowFrom and task.endpoint.sessionKeyFrom are for an external harness (task.agent: external); an "
    "in-process agent ('package.module:function') is served on loopback inside its rollout pod, where no peer "
    "reaches it: remove them, or set task.agent: external"
)
IN_PROCESS_ENDPOINT_RULES: Final = tuple(
    CelRule(f"!has(self.agent) || self.agent == '{EXTERNAL}' || !has(self.endpoint) || {absent}",
            IN_PROCESS_ENDPOINT_MESSAGE, f".endpoint.{field}")
    for field, absent in (("allowFrom", "!has(self.endpoint.allowFrom) || size(self.endpoint.allowFrom) == 0"),
                          ("sessionKeyFrom", "!has(self.endpoint.sessionKeyFrom)")))


def in_process_endpoint_problems(agent: str | None, endpoint: AgentEndpointSpec) -> list[tuple[str, str]]:
    """(field, message) for ``allowFrom``/``sessionKeyFrom`` set with an in-process agent (the CEL rules'
    twins: :data:`IN_PROCESS_ENDPOINT_RULES`)."""
    if agent is None or agent == EXTERNAL:
        return []
    out = []
    if endpoint.allow_from:
        out.append(("endpoint.allowFrom", f"{IN_PROCESS_ENDPOINT_MESSAGE} (agent is {agent!r}, "
                                          f"{len(endpoint.allow_from)} peer(s))"))
    if endpoint.session_key_from is not None:
        out.append(("endpoint.sessionKeyFrom", f"{IN_PROCESS_ENDPOINT_MESSAGE} (agent is {agent!r})"))
    return out


__all__ = [
    "IN_PROCESS_ENDPOINT_MESSAGE",
    "IN_PROCESS_ENDPOINT_RULES",
    "in_process_endpoint_problems",
    "AGENT_MESSAGE",
    "AGENT_PATTERN",
    "AGENT_WITH_ENVIRONMENT_MESSAGE",
    "EXTERNAL",
    "AgentEndpointSpec",
    "EndpointPeer",
    "IPBlock",
    "LabelSelector",
]
