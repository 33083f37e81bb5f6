"""Tool calls in the model's own format (rollout/envs/toolcalls.py): both formats, malformed ones."""

import pytest

from asyncrl.rollout.envs.interface import ToolCall
from asyncrl.rollout.envs.toolcalls import format_call, get_parser, parse_hermes, parse_json


def test_hermes_blocks_and_content() -> None:
    text = 'Let me look.<tool_call>{"name": "orders", "arguments": {"user": "u3"}}</tool_call>' \
           '<tool_call>{"name":"cancel","arguments":"{\\"order\\": \\"o31\\"}"}</tool_call> done'
    content, calls, bad = parse_hermes(text)
    assert content == "Let me look. done" and bad == ()
    assert calls == (ToolCall("orders", {"user": "u3"}, "call_0"), ToolCall("cancel", {"order": "o31"}, "call_1"))
    assert calls[0].to_message() == {"id": "call_0", "type": "function",
                                     "function": {"name": "orders", "arguments": {"user": "u3"}}}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('<tool_call>{"name": "orders", "arguments": {"user": </tool_call>', "not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'no "name" string'),
        ('<tool_call>{"name": "x", "arguments": [1]}</tool_call>', '"arguments" must be an object, got list'),
        ('<tool_call>["orders"]</tool_call>', "expected a JSON object, got list"),
        ('ok <tool_call>{"name": "orders"', "<tool_call> without </tool_call>"),
        ('<tool_call>{"name":"x","arguments":"{bad"}</tool_call>', "arguments are not JSON"),
    ],
)
def test_malformed_hermes_calls_are_reported_never_raised(text: str, problem: str) -> None:
    _, calls, bad = parse_hermes(text)
    assert calls == () and len(bad) == 1 and problem in bad[0]


def test_json_format() -> None:
    assert parse_json("the answer is 4") == ("the answer is 4", (), ())
    _, calls, bad = parse_json('{"name": "refund", "arguments": {"order": "o47"}}')
    assert calls == (ToolCall("refund", {"order": "o47"}, "call_0"),) and bad == ()
    _, calls, bad = parse_json('[{"name": "a", "arguments": {}}, {"arguments": {}}]')
    assert [c.name for c in calls] == ["a"] and bad == ('call 1: no "name" string',)
    _, calls, bad = parse_json('{"name": "refund", "arguments": ')
    assert calls == () and "not JSON" in bad[0]


def test_registry_and_round_trip() -> None:
    call = ToolCall("cancel", {"order": "o31"})
    for fmt in ("hermes", "json"):
        _, calls, bad = get_parser(fmt)(format_call(call, fmt))
        assert [(c.name, dict(c.arguments)) for c in calls] == [("cancel", {"order": "o31"})] and not bad
    with pytest.raises(KeyError, match="toolCallFormat 'xml' is unknown; valid: hermes, json"):
        get_parser("xml")
