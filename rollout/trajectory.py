"""The unit of data between rollout and training: a versioned trajectory.

Every token carries the policy version that produced it and its inference-side log-prob ``mu``;
prompt and environment (tool) tokens carry ``version = -1``, ``logp_mu = 0`` and
``loss_mask = False`` and are never trained on (docs/architecture.md, the path of one token). Plain Python lists: it crosses
process boundaries through Ray and stays free of torch.
"""

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.rollout.routes import RouteLog

NO_VERSION = -1


class TrajectoryStatus(StrEnum):
    """How a trajectory ended."""

    FINISHED = "finished"  # the episode ended (answer given, or the environment closed it)
    TRUNCATED = "truncated"  # hit task.maxNewTokens without an answer (reward as the task says)
    ABORTED = "aborted"  # cut off for good (shutdown, error); never trained on, always counted
    # A snapshot of an in-flight episode taken by ``interrupt()`` (interrupt-sync): its prefix is
    # final, but the episode stays resumable in its worker and comes back later as FINISHED or
    # TRUNCATED. Use it to compute old logits for the prefix; never train on it as an episode.
    INTERRUPTED = "interrupted"


@dataclass
class Trajectory:
    """One episode: prompt + agent tokens + environment tokens, aligned per token.

    All per-token lists have length ``len(tokens)`` (``T``).
    """

    traj_id: str
    group_id: str  # trajectories of one prompt share it (GRPO group)
    task: str
    tokens: list[int]
    prompt_len: int
    loss_mask: list[bool]  # True = sampled by the agent, trained on
    versions: list[int]  # version that generated each token; NO_VERSION for prompt/env tokens
    logp_mu: list[float]  # inference-side log-prob of each sampled token; 0.0 elsewhere
    turn_ids: list[int]  # assistant turn index of each sampled token; -1 elsewhere
    reward: float = 0.0
    success: bool = False
    status: TrajectoryStatus = TrajectoryStatus.FINISHED
    info: dict[str, Any] = field(default_factory=dict)
    # Exact training-side old log-prob of each sampled token under its own version, filled in by the
    # old-logit stage before training (strategies dedicated and interruptSync); NaN = not scored yet.
    # None: nothing scored (every other reference).
    logp_old: list[float] | None = None
    # The expert routes of every position, per version (rollout/routes.py); None unless the engine captures
    # them (spec.correction.routingReplay: rollout, a mixture-of-experts model).
    routes: "RouteLog | None" = None

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("loss_mask", "versions", "logp_mu", "turn_ids", "logp_old"):
            if getattr(self, name) is None:
                continue
            got = len(getattr(self, name))
            if got != n:
                raise ValueError(f"Trajectory {self.traj_id}: {name} has {got} entries, tokens has {n}")

    @property
    def sampled_versions(self) -> list[int]:
        """Versions of the trained (agent-sampled) tokens."""
        return [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]

    @property
    def min_version(self) -> int:
        """Oldest version among sampled tokens (NO_VERSION if there are none)."""
        vs = self.sampled_versions
        return min(vs) if vs else NO_VERSION

    @property
    def max_version(self) -> int:
        """Newest version among sampled tokens (NO_VERSION if there are none)."""
        vs = self.sampled_versions
        return max(vs) if vs else NO_VERSION

    def unscored(self, version: int | None = None) -> list[int]:
        """Positions of sampled tokens (of ``version``, or any) that have no exact ``logp_old`` yet."""
        old = self.logp_old
        return [
            i for i, (m, v) in enumerate(zip(self.loss_mask, self.versions, strict=True))
            if m and (version is None or v == version) and (old is None or old[i] != old[i])
        ]

    def set_logp_old(self, positions: list[int], values: list[float]) -> None:
        """Record exact old log-probs of the tokens at ``positions`` (NaN elsewhere until scored)."""
        if len(positions) != len(values):
            raise ValueError(f"set_logp_old: {len(positions)} positions but {len(values)} values")
        if self.logp_old is None:
            self.logp_old = [math.nan] * len(self.tokens)
        for i, v in zip(positions, values, strict=True):
            if not self.loss_mask[i]:
                raise ValueError(f"trajectory {self.traj_id}: position {i} is not a sampled token")
            self.logp_old[i] = float(v)

    @property
    def is_partial(self) -> bool:
        """True when the sampled tokens span more than one version (a partial rollout)."""
        vs = self.sampled_versions
        return bool(vs) and min(vs) != max(vs)
