"""Content is data: only a chat template's own markers become special tokens.

A chat template renders messages and tool schemas into one string, and encoding that string with special-token
parsing on turns every ``<|im_end|>`` or ``<|im_start|>`` in it into the marker's id, whoever typed it: a tool
result (a web page, a file) carrying ``<|im_end|>\\n<|im_start|>assistant\\n...`` forged 13 marker ids and a whole
assistant turn inside one forced observation. :class:`ContentShield` keeps content data:

1. before rendering, :meth:`~ContentShield.data` replaces each special token's string in every string of the
   messages and tool schemas (values and keys, nested) by a placeholder of private-use characters with a random
   nonce, which no template changes and no one can guess;
2. after rendering, every special string left in the text is the template's own. :meth:`~ContentShield.encode`
   encodes the text between them with special-token parsing off (the placeholders put back first), and each marker
   as its id.

Text whose content held no special string is encoded as before, in one call: the same ids, bit for bit. Non-special
added tokens (``<tool_call>`` in Qwen's vocabulary, the character tokenizers' tags such as ``<res>``) stay single
ids in content too, as the tokenizer's own encoder has them; only special tokens are markers.
"""

import re
import secrets
from collections.abc import Mapping
from typing import Any, Protocol

_OPEN, _CLOSE = "\ue000", "\ue001"  # private use: no template or tokenizer gives them a meaning


class MarkedTokenizer(Protocol):
    """What the shield needs of a tokenizer (:class:`~asyncrl.rollout.tokenizer.Tokenizer` has it)."""

    @property
    def special_tokens(self) -> Mapping[str, int]: ...

    def encode(self, text: str, *, bos: bool = False, special: bool = True) -> list[int]: ...


class ContentShield:
    """One rendering's placeholders for the special-token strings typed in its content (see the module docstring).

    Use one shield for the data of a rendering (or of the two renderings whose difference is encoded) and for
    encoding its text.
    """

    def __init__(self, tokenizer: MarkedTokenizer) -> None:
        self._tok = tokenizer
        self._ids = dict(tokenizer.special_tokens)
        specials = sorted((s for s in self._ids if s), key=len, reverse=True)  # the longest match first
        self._find = re.compile("|".join(map(re.escape, specials))) if specials else None
        nonce = secrets.token_hex(8)
        self._placeholder = {s: f"{_OPEN}{nonce}:{k}{_CLOSE}" for k, s in enumerate(specials)}
        self._original = {p: s for s, p in self._placeholder.items()}
        self._nonce = nonce
        self.replaced = 0  # special strings found in content so far

    def data(self, value: Any) -> Any:
        """``value`` (messages, tool schemas: JSON-like) with every special string in its strings replaced."""
        if isinstance(value, str):
            return self._hide(value)
        if isinstance(value, Mapping):
            return {self._hide(k) if isinstance(k, str) else k: self.data(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.data(v) for v in value]
        return value

    def _hide(self, text: str) -> str:
        if self._find is None:
            return text
        out, n = self._find.subn(lambda m: self._placeholder[m.group(0)], text)
        self.replaced += n
        return out

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` rendered from this shield's data: its special strings as marker ids, the rest (content,
        placeholders restored) with special-token parsing off. Raises ``ValueError`` if the template altered a
        placeholder (it would otherwise reach the model as text)."""
        if not self.replaced or self._find is None:
            return self._tok.encode(text)  # no special string in the content: the template's text as it was
        out: list[int] = []
        pos = 0
        for m in self._find.finditer(text):
            out += self._text(text[pos:m.start()])
            out.append(self._ids[m.group(0)])
            pos = m.end()
        return out + self._text(text[pos:])

    def _text(self, piece: str) -> list[int]:
        if not piece:
            return []
        for p, s in self._original.items():
            piece = piece.replace(p, s)
        if self._nonce in piece:
            raise ValueError("the chat template changed a special token's placeholder in the content; render content "
                             "unchanged (no filters on message contents or tool schemas other than tojson/trim)")
        return self._tok.encode(piece, special=False)
