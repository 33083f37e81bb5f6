"""An in-flight episode: the mutable state the engine advances token by token.

It holds the environment, the aligned per-token lists that become a :class:`Trajectory`, the queue
of environment tokens still to force and the text of the current assistant turn. An interrupted
episode keeps all of it, so a later ``generate`` call resumes it exactly where it stopped (with
whatever weights are loaded by then: the prefix keeps its versions and ``logp_mu``). An episode
whose environment is answering a finished turn (``pending``) samples nothing until the answer
arrives; the engine keeps decoding the others meanwhile.
"""

import concurrent.futures
import functools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncrl.rollout.envs.base import Environment, TurnLevelEnvironment, turn_level
from asyncrl.rollout.envs.interface import AssistantMessage
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus


@dataclass
class Episode:
    """One trajectory being generated. Per-token lists all have length ``len(tokens)``."""

    traj_id: str
    group_id: str
    env: Environment
    tokens: list[int]
    prompt_len: int
    loss_mask: list[bool] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    logp_mu: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    # Exact old log-probs scored while the episode was suspended (interrupt-sync); NaN = not scored.
    logp_old: list[float] | None = None
    forced: deque[int] = field(default_factory=deque)  # environment tokens still to feed
    turn: int = 0  # assistant turn index (environment answers seen so far)
    turn_text: str = ""  # agent text of the current turn
    done: bool = False
    status: TrajectoryStatus = TrajectoryStatus.FINISHED
    reward: float = 0.0
    success: bool = False
    reason: str = ""
    # A finished assistant turn whose environment answer is being computed off the decode loop:
    # (the turn, the future of env.step). The episode samples nothing until it resolves.
    pending: tuple[AssistantMessage, "concurrent.futures.Future[Any]"] | None = None
    env_error: str = ""  # the reason (asyncrl_env_errors_total) when user code aborted the episode

    @classmethod
    def start(cls, traj_id: str, group_id: str, env: Environment, rng: random.Random) -> "Episode":
        """Reset ``env`` with ``rng`` and hold its prompt."""
        prompt = env.reset(rng)
        n = len(prompt)
        return cls(
            traj_id, group_id, env, list(prompt), n, [False] * n, [NO_VERSION] * n, [0.0] * n, [-1] * n
        )

    @functools.cached_property
    def turn_level(self) -> TurnLevelEnvironment | None:
        """The environment as a :class:`~asyncrl.rollout.envs.base.TurnLevelEnvironment` (asked only when a
        turn ends, answering off the decode loop), or None: it is stepped per token. Decided once: the
        protocol check costs microseconds, the engines ask after every token."""
        return turn_level(self.env)

    @property
    def task(self) -> str:
        return self.env.task

    @property
    def new_tokens(self) -> int:
        """Tokens after the prompt (agent and environment)."""
        return len(self.tokens) - self.prompt_len

    def add_sampled(self, token: int, version: int, logp: float) -> None:
        self.tokens.append(token)
        self.loss_mask.append(True)
        self.versions.append(version)
        self.logp_mu.append(logp)
        self.turn_ids.append(self.turn)
        if self.logp_old is not None:
            self.logp_old.append(math.nan)

    def add_forced(self, token: int) -> None:
        self.tokens.append(token)
        self.loss_mask.append(False)
        self.versions.append(NO_VERSION)
        self.logp_mu.append(0.0)
        self.turn_ids.append(-1)
        if self.logp_old is not None:
            self.logp_old.append(math.nan)

    def set_logp_old(self, positions: list[int], values: list[float]) -> None:
        """Keep exact old log-probs of sampled tokens at ``positions`` (the trajectory carries them)."""
        if self.logp_old is None:
            self.logp_old = [math.nan] * len(self.tokens)
        for i, v in zip(positions, values, strict=True):
            self.logp_old[i] = float(v)

    def finish(self, status: TrajectoryStatus, reward: float, success: bool, reason: str) -> None:
        self.done, self.status, self.reward, self.success, self.reason = True, status, reward, success, reason
        self.forced.clear()
        self.pending = None

    def fail(self, error: str, message: str) -> None:
        """User code failed (``error``: an ``asyncrl_env_errors_total`` reason): abort this episode only."""
        self.env_error = error
        self.finish(TrajectoryStatus.ABORTED, 0.0, False, message)

    def to_trajectory(self, status: TrajectoryStatus | None = None) -> Trajectory:
        """A snapshot (copies of the lists) as a :class:`Trajectory`; ``status`` overrides the episode's."""
        info = dict(self.env.info())
        info["end_reason"] = self.reason
        if self.env_error:
            info["env_error"] = self.env_error
        return Trajectory(
            traj_id=self.traj_id,
            group_id=self.group_id,
            task=self.task,
            tokens=list(self.tokens),
            prompt_len=self.prompt_len,
            loss_mask=list(self.loss_mask),
            versions=list(self.versions),
            logp_mu=list(self.logp_mu),
            turn_ids=list(self.turn_ids),
            logp_old=None if self.logp_old is None else list(self.logp_old),
            reward=self.reward,
            success=self.success,
            status=self.status if status is None else status,
            info=info,
        )
