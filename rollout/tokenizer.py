"""Character-level tokenizer of the built-in tool tasks, with every tag as one token.

Tags (``<calc>``, ``</calc>``, ``<res>``, ``</res>``, ``<ans>``, ``</ans>``) are single tokens, as in
real tokenizers: spelled-out tags make a tiny model need ~4x more warm-up steps and plateau lower
(``reference/rl-on-cpu.md`` §6.3). The vocabulary is fixed, so ids are deterministic across
processes and the actor and every rollout worker agree on them without exchanging files.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

PAD = "<pad>"
BOS = "<bos>"
EOS = "<eos>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS)
TAGS: tuple[str, ...] = ("<calc>", "</calc>", "<res>", "</res>", "<ans>", "</ans>")
CHARS = "0123456789+-*()=?Q:"


@dataclass(frozen=True)
class ToolTokenizer:
    """Maps text of the built-in tasks to ids and back.

    ``encode`` matches tags greedily before single characters; an unknown character raises a
    ``ValueError`` that names it and lists the alphabet.
    """

    pieces: tuple[str, ...] = SPECIALS + TAGS + tuple(CHARS)
    _ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = {p: i for i, p in enumerate(self.pieces)}
        if len(ids) != len(self.pieces):
            raise ValueError(f"ToolTokenizer: duplicate pieces in {self.pieces}")
        object.__setattr__(self, "_ids", ids)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    @property
    def pad_id(self) -> int:
        return self._ids[PAD]

    @property
    def bos_id(self) -> int:
        return self._ids[BOS]

    @property
    def eos_id(self) -> int:
        return self._ids[EOS]

    def token_id(self, piece: str) -> int:
        """Id of one piece (a tag, a special token or a character)."""
        try:
            return self._ids[piece]
        except KeyError:
            raise ValueError(
                f"ToolTokenizer: {piece!r} is not a token; valid tokens: {list(self.pieces)}"
            ) from None

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        """Ids of ``text``; ``bos`` prepends ``<bos>``. Tags and ``<pad>``/``<bos>``/``<eos>`` are one id each."""
        out = [self.bos_id] if bos else []
        i = 0
        while i < len(text):
            if text[i] == "<":
                end = text.find(">", i)
                piece = text[i : end + 1] if end >= 0 else ""
                if piece in self._ids:
                    out.append(self._ids[piece])
                    i = end + 1
                    continue
            ch = text[i]
            if ch not in self._ids or ch == "<":
                raise ValueError(
                    f"ToolTokenizer: character {ch!r} at position {i} of {text!r} is not in the alphabet "
                    f"{CHARS!r} (tags: {', '.join(TAGS)}); only built-in task text can be encoded"
                )
            out.append(self._ids[ch])
            i += 1
        return out

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of ``ids``; ``skip_special`` drops ``<pad>``, ``<bos>`` and ``<eos>``."""
        n = len(self.pieces)
        parts = []
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"ToolTokenizer: id {i} is out of range [0, {n})")
            piece = self.pieces[i]
            if skip_special and piece in SPECIALS:
                continue
            parts.append(piece)
        return "".join(parts)


TOKENIZER = ToolTokenizer()
"""The one tokenizer of the built-in tasks (vocabulary size 28)."""
