"""Operator settings, read from the environment when the operator starts (never at import time).

Every variable is ``ASYNCRL_OPERATOR_<NAME>``; a bad value fails start-up with the variable, the
value and the rule.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

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
            kind: type = type(getattr(defaults, f.name))
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
