"""Messages to tokens: the prompt of a conversation and the tokens of an observation.

Two renderings, chosen by the tokenizer:

- a tokenizer with a chat template (a real model's, ``rollout/tokenizer.py`` ``HFTokenizer``): the
  prompt is ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)`` (a template
  that ignores ``tools`` gets them in the system message, :func:`tool_messages`); an
  observation after a turn that ended at the end-of-turn token is the template's own text between
  that turn and the next generation prompt (the tool/user turn, then the assistant header), computed
  as the difference of two renderings, so it is exactly what the template would show;
- the character tokenizers of the tiny presets (and a tokenizer without a template):
  ``tokenizer.chat_prompt(system, question, examples)`` (only the question, for the character
  alphabets) and observations as their plain content.

An observation after a turn that ended at a stop string of the environment (``Reset.stop``) is forced
*inline*, as plain content that continues the assistant's text (the built-in math tasks' format).

Content is data: message contents, tool results and tool schemas are encoded with special-token parsing off
(``rollout/content_shield.py``), so only the template's own markers are special tokens; a tool result that types
``<|im_end|>`` or ``<eos>`` cannot end a turn or forge one.
"""

import json
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl.rollout.content_shield import ContentShield
from asyncrl.rollout.envs.interface import Message
from asyncrl.rollout.tokenizer import Tokenizer, render_chat


def _template(tokenizer: Tokenizer) -> Any:
    """The HF tokenizer behind ``tokenizer`` when it has a chat template, else None."""
    hf = getattr(tokenizer, "hf", None)
    return hf if hf is not None and getattr(hf, "chat_template", None) else None


def _apply(hf: Any, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None, gen: bool) -> str:
    kw: dict[str, Any] = {"tools": [dict(t) for t in tools]} if tools else {}
    return render_chat(hf, messages, add_generation_prompt=gen, **kw)  # bounded: the template is the folder's code


def _plain_prompt(tokenizer: Tokenizer, messages: Sequence[Message]) -> list[int]:
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [m for m in messages if m["role"] != "system"]
    pairs = rest[:-1]
    shaped = (
        bool(rest) and rest[-1]["role"] == "user" and len(pairs) % 2 == 0
        and all(m["role"] == ("user", "assistant")[i % 2] for i, m in enumerate(pairs))
    )
    if shaped:
        examples = [(pairs[i]["content"], pairs[i + 1]["content"]) for i in range(0, len(pairs), 2)]
        return tokenizer.chat_prompt(system, rest[-1]["content"], examples)
    return tokenizer.encode("".join(m["content"] for m in rest), bos=True, special=False)


def tool_messages(tokenizer: Tokenizer, messages: Sequence[Message],
                  tools: Sequence[Mapping[str, Any]] | None) -> list[Message]:
    """``messages`` with the tool schemas in the system message when the chat template ignores ``tools``
    (SmolLM2-135M's renders the same text with and without them): the Hermes form, a ``<tools>`` block
    of one JSON schema per line and how to call one. Unchanged otherwise (and for the character
    tokenizers, which render no system prompt)."""
    hf = _template(tokenizer)
    if hf is None or not tools or _apply(hf, messages, tools, True) != _apply(hf, messages, None, True):
        return list(messages)
    block = (
        "\n\n# Tools\n\nYou may call one or more functions. Function signatures:\n<tools>\n"
        + "\n".join(json.dumps(dict(t), separators=(",", ":")) for t in tools)
        + '\n</tools>\nCall a function as <tool_call>{"name": <name>, "arguments": <args-object>}</tool_call>.'
    )
    out = [dict(m) for m in messages]
    if out and out[0]["role"] == "system":
        out[0]["content"] = out[0]["content"] + block
    else:
        out.insert(0, {"role": "system", "content": block.strip()})
    return out


def render_prompt(tokenizer: Tokenizer, messages: Sequence[Message],
                  tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Prompt ids of ``messages`` (and ``tools``), ready to sample the assistant's turn after."""
    hf = _template(tokenizer)
    if hf is None:
        return _plain_prompt(tokenizer, messages)
    shield = ContentShield(tokenizer)
    return shield.encode(_apply(hf, shield.data(messages), shield.data(tools), True))


def render_observation(
    tokenizer: Tokenizer,
    history: Sequence[Message],
    observation: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    inline: bool,
) -> list[int]:
    """Ids to force after the assistant turn that ends ``history`` (its last message).

    ``inline``: the turn ended at a stop string: the observation's content continues the text.
    Otherwise the turn ended at the end-of-turn token (already sampled): with a chat template the
    forced text is what the template puts after that token up to the next assistant header.
    """
    plain = "".join(m["content"] for m in observation)
    hf = None if inline else _template(tokenizer)
    if hf is None:
        return tokenizer.encode(plain, special=False)
    shield = ContentShield(tokenizer)
    history, observation, tools = shield.data(history), shield.data(observation), shield.data(tools)
    before = _apply(hf, history, tools, False)
    after = _apply(hf, [*history, *observation], tools, True)
    if not after.startswith(before):
        raise ValueError(
            f"chat template of {tokenizer.name}: rendering the conversation with the observation changes "
            "the text before it; the template cannot be continued turn by turn"
        )
    eos = tokenizer.eos_token
    cut = before.rfind(eos)
    tail = before[cut + len(eos):] if cut >= 0 else ""  # e.g. the "\n" after <|im_end|>
    return shield.encode(tail + after[len(before):])
