"""The token-level :class:`~asyncrl.rollout.envs.base.Environment` of a turn-level one.

The engines advance episodes token by token (``rollout/engine.py``); a user's environment answers
whole turns (``rollout/envs/interface.py``). :class:`TurnAdapter` sits between: it renders the reset
conversation into prompt ids, watches the sampled text for the end of the assistant turn (the
tokenizer's end-of-turn token, or a stop string of the environment), parses the turn's tool calls,
hands the turn to the environment's ``step`` through an :class:`~asyncrl.rollout.envs.runner.EnvRunner`
(off the decode loop, under a timeout) and renders its observation into the ids the engine forces.
Every failure of user code surfaces as an :class:`~asyncrl.rollout.envs.runner.EnvFault`.
"""

import asyncio
import concurrent.futures
import inspect
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.envs.conforms import conforms
from asyncrl.rollout.envs.interface import (
    AssistantMessage,
    Message,
    NonFiniteReward,
    Reset,
    Sample,
    Turn,
    TurnEnvironment,
    WithInfo,
    WithTruncatedReward,
    check_messages,
    check_turn,
)
from asyncrl.rollout.envs.render import render_observation, render_prompt, tool_messages
from asyncrl.rollout.envs.runner import EnvFault, EnvRunner, last_line
from asyncrl.rollout.envs.toolcalls import Parsed, get_parser
from asyncrl.rollout.tokenizer import Tokenizer


def _reset_parts(out: Any, what: str) -> tuple[list[Message], list[dict[str, Any]] | None, tuple[str, ...]]:
    if isinstance(out, Reset):
        messages, tools, stop = out.messages, out.tools, out.stop
    else:
        messages, tools, stop = out, None, ()
    msgs = check_messages(messages, f"{what} messages")
    if not msgs:
        raise ValueError(f"{what}: no messages")
    if tools is not None and (not isinstance(tools, Sequence) or not all(isinstance(t, Mapping) for t in tools)):
        raise ValueError(f"{what}: tools must be a list of JSON schema objects")
    if not isinstance(stop, tuple) or not all(isinstance(s, str) and s for s in stop):
        raise ValueError(f"{what}: stop must be a tuple of non-empty strings, got {stop!r}")
    return msgs, None if tools is None else [dict(t) for t in tools], stop


class TurnAdapter:
    """One episode of a turn-level environment, as the engines see it.

    Args:
        task: the task's name (``Trajectory.task``).
        env: a fresh turn-level environment (``Factory(**args)``).
        sample: this episode's sample (handed to ``env.reset``).
        tokenizer: the model's tokenizer.
        runner: where user calls run (timeout, thread pool / event loop); None: inline in the
            caller's thread, without a timeout (scripted replays, demonstrations, tests).
        tool_call_format: ``spec.task.toolCallFormat``.
    """

    sample: Sample  # this episode's sample (what env.reset gets)

    def __init__(self, task: str, env: TurnEnvironment, sample: Sample, tokenizer: Tokenizer, *,
                 runner: EnvRunner | None = None, tool_call_format: str = "hermes") -> None:
        self.task = task
        self.env = env
        self.sample = sample
        self.tokenizer = tokenizer
        self.truncated_reward = (float(cast(WithTruncatedReward, env).truncated_reward)
                                 if conforms(env, WithTruncatedReward) else 0.0)
        self.runner = runner
        self._parse: Callable[[str], Parsed] = get_parser(tool_call_format)
        self._name = type(env).__name__
        self.messages: list[Message] = []
        self.tools: list[dict[str, Any]] | None = None
        self.stop: tuple[str, ...] = ()
        self.turns = 0

    # ------------------------------------------------------------------ the token-level Environment
    def reset(self, rng: random.Random | None = None) -> list[int]:
        """Reset the environment with this episode's sample (``rng`` unused: the sample decides)."""
        what = f"{self._name}.reset"
        out = self._call(self.env.reset, self.sample, what)
        try:
            messages, self.tools, self.stop = _reset_parts(out, what)
            self.messages = tool_messages(self.tokenizer, messages, self.tools)
            return render_prompt(self.tokenizer, self.messages, self.tools)
        except ValueError as exc:
            raise EnvFault("bad_messages", f"{what}: {last_line(exc)}") from exc

    def step(self, turn_text: str) -> EnvStep:
        """The synchronous form (scripted replays, re-scoring): the turn so far -> the answer."""
        msg = self.end_of_turn(turn_text)
        if msg is None:
            return CONTINUE
        return self.finish_turn(msg, self._call(self.env.step, msg, f"{self._name}.step"))

    def _call(self, fn: Callable[..., Any], arg: Any, what: str) -> Any:
        if self.runner is not None:
            return self.runner.call(fn, arg, what=what)
        try:
            out = fn(arg)
            return asyncio.run(out) if inspect.isawaitable(out) else out  # type: ignore[arg-type]
        except Exception as exc:
            raise EnvFault("exception", f"{what} raised {last_line(exc)}") from exc

    def info(self) -> dict[str, Any]:
        if not conforms(self.env, WithInfo):
            return {}
        try:
            return dict(cast(WithInfo, self.env).info())
        except Exception as exc:  # a broken info() must not lose the trajectory
            return {"info_error": last_line(exc)}

    # ------------------------------------------------------------------ the turn-level split
    def end_of_turn(self, turn_text: str) -> AssistantMessage | None:
        """The finished turn when ``turn_text`` (the turn's sampled tokens so far, decoded as a whole) ends at
        the end-of-turn token or contains a stop string; else None (the turn goes on)."""
        eos = self.tokenizer.eos_token
        if turn_text.endswith(eos):
            return self._message(turn_text[: -len(eos)], eos, eos=True)
        first: tuple[int, str] | None = None  # the earliest stop string (the smaller one at a tie)
        for s in self.stop:
            i = turn_text.find(s)
            if i >= 0 and (first is None or (i, s) < first):
                first = (i, s)
        return None if first is None else self._message(turn_text, first[1], eos=False)

    def _message(self, text: str, ended_by: str, *, eos: bool) -> AssistantMessage:
        content, calls, bad = self._parse(text)
        return AssistantMessage(text, content, calls, bad, ended_by, eos)

    def submit(self, msg: AssistantMessage) -> "concurrent.futures.Future[Any]":
        """Start ``env.step(msg)`` off the decode loop; resolve it with :meth:`finish_turn`."""
        what = f"{self._name}.step"
        if self.runner is not None:
            return self.runner.submit(self.env.step, msg, what=what)
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            fut.set_result(self._call(self.env.step, msg, what))
        except EnvFault as exc:
            fut.set_exception(exc)
        return fut

    def checked_turn(self, turn: Turn) -> Turn | EnvStep:
        """``env.step``'s answer checked (``EnvFault`` when invalid) and counted: the episode's end as its
        :class:`EnvStep`, else the turn whose observation is to be forced."""
        try:
            t = check_turn(turn, f"{self._name}.step")
        except NonFiniteReward as exc:
            raise EnvFault("nonfinite_reward", str(exc)) from exc
        except ValueError as exc:
            raise EnvFault("bad_messages", str(exc)) from exc
        self.turns += 1
        if t.done:
            return EnvStep(done=True, reward=t.reward, success=t.success, reason=t.reason or "done")
        return t

    def finish_turn(self, msg: AssistantMessage, turn: Turn) -> EnvStep:
        """``env.step``'s answer -> the tokens to force (or the episode's end); EnvFault when invalid."""
        what = f"{self._name}.step"
        t = self.checked_turn(turn)
        if isinstance(t, EnvStep):
            return t
        history = [*self.messages, msg.to_message()]
        obs = list(t.observation)
        try:
            ids = render_observation(self.tokenizer, history, obs, self.tools, inline=not msg.eos)
        except ValueError as exc:
            raise EnvFault("bad_messages", f"{what} observation: {last_line(exc)}") from exc
        if not ids:
            raise EnvFault("bad_messages", f"{what}: the observation renders to no tokens")
        self.messages = [*history, *obs]
        return EnvStep(tokens=tuple(ids))
