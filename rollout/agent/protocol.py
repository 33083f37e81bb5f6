"""The OpenAI chat-completions wire format, as the endpoint reads and writes it.

Requests are validated by :class:`ChatRequest` (the fields the endpoint honours; unknown ones are accepted
and ignored, as OpenAI-compatible servers do, except those it cannot honour, refused with a 400 naming the field:
``n > 1``, ``stream``, ``logit_bias`` (it would change what is trained), a ``tool_choice`` other than ``auto``).
Bodies are parsed by :func:`parse_json` (a nesting bound, no traceback for any input); name-like strings are
bounded by :func:`check_names` and never echoed back whole. Responses are the ``openai`` package's own types (``ChatCompletion`` and its
parts, ``Model``), so what a client parses is exactly what the SDK expects.

Messages are compared in a *normal form* (:func:`normal_message`): what the chat template renders of them.
An agent echoes our assistant turn back with ``content: null`` beside tool calls, ``arguments`` as a JSON
string and extra keys (``refusal``, ``annotations``); those differences are not an edit of the history.
"""

import json
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from openai.types import CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message_function_tool_call import (
    ChatCompletionMessageFunctionToolCall,
    Function,
)
from pydantic import BaseModel, ConfigDict, Field, field_validator

from asyncrl.rollout.envs.interface import ROLES, AssistantMessage, Message

FinishReason = Literal["stop", "length", "tool_calls"]


class RequestError(ValueError):
    """A request the endpoint refuses: ``status`` (400, 401, 404, 409, 413, 429) and OpenAI's error ``type``/``code``."""

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.code, self.param = status, type_, code, param

    def body(self) -> dict[str, Any]:
        """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``: the fields the endpoint honours.

    ``temperature`` and ``top_p`` are accepted and checked, but a training session samples at the job's
    ``spec.task.temperature`` with no nucleus cut: the trainer's ratio ``pi/mu`` needs ``mu`` to be the policy's
    own distribution at that temperature (a request asking for another is answered at the job's temperature and counted: ``sampling_overridden``).
    """

    model_config = ConfigDict(extra="allow")

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logit_bias: Any = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False

    @field_validator("n")
    @classmethod
    def _one_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("n must be 1: each choice is its own trajectory; open one session per sample "
                             "(spec.task.groupSize sessions are opened per prompt)")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice(cls, v: Any) -> Any:
        if v not in (None, "auto"):
            raise ValueError(f"tool_choice {_shown(v)} cannot be honoured: the policy decides whether to call a tool "
                             "(a forced or forbidden call would train a turn the policy did not choose); send 'auto' "
                             "or leave it out")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: Any) -> Any:
        if v:
            raise ValueError("logit_bias cannot be honoured: a biased distribution is not the policy's own, and the "
                             "trainer's ratio pi/mu needs mu to be it; leave logit_bias out")
        return None

    @field_validator("stream")
    @classmethod
    def _no_stream(cls, v: bool) -> bool:
        if v:
            raise ValueError("stream is not supported by the training endpoint; send stream=false")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
            raise ValueError("stop: at most 4 non-empty strings")
        return v

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    @property
    def turn_limit(self) -> int | None:
        """Most tokens of this turn (``max_completion_tokens`` first, as OpenAI reads them)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def normal_messages(self) -> list[Message]:
        """The messages in normal form (:func:`normal_message`), checked; ``RequestError`` 400 names the bad one."""
        return [normal_message(m, f"messages[{i}]") for i, m in enumerate(self.messages)]

    def normal_tools(self) -> list[dict[str, Any]] | None:
        if not self.tools:
            return None
        for i, t in enumerate(self.tools):
            fn = t.get("function") if isinstance(t, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise RequestError(400, f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': ...}}}}",
                                   param=f"tools[{i}]")
        return [dict(t) for t in self.tools]


def _shown(v: Any, limit: int = 40) -> str:
    """``repr(v)`` cut to ``limit`` characters: an error names a bad value without echoing a megabyte of it."""
    text = repr(v)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_json(body: bytes, max_depth: int) -> Any:
    """``body`` as JSON nested at most ``max_depth`` deep; ``RequestError`` 400 (never a traceback) otherwise."""
    try:
        value = json.loads(body)
    except RecursionError:  # deeper than the interpreter's own limit: far past max_depth
        raise RequestError(400, f"the body nests deeper than spec.task.endpoint.maxJsonDepth={max_depth}",
                           code="json_too_deep") from None
    except ValueError as exc:  # not JSON, not UTF-8, or an integer over the interpreter's digit limit
        raise RequestError(400, f"the body is not JSON: {_shown(str(exc), 120)}") from None
    level = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:  # one pass per nesting level, each container once: linear in the body
        depth += 1
        if depth > max_depth:
            raise RequestError(400, f"the body nests deeper than spec.task.endpoint.maxJsonDepth={max_depth}",
                               code="json_too_deep")
        level = [c for v in level for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, dict | list)]
    return value


def check_names(chat: "ChatRequest", max_chars: int) -> None:
    """Every name-like string of ``chat`` at most ``max_chars`` long (``RequestError`` 400 naming the field)."""
    found: list[tuple[str, Any]] = [("model", chat.model)]
    found += [(f"stop[{i}]", v) for i, v in enumerate(chat.stop_strings)]
    for i, m in enumerate(chat.messages):
        if isinstance(m, Mapping):
            found += [(f"messages[{i}].{k}", m.get(k)) for k in ("role", "name", "tool_call_id")]
            for k, c in enumerate(m.get("tool_calls") or ()):
                if isinstance(c, Mapping):
                    fn = c.get("function")
                    found += [(f"messages[{i}].tool_calls[{k}].id", c.get("id")),
                              (f"messages[{i}].tool_calls[{k}].function.name",
                               fn.get("name") if isinstance(fn, Mapping) else None)]
    for i, t in enumerate(chat.tools or ()):
        fn = t.get("function") if isinstance(t, Mapping) else None
        found.append((f"tools[{i}].function.name", fn.get("name") if isinstance(fn, Mapping) else None))
    for where, v in found:
        if isinstance(v, str) and len(v) > max_chars:
            raise RequestError(400, f"{where}: a string of {len(v)} characters is over spec.task.endpoint."
                               f"maxNameChars={max_chars}", param=where, code="string_too_long")


def _text(content: Any, what: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts are renderable here
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(400, f"{what}.content[{j}]: only text content parts are supported", param=what)
            out.append(part["text"])
        return "".join(out)
    raise RequestError(400, f"{what}.content: expected a string or text parts, got {type(content).__name__}",
                       param=what)


def _arguments(args: Any, what: str) -> dict[str, Any]:
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError as exc:
            raise RequestError(400, f"{what}.arguments: not JSON ({exc})", param=what) from None
    if not isinstance(args, Mapping):
        raise RequestError(400, f"{what}.arguments: expected a JSON object", param=what)
    return dict(args)


def normal_message(m: Any, what: str = "message") -> Message:
    """``m`` as ``{"role", "content": str}`` plus ``tool_calls`` (arguments decoded) for an assistant turn and
    ``tool_call_id`` for a tool answer: the parts a chat template renders, the parts a prefix match compares."""
    if not isinstance(m, Mapping):
        raise RequestError(400, f"{what}: expected an object with role and content", param=what)
    role = m.get("role")
    if role == "developer":
        role = "system"
    if role not in ROLES:
        raise RequestError(400, f"{what}.role: {_shown(role)} is not one of {', '.join(ROLES)}", param=what)
    out: Message = {"role": role, "content": _text(m.get("content"), what)}
    if role == "assistant" and m.get("tool_calls"):
        calls = []
        for k, c in enumerate(m["tool_calls"]):
            fn = c.get("function") if isinstance(c, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise RequestError(400, f"{what}.tool_calls[{k}]: expected a function call with a name", param=what)
            calls.append({"id": str(c.get("id") or ""), "type": "function",
                          "function": {"name": fn["name"], "arguments": _arguments(fn.get("arguments"), what)}})
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
    return out


def assistant_message(msg: AssistantMessage, call_ids: Sequence[str]) -> Message:
    """The normal form of the turn we sampled, with the ids we gave its tool calls."""
    out: Message = {"role": "assistant", "content": msg.content}
    if msg.tool_calls:
        out["tool_calls"] = [{"id": i, "type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}}
                             for c, i in zip(msg.tool_calls, call_ids, strict=True)]
    return out


def completion(*, completion_id: str, model: str, msg: AssistantMessage, call_ids: Sequence[str],
               finish: FinishReason, prompt_tokens: int, completion_tokens: int) -> ChatCompletion:
    """The ``ChatCompletion`` of one sampled turn (``finish``: ``tool_calls`` when it called tools)."""
    calls = [ChatCompletionMessageFunctionToolCall(  # arguments keep the model's characters, as OpenAI's API does
        id=i, type="function", function=Function(name=c.name, arguments=json.dumps(dict(c.arguments),
                                                                                   ensure_ascii=False)))
        for c, i in zip(msg.tool_calls, call_ids, strict=True)]
    message = ChatCompletionMessage(role="assistant", content=msg.content if (msg.content or not calls) else None,
                                    tool_calls=cast(Any, calls) or None)
    return ChatCompletion(
        id=completion_id, object="chat.completion", created=int(time.time()), model=model,
        choices=[Choice(index=0, message=message, finish_reason=finish, logprobs=None)],
        usage=CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                              total_tokens=prompt_tokens + completion_tokens),
    )


def model_card(model: str, created: int) -> Model:
    return Model(id=model, object="model", created=created, owned_by="asyncrl")


def bounded_reward(value: Any, max_magnitude: float, what: str = "reward") -> float:
    """``value`` as a float when it is a number (not a bool) with ``|value| <= max_magnitude``; ``RequestError`` 400
    (code ``reward_out_of_range``) otherwise: NaN, infinities, 1e300 (inf in float32) and a 400-digit integer
    (which ``float()`` cannot even convert) are all refused here, before anything adds or subtracts them."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(400, f"{what}: expected a number, got {type(value).__name__}", param="reward",
                           code="reward_out_of_range")
    # an int is compared as an int: float() of a 400-digit one raises OverflowError
    ok = abs(value) <= max_magnitude if isinstance(value, int) else math.isfinite(value) and abs(value) <= max_magnitude
    if not ok:
        raise RequestError(400, f"{what} {_shown(value)} is outside [-{max_magnitude:g}, {max_magnitude:g}] "
                           "(spec.task.endpoint.maxRewardMagnitude; finite numbers only)", param="reward",
                           code="reward_out_of_range")
    return float(value)


def reward_value(body: Any, max_magnitude: float) -> float:
    """The reward of ``POST /v1/sessions/{id}/reward`` (``{"reward": number}``, see :func:`bounded_reward`)."""
    if not isinstance(body, Mapping) or "reward" not in body:
        raise RequestError(400, 'expected {"reward": <number>}', param="reward", code="reward_out_of_range")
    return bounded_reward(body["reward"], max_magnitude)


__all__ = [
    "ChatRequest",
    "FinishReason",
    "RequestError",
    "assistant_message",
    "bounded_reward",
    "check_names",
    "completion",
    "model_card",
    "normal_message",
    "parse_json",
    "reward_value",
]
