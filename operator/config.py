"""Operator settings, read from the environment when the operator starts (never at import time).

Every variable is ``ASYNCRL_OPERATOR_<NAME>``; a bad value fails start-up with the variable, the
value and the rule.
"""

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from asyncrl.api.constants import ENV_OPERATOR_PREFIX

_PREFIX = ENV_OPERATOR_PREFIX


@dataclass(frozen=True)
class OperatorSettings:
    """Tunables of the operator (chart values map onto the environment variables)."""

    job_image: str = "asyncrl/job:0.1.0"
    """Default image of the job's pods (a role's ``template.image`` overrides it)."""
    image_pull_policy: str = "IfNotPresent"
    resync_seconds: float = 30.0
    """Every job is re-reconciled this often (deadlines, TTL, missed pod events)."""
    restart_backoff_seconds: float = 10.0
    """First delay before a gang restart; doubles with every counted restart."""
    restart_backoff_max_seconds: float = 300.0
    finalizer_timeout_seconds: float = 120.0
    """After this long a deleting job drops its finalizer even if pods still terminate."""
    metrics_port: int = 8080
    """Port of the operator's /metrics (0: not served)."""
    prometheus_namespace_selector: dict[str, str] | None = None
    """Labels of the namespaces Prometheus runs in, as a JSON object; a job's NetworkPolicy admits
    Prometheus pods from there on the job's metrics port. Unset (None): only Prometheus pods in the
    job's own namespace; ``{}``: any namespace (an explicit choice of the cluster admin). The chart
    sets it from ``jobNetworkPolicy`` (default: the release namespace)."""
    prometheus_pod_selector: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "prometheus"}  # kube-prometheus-stack's pods
    )
    """Labels of the Prometheus pods, as a JSON object."""
    privileged_namespaces: tuple[str, ...] = ()
    """Namespaces whose jobs may ask for ``podSecurityLevel: privileged`` (a JSON list of names; the
    chart's ``podSecurity.privilegedNamespaces``). Elsewhere such a job is ValidationFailed and the
    operator creates nothing: only the cluster admin opts in, never a job author."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OperatorSettings":
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        problems: list[str] = []
        defaults = cls()
        for f in fields(cls):
            var = _PREFIX + f.name.upper()
            if var not in env:
                continue
            raw = env[var]
            kind: type = _KINDS.get(f.name) or type(getattr(defaults, f.name))
            if kind is tuple:
                names = _name_list(var, raw, problems)
                if names is not None:
                    values[f.name] = names
                continue
            if kind is dict:
                labels = _label_map(var, raw, problems)
                if labels is not None:
                    values[f.name] = labels
                continue
            try:
                value = kind(raw)
            except ValueError:
                problems.append(f"{var}={raw!r} is not a valid {kind.__name__}")
                continue
            if kind in (int, float) and value < 0:  # type: ignore[operator]
                problems.append(f"{var}={raw!r} must be >= 0")
                continue
            values[f.name] = value
        if problems:
            raise ValueError("invalid operator settings: " + "; ".join(problems))
        return cls(**values)  # type: ignore[arg-type]

    def restart_delay(self, counted_restarts: int) -> float:
        """Backoff before restart number ``counted_restarts`` (1-based): base * 2^(n-1), capped."""
        n = max(counted_restarts, 1)
        return min(self.restart_backoff_seconds * 2 ** (n - 1), self.restart_backoff_max_seconds)


_KINDS: dict[str, type] = {"prometheus_namespace_selector": dict}  # fields whose default is None


def _name_list(var: str, raw: str, problems: list[str]) -> tuple[str, ...] | None:
    """A JSON list of names, or None with the problem noted."""
    try:
        value = json.loads(raw)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        problems.append(f"{var}={raw!r} must be a JSON list of namespace names, e.g. '[\"ml-debug\"]'")
        return None
    return tuple(value)


def _label_map(var: str, raw: str, problems: list[str]) -> dict[str, str] | None:
    """A JSON object of string labels (a Kubernetes ``matchLabels``), or None with the problem noted."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        problems.append(f"{var}={raw!r} is not JSON ({exc}); e.g. '{{\"app.kubernetes.io/name\": \"prometheus\"}}'")
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        problems.append(f"{var}={raw!r} must be a JSON object of string labels (matchLabels), e.g. "
                        '\'{"kubernetes.io/metadata.name": "monitoring"}\'')
        return None
    return value
