"""The environment interface of multi-turn agent tasks, and a scripted replay over it.

An episode is: prompt tokens (from :meth:`Environment.reset`), then agent turns. After every token
the agent samples, the engine calls :meth:`Environment.step` with the text of the current assistant
turn so far: ``tokenizer.decode`` of the turn's sampled tokens, built incrementally
(``rollout/detokenize.py``; :func:`replay` and :func:`rescore` build it the same way); the environment answers with tokens to force (a tool result: ``loss_mask`` False,
``version`` -1), and/or ends the episode with a reward. The turn text restarts after each forced
observation, so ``turn_ids`` of sampled tokens count the environment answers seen before them.

An environment that also implements :class:`TurnLevelEnvironment` (every turn-level one does, through
``envs/adapter.py``'s ``TurnAdapter``) is asked only when a turn ends, and answers off the decode loop;
one that does not is stepped per token, inline.
"""

import concurrent.futures
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from asyncrl.rollout.detokenize import IncrementalDetokenizer
from asyncrl.rollout.envs.conforms import conforms
from asyncrl.rollout.envs.interface import AssistantMessage, Turn
from asyncrl.rollout.tokenizer import Tokenizer


@dataclass(frozen=True)
class EnvStep:
    """The environment's answer to one agent token.

    ``tokens`` are forced one per decode step before the agent samples again; ``reward`` and
    ``success`` are final only when ``done``.
    """

    tokens: tuple[int, ...] = ()
    done: bool = False
    reward: float = 0.0
    success: bool = False
    reason: str = ""


CONTINUE = EnvStep()


@runtime_checkable
class Environment(Protocol):
    """One episode of an agent task (stateful; make a fresh one per episode)."""

    task: str
    tokenizer: Tokenizer
    truncated_reward: float  # reward of an episode that hits maxNewTokens without ending

    def reset(self, rng: random.Random) -> list[int]:
        """Draw a problem from ``rng``; returns the prompt tokens (``tokenizer.chat_prompt``'s)."""
        ...

    def step(self, turn_text: str) -> EnvStep:
        """React to the agent's current turn after one more sampled token: ``turn_text`` is
        ``tokenizer.decode`` of the turn's sampled tokens (it ends in U+FFFD while a character is incomplete)."""
        ...

    def info(self) -> dict[str, Any]:
        """Plain-data description of the episode's problem (copied into ``Trajectory.info``)."""
        ...


@runtime_checkable
class TurnLevelEnvironment(Protocol):
    """Optional on an :class:`Environment`: answer whole assistant turns, off the decode loop.

    The engines dispatch on this protocol (``isinstance``, answered by ``envs/conforms.py``, once per
    episode: ``Episode.turn_level``). After each sampled token they call :meth:`end_of_turn` with the
    turn's text so far; when it returns a message, :meth:`submit` starts the environment's answer
    elsewhere (other episodes keep decoding) and :meth:`finish_turn` turns the answer, once there, into
    the :class:`EnvStep` to apply. An environment without these three methods is stepped per token with
    :meth:`Environment.step`, inline. A user's chat-level environment (``envs/interface.py``) never
    implements this itself: the adapter that wraps it does.
    """

    def end_of_turn(self, turn_text: str) -> AssistantMessage | None:
        """The finished turn when ``turn_text`` (the turn's sampled tokens so far, decoded as a whole) ends it, else
        None."""
        ...

    def submit(self, msg: AssistantMessage) -> "concurrent.futures.Future[Any]":
        """Start the environment's answer to ``msg``; returns at once. The future's value goes to
        :meth:`finish_turn`; a fault of user code raises ``EnvFault`` from ``result()``."""
        ...

    def finish_turn(self, msg: AssistantMessage, turn: Turn) -> EnvStep:
        """The answer to ``msg`` as tokens to force or the episode's end; ``EnvFault`` when it is invalid."""
        ...


def turn_level(env: Environment) -> TurnLevelEnvironment | None:
    """``env`` when it is a :class:`TurnLevelEnvironment`, else None (it is stepped per token)."""
    return cast(TurnLevelEnvironment, env) if conforms(env, TurnLevelEnvironment) else None


@dataclass
class ScriptedEpisode:
    """Result of :func:`replay`: the aligned tokens of a scripted episode."""

    tokens: list[int]
    loss_mask: list[bool]  # True = agent token
    prompt_len: int
    done: bool
    reward: float
    success: bool
    reason: str
    turn_texts: list[str] = field(default_factory=list)


def replay(env: Environment, prompt: Sequence[int], agent_turns: Sequence[str]) -> ScriptedEpisode:
    """Play ``agent_turns`` (agent text per turn) against ``env`` exactly as the engine would.

    Each turn's tokens are fed one at a time; the episode stops at the first ``done``. A turn that
    does not end where the environment answers is an error (the script and the task disagree).
    """
    tok = env.tokenizer
    tokens, mask = list(prompt), [False] * len(prompt)
    for k, turn in enumerate(agent_turns):
        ids = tok.encode(turn)
        turn_text = IncrementalDetokenizer(tok)  # the turn's text, as the engine builds it (Episode.turn_text)
        for j, i in enumerate(ids):
            tokens.append(i)
            mask.append(True)
            turn_text.push(i)
            text = turn_text.text
            out = env.step(text)
            if out.done:
                if j != len(ids) - 1:
                    raise ValueError(
                        f"replay: {env.task} ended the episode inside turn {k} {turn!r} at {text!r}"
                    )
                return ScriptedEpisode(tokens, mask, len(prompt), True, out.reward, out.success, out.reason)
            if out.tokens:
                if j != len(ids) - 1:
                    raise ValueError(f"replay: {env.task} answered inside turn {k} {turn!r} at {text!r}")
                tokens.extend(out.tokens)
                mask.extend([False] * len(out.tokens))
    return ScriptedEpisode(tokens, mask, len(prompt), False, env.truncated_reward, False, "script ended")


def rescore(
    env: Environment, tokens: Sequence[int], loss_mask: Sequence[bool], prompt_len: int
) -> ScriptedEpisode:
    """Replay a recorded episode (prompt already loaded into ``env``) and check its environment tokens.

    Feeds the agent tokens (``loss_mask`` True) to ``env`` turn by turn; raises a ``ValueError`` if a
    recorded environment token differs from what ``env`` answers. The result's ``done``/``reward``
    are the environment's own verdict, independent of whoever recorded the episode.
    """
    tok = env.tokenizer
    turn_text, expect = IncrementalDetokenizer(tok), list[int]()  # the turn's text, as the engine builds it
    out = EnvStep()
    for t in range(prompt_len, len(tokens)):
        if not loss_mask[t]:
            if not expect or expect.pop(0) != tokens[t]:
                raise ValueError(
                    f"rescore: environment token {t} ({tok.decode([tokens[t]])!r}) was not forced by {env.task}"
                )
            continue
        if expect:
            raise ValueError(
                f"rescore: agent token at {t} while {env.task} still had {len(expect)} tokens to force"
            )
        turn_text.push(tokens[t])
        out = env.step(turn_text.text)
        if out.done:
            if t != len(tokens) - 1:
                raise ValueError(f"rescore: {env.task} ended the episode at token {t} of {len(tokens)}")
            break
        if out.tokens:
            expect, turn_text = list(out.tokens), IncrementalDetokenizer(tok)
    return ScriptedEpisode(
        list(tokens), list(loss_mask), prompt_len, out.done, out.reward, out.success, out.reason
    )
