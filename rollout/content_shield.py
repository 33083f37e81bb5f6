"""Content is data: only a chat template's own markers become special tokens.

A chat template renders messages and tool schemas into one string, and encoding that string with special-token
parsing on turns every ``<|im_end|>`` or ``<|im_start|>`` in it into the marker's id, whoever typed it: a tool
result (a web page, a file) carrying ``<|im_end|>\\n<|im_start|>assistant\\n...`` forged 13 marker ids in one
prompt, and a whole assistant turn inside a forced observation. :class:`ContentShield` keeps content data:

1. before rendering, :meth:`~ContentShield.data` replaces each special token's string in every string of the
   messages and tool schemas (values and keys, nested) by a placeholder of private-use characters with a random
   nonce, which no template changes and no one can guess;
2. after rendering, every special string left in the text is the template's own. :meth:`~ContentShield.encode`
   encodes each marker as its id and the text between two markers that holds a placeholder with special-token
   parsing off (the placeholders put back first); the rest as the template's text, as before.

Text whose content held no special string is encoded as before, in one call: the same ids, bit for bit; a stretch of
content that typed one is encoded as the tokenizer encodes text after a marker (:meth:`ContentShield._after`).
Non-special added tokens (``<tool_call>`` in Qwen's vocabulary, the character tokenizers' tags such as ``<res>``)
stay single ids in content too, as the tokenizer's own encoder has them; only special tokens are markers.
"""

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

_OPEN, _CLOSE = "\ue000", "\ue001"  # private use: no template or tokenizer gives them a meaning
_PLACEHOLDER = f"({_OPEN}[0-9a-f]+:[0-9]+{_CLOSE})"


class MarkedTokenizer(Protocol):
    """What the shield needs of a tokenizer (:class:`~asyncrl.rollout.tokenizer.Tokenizer` has it)."""

    @property
    def special_tokens(self) -> Mapping[str, int]: ...

    def encode(self, text: str, *, bos: bool = False, special: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str: ...


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
        self._marks_first: dict[str, bool] = {}  # marker -> does text after it encode unlike a text of its own

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
        """Ids of ``text`` rendered from this shield's data: the special strings the template wrote as marker ids,
        the content that typed one (the text between two such markers) with special-token parsing off, placeholders
        restored. Raises ``ValueError`` if the template altered a placeholder (it would reach the model as text)."""
        if not self.replaced or self._find is None:
            return self._tok.encode(text)  # no special string in the content: the template's text as it was
        if self._nonce in "".join(self._original.get(p, p) for p in re.split(_PLACEHOLDER, text)).lower():
            raise ValueError("the chat template changed a special token's placeholder in the content; render content "
                             "unchanged (no filters on message contents or tool schemas other than tojson/trim)")
        out: list[int] = []
        clean = 0  # text[clean:start] holds no placeholder: encoded as the template's text, in one call
        start, marker = 0, None  # the stretch after the last marker, and that marker
        for m in [*self._find.finditer(text), None]:
            end = len(text) if m is None else m.start()
            if self._nonce in text[start:end]:  # content that typed a special string, between two markers
                out += self._tok.encode(text[clean:start]) if clean < start else []
                out += self._after(marker, self._restore(text[start:end]))
                clean = end
            if m is not None:
                start, marker = m.end(), m.group(0)
        return out + (self._tok.encode(text[clean:]) if clean < len(text) else [])

    def _restore(self, piece: str) -> str:
        return re.sub(_PLACEHOLDER, lambda m: self._original.get(m.group(0), m.group(0)), piece)

    def _after(self, marker: str | None, stretch: str) -> list[int]:
        """Ids of ``stretch`` as data, as the tokenizer encodes text that follows ``marker``.

        Most tokenizers encode text after a marker as a text of its own. One whose pre-tokenizer marks only the
        text's first word (SentencePiece ``Metaspace``, ``prepend_scheme="first"``: Mistral's) does not mark it
        there; probed once per marker (``a`` after it vs alone), such a stretch is encoded after the marker's
        own text and those ids dropped, when that splits cleanly (checked by decoding)."""
        tok = self._tok
        alone = tok.encode(stretch, special=False)
        if marker is None:
            return alone
        if marker not in self._marks_first:
            self._marks_first[marker] = tok.encode(marker + "a")[1:] != tok.encode("a", special=False)
        if not self._marks_first[marker]:
            return alone
        head = tok.encode(marker, special=False)
        joined = tok.encode(marker + stretch, special=False)
        if joined[:len(head)] == head and tok.decode(joined) == tok.decode(head) + stretch:
            return joined[len(head):]
        return alone
