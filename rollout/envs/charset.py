"""The character tokenizer of text tasks: printable ASCII plus the tags, for the tiny presets.

The math tasks' alphabet (``rollout/tokenizer.py`` :data:`~asyncrl.rollout.tokenizer.TOKENIZER`, 28
ids) cannot spell a word; a model without its own tokenizer that runs any other environment (a user's
environment, a dataset, an external agent; the customer-service task has its own byte-level BPE instead,
``envs/cs_tokenizer.py``, as ``envs/binding.py`` ``task_tokenizer`` chooses) uses
:data:`TEXT_TOKENIZER`: one id per printable ASCII
character, the math tags and the Hermes tool-call tags as single ids (a tiny model learns
single-token tags far faster, ``docs/architecture.md`` (the embedded model and tasks)). Like the math alphabet it renders
only the question of a chat (no system prompt, no examples, no tool schemas): a tiny model learns
the protocol from its warm-start demonstrations, and its context stays short.
"""

import string
from collections.abc import Sequence

from asyncrl.rollout.tokenizer import SPECIALS, TAGS, ToolTokenizer

TOOL_TAGS: tuple[str, ...] = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TEXT_CHARS: tuple[str, ...] = tuple(c for c in string.printable if c not in "\t\r\x0b\x0c")


class TextTokenizer(ToolTokenizer):
    """:class:`ToolTokenizer` over printable ASCII: a ``<`` that starts no tag is a character, and so is each
    character of ``<pad>``, ``<bos>`` and ``<eos>`` in content (``encode(special=False)``)."""

    @property
    def name(self) -> str:
        return "char-text"

    def encode(self, text: str, *, bos: bool = False, special: bool = True) -> list[int]:
        ids = self._ids
        out = [self.bos_id] if bos else []
        i = 0
        while i < len(text):
            if text[i] == "<":
                end = text.find(">", i)
                piece = text[i : end + 1] if end >= 0 else ""
                if len(piece) > 1 and piece in ids and (special or piece not in SPECIALS):
                    out.append(ids[piece])
                    i = end + 1
                    continue
            ch = text[i]
            if ch not in ids:
                raise ValueError(
                    f"TextTokenizer: character {ch!r} at position {i} of {text[:60]!r} is not printable ASCII; "
                    "a model without its own tokenizer can only read ASCII text (use a model folder with "
                    "tokenizer.json for other text)"
                )
            out.append(ids[ch])
            i += 1
        return out

    def chat_prompt(self, system: str, user: str, examples: Sequence[tuple[str, str]] = ()) -> list[int]:
        return self.encode(user, bos=True, special=False)


TEXT_TOKENIZER = TextTokenizer(pieces=SPECIALS + TAGS + TOOL_TAGS + TEXT_CHARS)
"""Character tokenizer of the text tasks (vocabulary size 109; ids fixed, as the math alphabet's)."""
