"""An in-flight episode: the mutable state the engine advances token by token.

It holds the environment, the aligned per-token lists that become a :class:`Trajectory`, the queue
of environment tokens still to force and the text of the current assistant turn. An interrupted
episode keeps all of it, so a later ``generate`` call resumes it exactly where it stopped (with
whatever weights are loaded by then: the prefix keeps its versions and ``logp_mu``). An episode
whose environment is answering a finished turn (``pending``) samples nothing until the answer
arrives; the engine keeps decoding the others meanwhile.
"""

import concurrent.futures
import dataclasses
import functools
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from asyncrl.rollout.detokenize import IncrementalDetokenizer
from asyncrl.rollout.envs.base import Environment, TurnLevelEnvironment, turn_level
from asyncrl.rollout.envs.interface import AssistantMessage
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus


@dataclass
class Episode:
    """One trajectory being generated, around the :class:`Trajectory` it becomes (``record``).

    The per-token lists (all of length ``len(tokens)``) live in ``record`` only: the episode appends to them,
    and hands ``record`` itself out when it is done (:meth:`to_trajectory`), so a token is written once on its
    way from the sampler to the Ray hop. What only an in-flight episode has (the environment, the tokens
    still to force, the current turn's text, a pending environment answer) is the episode's own.
    """

    env: Environment
    record: Trajectory
    forced: deque[int] = field(default_factory=deque)  # environment tokens still to feed
    turn: int = 0  # assistant turn index (environment answers seen so far)
    # the current turn's sampled tokens as text, decoded incrementally (None until the turn's first token)
    turn_decoder: IncrementalDetokenizer | None = None
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
        return cls(env, Trajectory(traj_id=traj_id, group_id=group_id, task=env.task, tokens=list(prompt),
                                   prompt_len=n, loss_mask=[False] * n, versions=[NO_VERSION] * n,
                                   logp_mu=[0.0] * n, turn_ids=[-1] * n))

    # The record's identity and per-token lists, read where the engines read them (``e.tokens[-1]`` ...).
    @property
    def traj_id(self) -> str:
        return self.record.traj_id

    @property
    def group_id(self) -> str:
        return self.record.group_id

    @property
    def tokens(self) -> list[int]:
        return self.record.tokens

    @property
    def prompt_len(self) -> int:
        return self.record.prompt_len

    @property
    def loss_mask(self) -> list[bool]:
        return self.record.loss_mask

    @property
    def versions(self) -> list[int]:
        return self.record.versions

    @property
    def logp_mu(self) -> list[float]:
        return self.record.logp_mu

    @property
    def turn_ids(self) -> list[int]:
        return self.record.turn_ids

    @property
    def logp_old(self) -> list[float] | None:
        """Exact old log-probs scored while the episode was suspended (interrupt-sync); NaN = not scored."""
        return self.record.logp_old

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
    def turn_text(self) -> str:
        """``tokenizer.decode`` of the current turn's sampled tokens: what the environment reads after each one
        (``rollout/detokenize.py``: never ``decode([token])`` appended per token, which garbles multibyte
        characters and drops SentencePiece word spaces)."""
        return "" if self.turn_decoder is None else self.turn_decoder.text

    def next_turn(self) -> None:
        """The environment answered: its tokens are queued, the next sampled token starts a new turn's text."""
        self.turn += 1
        self.turn_decoder = None

    @property
    def new_tokens(self) -> int:
        """Tokens after the prompt (agent and environment)."""
        r = self.record  # read directly: asked several times per token (end_at_budget)
        return len(r.tokens) - r.prompt_len

    def add_sampled(self, token: int, version: int, logp: float) -> None:
        r = self.record
        r.tokens.append(token)
        r.loss_mask.append(True)
        r.versions.append(version)
        r.logp_mu.append(logp)
        r.turn_ids.append(self.turn)
        if r.logp_old is not None:
            r.logp_old.append(math.nan)
        if self.turn_decoder is None:
            self.turn_decoder = IncrementalDetokenizer(self.env.tokenizer)
        self.turn_decoder.push(token)

    def add_forced(self, token: int) -> None:
        r = self.record
        r.tokens.append(token)
        r.loss_mask.append(False)
        r.versions.append(NO_VERSION)
        r.logp_mu.append(0.0)
        r.turn_ids.append(-1)
        if r.logp_old is not None:
            r.logp_old.append(math.nan)

    def set_logp_old(self, positions: list[int], values: list[float]) -> None:
        """Keep exact old log-probs of sampled tokens at ``positions`` (:meth:`Trajectory.set_logp_old`)."""
        self.record.set_logp_old(positions, values)

    def finish(self, status: TrajectoryStatus, reward: float, success: bool, reason: str) -> None:
        self.done, self.status, self.reward, self.success, self.reason = True, status, reward, success, reason
        self.forced.clear()
        self.pending = None

    def fail(self, error: str, message: str) -> None:
        """User code failed (``error``: an ``asyncrl_env_errors_total`` reason): abort this episode only."""
        self.env_error = error
        self.finish(TrajectoryStatus.ABORTED, 0.0, False, message)

    def to_trajectory(self, status: TrajectoryStatus | None = None) -> Trajectory:
        """The episode as a :class:`Trajectory`; ``status`` overrides the episode's.

        A done episode hands out ``record`` itself (the lists are final: nothing appends to them again); an
        episode still in flight (an interrupt-sync snapshot, the suspended episodes a shutdown aborts) gives
        a snapshot with copies of the lists, since it may grow again."""
        info = dict(self.env.info())
        info["end_reason"] = self.reason
        if self.env_error:
            info["env_error"] = self.env_error
        r = self.record
        out = r if self.done else dataclasses.replace(
            r, tokens=list(r.tokens), loss_mask=list(r.loss_mask), versions=list(r.versions), logp_mu=list(r.logp_mu),
            turn_ids=list(r.turn_ids), logp_old=None if r.logp_old is None else list(r.logp_old),
            routes=None if r.routes is None else r.routes.copy())
        out.reward, out.success, out.info = self.reward, self.success, info
        out.status = self.status if status is None else status
        return out
