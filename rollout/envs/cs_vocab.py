"""The customer-service task's character tokenizer: the text alphabet plus the task's words as single ids.

A real tokenizer spells ``{"name": "refund"`` in a handful of tokens; the text alphabet
(``envs/charset.py``) spells it in 17, and a tool call in ~55. At the tiny preset's scale that
length is what fails the task: after 200 warm-start steps on ~165-token demonstrations the
sampled held-out success was 0 (the skeleton alone is 45 exact characters per call). So, as a
real BPE vocabulary would, this one gives the JSON skeleton of a Hermes call (``{"name":"``,
``","arguments":{"``, ``":"``, ``"}}``), the tool and argument names, the products, the order
statuses and the words of the tool responses one id each, and so the user and order ids
(``u3``, ``o31``). Ids spelled in digits were the second wall: with the skeleton as pieces the
warm-start loss stalled at 0.34 nats per agent token, the cost of guessing the three digits of an
episode uniformly (3 x ln 9 over ~20 agent tokens), and every sampled call named the wrong user
(measured: 0/64 held-out after 100 steps). A digit copied from a position the model has to find is
a late phase transition for a 0.3M-parameter model (``docs/architecture.md`` (the embedded model and tasks)+ steps);
an id token is copied by content. Which listed order to act on is still the agent's to find.

The ids of :data:`~asyncrl.rollout.envs.charset.TEXT_TOKENIZER` are unchanged (this vocabulary
appends to it), and any text the task can produce still encodes: greedy longest match, one
character at a time where no piece matches (a model may also spell a piece out; the text, which
is what the tool-call parser and the environment read, is the same).
"""

from collections.abc import Sequence

from asyncrl.rollout.envs.charset import TEXT_TOKENIZER, TextTokenizer

JSON_PIECES: tuple[str, ...] = ('{"name":"', '","arguments":{"', '":"', '"}}')
WORDS: tuple[str, ...] = (
    "orders", "order", "user", "cancel", "refund",  # tool and argument names (and the request's intent)
    "lamp", "mug", "desk", "sofa", "pen", "hat", "bag", "cup", "rug", "fan",  # envs/customer_service.PRODUCTS
    "placed", "shipped", "delivered", "cancelled", "refunded",  # order statuses
    "ok", "error: ", "no ", "is ", "malformed call",  # tool responses
)
# The scenario's ids (envs/customer_service.draw_scenario: users u1-u9, orders o1-o9), one id each.
IDS: tuple[str, ...] = tuple(f"u{i}" for i in range(1, 10)) + tuple(f"o{i}" for i in range(1, 10))
CS_PIECES: tuple[str, ...] = JSON_PIECES + WORDS + IDS


class PieceTokenizer(TextTokenizer):
    """:class:`TextTokenizer` whose multi-character pieces need not be tags: greedy longest match."""

    @property
    def name(self) -> str:
        return "char-cs"

    def encode(self, text: str, *, bos: bool = False) -> list[int]:
        ids = self._ids
        longest = max(len(p) for p in self.pieces)
        out = [self.bos_id] if bos else []
        i = 0
        while i < len(text):
            for n in range(min(longest, len(text) - i), 1, -1):
                piece = ids.get(text[i : i + n])
                if piece is not None:
                    out.append(piece)
                    i += n
                    break
            else:
                ch = text[i]
                if ch not in ids:
                    raise ValueError(
                        f"PieceTokenizer: character {ch!r} at position {i} of {text[:60]!r} is not printable "
                        "ASCII; a model without its own tokenizer can only read ASCII text"
                    )
                out.append(ids[ch])
                i += 1
        return out

    def chat_prompt(self, system: str, user: str, examples: Sequence[tuple[str, str]] = ()) -> list[int]:
        return self.encode(user, bos=True)


CS_TOKENIZER = PieceTokenizer(pieces=TEXT_TOKENIZER.pieces + CS_PIECES)
"""Tokenizer of the built-in customer-service task with a tiny preset (vocabulary 109 + 29 + 18 = 156)."""
