"""An agent session as the episode machinery sees it: a turn-level environment whose turns are HTTP requests.

:class:`AgentEnvironment` is a :class:`~asyncrl.rollout.envs.interface.TurnEnvironment` (async ``reset`` and
``step``, run by the worker's :class:`~asyncrl.rollout.envs.runner.EnvRunner` under ``envTimeoutSeconds``):

- ``reset`` opens a session, starts the user's agent function in the agent runner process (or, ``agent: external``, waits
  until a harness takes the session) and returns the first request's messages and tools: the prompt;
- ``step(msg)`` answers the request in flight with the turn the engine sampled, then waits for what the agent
  does next: a request that *extends* the conversation (the messages we know, our answer as we gave it, then new
  messages) continues the trajectory, its new messages forced as the observation (``loss_mask`` 0), rendered as
  the chat template's tail after our turn: the sampled ids stay, nothing is re-encoded; a request that does not
  extend it (the harness edited or truncated the history) ends this trajectory as a superseded *branch* and the
  worker starts the next branch from that request (:attr:`branch_to`); the agent's end gives the reward.

:class:`AgentAdapter` is the :class:`~asyncrl.rollout.envs.adapter.TurnAdapter` of such an environment: it ends a
turn where the request asks (``stop``, ``max_tokens``: ``finish_reason`` ``stop`` / ``length``), forces the
end-of-turn token the chat template closes such a turn with before the next observation, and tells the
environment the turn's token counts (``usage``).

Partial rollouts, version stamps, the staleness bound, GRPO groups and every correction route see an ordinary
episode: nothing downstream knows the turns came over HTTP.
"""

import concurrent.futures
import math
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout.agent.endpoint import AgentEndpoint
from asyncrl.rollout.agent.limits import RefusalReason
from asyncrl.rollout.agent.protocol import (
    ChatRequest,
    FinishReason,
    RequestError,
    assistant_message,
    bounded_reward,
    completion,
)
from asyncrl.rollout.agent.runner import AgentRaised, AgentRunner, AgentRunnerLost, Returned
from asyncrl.rollout.agent.session import AgentSession, Event
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import EnvStep
from asyncrl.rollout.envs.interface import (
    AssistantMessage,
    Message,
    Reset,
    Sample,
    Turn,
)
from asyncrl.rollout.envs.render import render_observation, tool_messages
from asyncrl.rollout.envs.runner import EnvFault, EnvRunner, last_line
from asyncrl.rollout.tokenizer import Tokenizer

AgentFn = Callable[[Any, Sample], Awaitable[float | None]]  # async def fn(client, sample) -> reward | None
Scorer = Callable[[str, Sample], float]  # task.reward over the final assistant text and the sample


def _resolve(fut: "concurrent.futures.Future[Any]", value: Any = None, exc: BaseException | None = None) -> None:
    if fut.done():
        return
    try:
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(value)
    except concurrent.futures.InvalidStateError:
        pass


@dataclass
class TurnUsage:
    """What the adapter knows of the turn being answered: tokens before it, its own tokens, why it ended."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish: FinishReason = "stop"


class AgentEnvironment:
    """One trajectory (branch) of an agent session (see the module docstring).

    Args:
        endpoint: the worker's endpoint (its session table and counters).
        agent: the user's agent function, or None: an external harness takes the session.
        scorer: ``task.reward`` for an agent that returns None (None: such an agent's episode is aborted).
        traj_id: the trajectory id (shown in the session).
        timeout_s: ``spec.task.envTimeoutSeconds`` (the agent client's request timeout is far above it).
        loop: where agent functions run: the worker's agent runner process (``rollout/agent/runner.py``), which
            runs the function it imported by name (``agent`` is the worker's own copy: None means external).
    """

    truncated_reward = 0.0

    def __init__(self, endpoint: AgentEndpoint, agent: AgentFn | None, *, scorer: Scorer | None = None,
                 traj_id: str = "", timeout_s: float = 30.0, loop: AgentRunner | None = None) -> None:
        self.endpoint = endpoint
        self.agent = agent
        self.scorer = scorer
        self.traj_id = traj_id
        self.timeout_s = timeout_s
        self.loop = loop
        self.session: AgentSession | None = None
        self.request: ChatRequest | None = None
        self.messages: list[Message] = []  # the conversation as the agent sees it, our last answer included
        self.tools: list[dict[str, Any]] | None = None
        self.usage = TurnUsage()
        self.branch_to: Event | None = None  # the request that started the next branch (this one is superseded)
        self.branch = 0
        self.turns = 0
        self._first: Event | None = None
        self._agent_future: concurrent.futures.Future[Any] | None = None
        self._reply: concurrent.futures.Future[Any] | None = None  # the answer of the request in flight
        self._asked: list[Message] = []  # that request's messages
        self.final_text = ""

    @classmethod
    def continuation(cls, parent: "AgentEnvironment", traj_id: str) -> "AgentEnvironment":
        """The next branch of ``parent``'s session, starting from the request that did not extend it."""
        assert parent.branch_to is not None and parent.session is not None
        env = cls(parent.endpoint, parent.agent, scorer=parent.scorer, traj_id=traj_id, timeout_s=parent.timeout_s,
                  loop=parent.loop)
        env.session, env._first, env.branch = parent.session, parent.branch_to, parent.branch + 1
        env._agent_future = parent._agent_future
        return env

    # ------------------------------------------------------------------ the turn-level environment
    def open(self, sample: Sample) -> AgentSession:
        """Open the session (returns at once): start the agent function, or wait for a harness to take it."""
        s = self.session = self.endpoint.sessions.open(sample, self.traj_id, external=self.agent is None)
        if self.agent is not None:
            assert self.loop is not None, "AgentEnvironment: an agent function needs an AgentRunner"
            self._agent_future = self.loop.start(self.endpoint.base_url, s.key, dict(sample),
                                                 max(600.0, 20 * self.timeout_s))
            self._agent_future.add_done_callback(lambda f: self._agent_done(s, f))
        return s

    async def reset(self, sample: Sample) -> Reset:
        if self._first is None:
            s = self.session if self.session is not None else self.open(sample)
            ev = await s.mailbox.get()  # under envTimeoutSeconds: the agent's first request (or its end)
        else:
            ev = self._first
        if ev.kind != "request":
            self._fault(ev, first=True)
        self._take(ev)
        return Reset(list(ev.messages), tools=self.tools)

    def _agent_done(self, s: AgentSession, f: "concurrent.futures.Future[Any]") -> None:
        if f.cancelled():
            return
        exc = f.exception()
        if isinstance(exc, AgentRunnerLost):
            s.mailbox.put(Event("fault", reason=exc.reason, message=str(exc)))
            return
        if exc is not None:
            what = str(exc) if isinstance(exc, AgentRaised) else last_line(exc)
            s.mailbox.put(Event("fault", reason="agent_exception", message=f"the agent raised {what}"))
            return
        value = f.result()
        if isinstance(value, Returned) or (value is not None and (isinstance(value, bool)
                                                                  or not isinstance(value, int | float))):
            name = value.type_name if isinstance(value, Returned) else type(value).__name__
            s.mailbox.put(Event("fault", reason="agent_exception",
                                message=f"the agent returned {name}, expected a float or None"))
            return
        if value is None:
            s.mailbox.put(Event("end", reward=None))
            return
        try:  # the endpoint's bound on a posted reward holds for a returned one too
            reward = bounded_reward(value, self.endpoint.limits.max_reward_magnitude, "the agent returned reward")
        except RequestError as exc:
            self.endpoint.refuse("reward_out_of_range")
            nonfinite = isinstance(value, float) and not math.isfinite(value)
            s.abort(str(exc))
            s.mailbox.put(Event("fault", reason="nonfinite_reward" if nonfinite else "agent_bad_request",
                                message=str(exc)))
            return
        s.mailbox.put(Event("end", reward=reward))

    def _fault(self, ev: Event, *, first: bool = False) -> None:
        if ev.kind == "fault":
            raise EnvFault(ev.reason, ev.message)
        if first:
            raise EnvFault("agent_no_request", "the agent ended without calling the model (no chat completion request)")
        raise EnvFault("agent_bad_request", f"unexpected {ev.kind} event")

    def _take(self, ev: Event) -> None:
        assert ev.request is not None
        self.request = ev.request
        self.tools = ev.request.normal_tools()
        self._reply = ev.reply
        self._asked = list(ev.messages)

    async def step(self, msg: AssistantMessage) -> Turn:
        s = self.session
        assert s is not None and self.request is not None
        self.turns += 1
        ids = [f"call_{secrets.token_hex(6)}" for _ in msg.tool_calls]
        answer = completion(completion_id=f"chatcmpl-{secrets.token_hex(8)}", model=self.request.model or
                            self.endpoint.model, msg=msg, call_ids=ids,
                            finish="tool_calls" if msg.tool_calls else self.usage.finish,
                            prompt_tokens=self.usage.prompt_tokens,
                            completion_tokens=self.usage.completion_tokens).model_dump(mode="json")
        self.messages = [*self._asked, assistant_message(msg, ids)]
        self.final_text = msg.content
        with s.lock:
            s.answered, s.current = (self._asked, answer), None
        assert self._reply is not None
        _resolve(self._reply, answer)
        ev = await s.mailbox.get()
        if ev.kind == "request":
            n = len(self.messages)
            tools = ev.request.normal_tools() if ev.request is not None else None
            if ev.messages[:n] == self.messages and len(ev.messages) > n and tools == self.tools:
                obs = ev.messages[n:]
                self._take(ev)
                return Turn(obs)
            cap = self.endpoint.limits.max_branches
            if self.branch < cap:
                self.endpoint.count("prefix_mismatch")
                self.branch_to = ev
                return Turn(done=True, reason="branched: the request did not extend the conversation")
            # one branch too many: refused, and the session aborted (none of its branches trains; its key gets 409)
            exc = RequestError(400, f"this request would start branch {self.branch + 1} of session {s.id}, over "
                               f"spec.task.endpoint.maxBranches={cap}; the session is aborted", code="too_many_branches")
            self.endpoint.refuse("too_many_branches")
            s.abort(str(exc))
            if ev.reply is not None:
                _resolve(ev.reply, exc=exc)
            raise EnvFault("agent_bad_request", str(exc))
        if ev.kind == "end":
            reward = ev.reward
            if reward is None:
                if self.scorer is None:
                    raise EnvFault("agent_no_reward", "the agent returned None and the job has no task.reward to "
                                   "score it (return a float, post /v1/sessions/{id}/reward, or set task.reward)")
                try:
                    reward = float(self.scorer(self.final_text, dict(s.sample)))
                except Exception as exc:
                    raise EnvFault("exception", f"task.reward raised {last_line(exc)}") from exc
                if not math.isfinite(reward):
                    raise EnvFault("nonfinite_reward", f"task.reward gave {reward!r}")
            return Turn(done=True, reward=reward, success=reward >= 1.0, reason="agent ended")
        self._fault(ev)
        raise AssertionError("unreachable")

    def info(self) -> dict[str, Any]:
        s = self.session
        out: dict[str, Any] = {"session": s.id if s else "", "branch": self.branch, "turns": self.turns}
        if self.branch_to is not None:
            out["superseded_branch"] = True
        elif s is not None:  # the session's last branch carries its counts (asyncrl_agent_*_total)
            with s.lock:
                out["agent"] = {"requests": s.requests, "retries": s.retries, "branches": self.branch}
        return out

    def refuse_request(self, exc: RequestError, reason: RefusalReason) -> None:
        """Answer the request in flight with ``exc`` (counted under ``reason``) and abort the session."""
        self.endpoint.refuse(reason)
        if self.session is not None:
            self.session.abort(str(exc))
        if self._reply is not None:
            _resolve(self._reply, exc=exc)

    def answer_length(self, msg: AssistantMessage, usage: TurnUsage) -> None:
        """The episode reached ``spec.task.maxNewTokens`` inside a turn: the request in flight gets that turn as far
        as it was sampled, ``finish_reason`` ``length`` (as OpenAI answers a turn cut at the context), and the session
        then ends."""
        if self._reply is None or self._reply.done() or self.request is None:
            return
        ids = [f"call_{secrets.token_hex(6)}" for _ in msg.tool_calls]
        answer = completion(completion_id=f"chatcmpl-{secrets.token_hex(8)}", model=self.request.model or
                            self.endpoint.model, msg=msg, call_ids=ids, finish="length",
                            prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)
        _resolve(self._reply, answer.model_dump(mode="json"))

    def close(self, reason: str = "the episode ended", *, aborted: bool = False) -> None:
        """End the session (the episode is done, truncated or aborted): a request still waiting gets 404 and the
        agent function is cancelled; ``aborted``: later requests and rewards get 409."""
        s = self.session
        if s is None:
            return
        if aborted:
            s.abort(reason)
        self.endpoint.sessions.close(s)
        if self._agent_future is not None and not self._agent_future.done():
            self._agent_future.cancel()
        if self.request is not None and self._reply is not None and not self._reply.done():
            _resolve(self._reply, exc=RequestError(404, f"session {s.id} has ended: {reason}", code="session_finished"))


class AgentAdapter(TurnAdapter):
    """The :class:`TurnAdapter` of an :class:`AgentEnvironment` (see the module docstring)."""

    env: AgentEnvironment

    def __init__(self, task: str, env: AgentEnvironment, sample: Sample, tokenizer: Tokenizer, *,
                 runner: EnvRunner | None = None, tool_call_format: str = "hermes") -> None:
        super().__init__(task, env, sample, tokenizer, runner=runner, tool_call_format=tool_call_format)
        self.tool_call_format = tool_call_format

    def reset(self, rng: Any = None) -> list[int]:
        ids = super().reset(rng)
        self._context = 0
        self._within_context(len(ids))  # before any prefill
        self._context = len(ids)
        self._turn_tokens = 0
        return ids

    def _within_context(self, adding: int) -> None:
        """The request in flight's prompt (the trajectory so far plus ``adding`` tokens) and its ``max_tokens`` (at
        least one token) within the model's context; else it is answered 400 ``context_length_exceeded`` and the
        episode fails (``agent_bad_request``) before the engine sees a token of it."""
        context = self.env.endpoint.limits.context
        req = self.env.request
        if not context or req is None:
            return
        prompt = self._context + adding
        wanted = req.turn_limit or 1
        if prompt + wanted > context:
            exc = RequestError(400, f"this model's context is {context} tokens; the request's messages are {prompt} "
                               f"tokens and max_tokens asks for {wanted} more: shorten the messages or max_tokens",
                               param="messages", code="context_length_exceeded")
            self.env.refuse_request(exc, "context_length_exceeded")
            raise EnvFault("agent_bad_request", str(exc))

    def answer_at_budget(self) -> None:
        """The episode was truncated at ``spec.task.maxNewTokens``: answer the request in flight with its turn so far
        (``finish_reason`` ``length``)."""
        content, calls, bad = self._parse(self._turn_text)
        msg = AssistantMessage(self._turn_text, content, calls, bad, "length", eos=False)
        self.env.answer_length(msg, TurnUsage(self._context - self._turn_tokens, self._turn_tokens, "length"))

    def end_of_turn(self, turn_text: str) -> AssistantMessage | None:
        self._turn_tokens += 1
        self._context += 1
        self._turn_text = turn_text
        msg = super().end_of_turn(turn_text)
        if msg is not None:
            self.env.usage = TurnUsage(self._context, self._turn_tokens, "stop")
            return msg
        req = self.env.request
        if req is None:
            return None
        first: tuple[int, str] | None = None
        for stop in req.stop_strings:
            i = turn_text.find(stop)
            if i >= 0 and (first is None or (i, stop) < first):
                first = (i, stop)
        if first is not None:
            content, calls, bad = self._parse(turn_text[: first[0]])
            self.env.usage = TurnUsage(self._context, self._turn_tokens, "stop")
            return AssistantMessage(turn_text, content, calls, bad, first[1], eos=False)
        limit = req.turn_limit
        if limit is not None and self._turn_tokens >= limit:
            content, calls, bad = self._parse(turn_text)
            self.env.usage = TurnUsage(self._context, self._turn_tokens, "length")
            return AssistantMessage(turn_text, content, calls, bad, "length", eos=False)
        return None

    def finish_turn(self, msg: AssistantMessage, turn: Turn) -> EnvStep:
        """The agent's next messages as forced ids after the sampled turn: the template's tail after the turn, and
        first the end-of-turn token when the turn ended at a stop string or ``max_tokens`` (the template closes
        every assistant turn with it; the engine has not sampled it)."""
        self._turn_tokens = 0
        t = self.checked_turn(turn)
        if isinstance(t, EnvStep):
            return t
        history = tool_messages(self.tokenizer, self.env.messages, self.env.tools)  # as the prompt was rendered
        obs = list(t.observation)
        try:
            ids = render_observation(self.tokenizer, history, obs, self.env.tools, inline=False)
        except ValueError as exc:
            raise EnvFault("agent_bad_request", f"the request's new messages: {last_line(exc)}") from exc
        if not msg.eos:
            ids = [self.tokenizer.eos_id, *ids]
        if not ids:
            raise EnvFault("agent_bad_request", "the request's new messages render to no tokens")
        self._within_context(len(ids))  # before they are forced, and before the next turn's prefill
        self.messages = [*history, *obs]
        self._context += len(ids)
        self._turn_text = ""
        return EnvStep(tokens=tuple(ids))

    _context: int = 0
    _turn_tokens: int = 0
    _turn_text: str = ""  # the turn being sampled, as far as it is


__all__ = ["AgentAdapter", "AgentEnvironment", "AgentFn", "Scorer", "TurnUsage"]
