"""Tool calls in the model's own format: parse an assistant turn into content and :class:`ToolCall` s.

``spec.task.toolCallFormat`` chooses the format:

- ``hermes`` (Hermes, Qwen2/Qwen3, SmolLM2 tool use): each call is
  ``<tool_call>{"name": "cancel", "arguments": {"order": "o3"}}</tool_call>``; the content is the text
  outside the blocks.
- ``json``: the whole turn is one JSON object ``{"name": ..., "arguments": {...}}`` or a list of them
  (a turn that does not start with ``{`` or ``[`` is plain content, no call).

A call that cannot be parsed (bad JSON, no ``name``, ``arguments`` not an object, an unclosed block)
becomes an entry of ``malformed`` naming the problem: the environment scores it (an error
observation, a zero reward), it never raises.
"""

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

from asyncrl.rollout.envs.interface import ToolCall

ToolCallFormat = Literal["hermes", "json"]
Parsed = tuple[str, tuple[ToolCall, ...], tuple[str, ...]]  # (content, calls, malformed)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def _call(obj: Any, k: int) -> ToolCall | str:
    """A :class:`ToolCall` from a decoded JSON value, or the reason it is not one."""
    if not isinstance(obj, Mapping):
        return f"call {k}: expected a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return f"call {k}: no \"name\" string"
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError as exc:
            return f"call {k} ({name}): arguments are not JSON: {exc}"
    if not isinstance(args, Mapping):
        return f"call {k} ({name}): \"arguments\" must be an object, got {type(args).__name__}"
    return ToolCall(name, dict(args), id=f"call_{k}")


def _decode(text: str, k: int) -> ToolCall | str:
    try:
        return _call(json.loads(text), k)
    except ValueError as exc:
        return f"call {k}: not JSON ({exc}): {text[:80]!r}"


def parse_hermes(text: str) -> Parsed:
    calls: list[ToolCall] = []
    bad: list[str] = []
    for k, m in enumerate(_BLOCK.finditer(text)):
        got = _decode(m.group(1).strip(), k)
        (calls.append if isinstance(got, ToolCall) else bad.append)(got)  # type: ignore[arg-type]
    content = _BLOCK.sub("", text)
    if OPEN in content:  # an opened block that never closed
        bad.append(f"call {len(calls) + len(bad)}: {OPEN} without {CLOSE}")
        content = content[: content.index(OPEN)]
    return content.strip(), tuple(calls), tuple(bad)


def parse_json(text: str) -> Parsed:
    body = text.strip()
    if not body.startswith(("{", "[")):
        return body, (), ()
    try:
        obj = json.loads(body)
    except ValueError as exc:
        return "", (), (f"call 0: not JSON ({exc}): {body[:80]!r}",)
    items = obj if isinstance(obj, list) else [obj]
    calls: list[ToolCall] = []
    bad: list[str] = []
    for k, item in enumerate(items):
        got = _call(item, k)
        (calls.append if isinstance(got, ToolCall) else bad.append)(got)  # type: ignore[arg-type]
    return "", tuple(calls), tuple(bad)


PARSERS: Mapping[str, Callable[[str], Parsed]] = {"hermes": parse_hermes, "json": parse_json}


def get_parser(fmt: str) -> Callable[[str], Parsed]:
    """The parser of ``spec.task.toolCallFormat``; an unknown one lists the valid formats."""
    try:
        return PARSERS[fmt]
    except KeyError:
        raise KeyError(f"spec.task.toolCallFormat {fmt!r} is unknown; valid: {', '.join(PARSERS)}") from None


def format_call(call: ToolCall, fmt: str) -> str:
    """The text the model writes for ``call`` in format ``fmt`` (demonstrations use it)."""
    body = json.dumps({"name": call.name, "arguments": dict(call.arguments)}, separators=(",", ":"))
    return f"{OPEN}{body}{CLOSE}" if fmt == "hermes" else body
