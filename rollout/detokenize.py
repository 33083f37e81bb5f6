"""Incremental detokenization: the text of a growing token sequence, one token at a time.

``tokenizer.decode([token])`` is not the text a token adds to a sequence, for two reasons:

1. a byte-level BPE (GPT-2, SmolLM2, Qwen, Llama 3) or a SentencePiece byte fallback spells a character outside
   its vocabulary as several byte tokens: each alone decodes to U+FFFD, and ``Café naïve → 東京`` came back as
   ``Café naïve → �����``;
2. a SentencePiece decoder (Llama 2, Mistral) drops the word-initial space of the *first* token it decodes, so
   every word lost its space.

:class:`IncrementalDetokenizer` decodes as inference servers do (vLLM: vllm-project/vllm,
``vllm/transformers_utils/detokenizer_utils.py`` ``detokenize_incrementally``; HF TGI: huggingface/
text-generation-inference, ``server/text_generation_server/models/model.py`` ``decode_token``): it decodes a short
*window* of the last tokens, the tokens already made final at its head (so a SentencePiece space after them
survives: both decodes start at the same token), and keeps back the text of a token whose decode still ends in
U+FFFD (an incomplete character the next token may complete). What it makes final, token by token, concatenates to
``tokenizer.decode(all tokens)``; :attr:`~IncrementalDetokenizer.text` (the final text plus the provisional tail)
is that decode at every step, where it ends in a whole character.

Cost: each token decodes the window (the last two final chunks and the held-back tokens), a few tokens for real
text, whatever the sequence's length. A run of tokens that keep the text ending in U+FFFD (invalid bytes; a
character needs at most 4 byte tokens) is cut once it holds :data:`MAX_HELD` tokens, at the latest token boundary
where the text splits cleanly, so the window stays bounded there too (``bench/detokenize.py`` measures it).

Exact for any sequence of a byte-level BPE (UTF-8 decoding with replacement restarts at a clean split, whatever
follows: ``text`` is the decode after every token), and for any tokenizer on text whose characters are whole. One
case no streaming decoder can match: the ``tokenizers`` library's SentencePiece ``ByteFallback`` shows a whole run
of byte tokens as U+FFFD while any byte of it is invalid or incomplete, characters decoded earlier in the run
included (``"\\n"`` then the first byte of ``→``: two U+FFFD); what was made final stays, so ``text`` reads
``"\\n"`` then one U+FFFD there, and the increments differ from the decode only where a run holds an invalid byte.
"""

from collections.abc import Iterable

from asyncrl.rollout.tokenizer import Tokenizer, ToolTokenizer

REPLACEMENT = "\ufffd"  # what a decoder shows for bytes that are not (yet) a whole UTF-8 character
MAX_HELD = 8  # tokens held back at most before the run is cut at a clean split (a character is <= 4 bytes)


class IncrementalDetokenizer:
    """The text of one token sequence (an assistant turn), built as its tokens arrive.

    :meth:`push` returns the text a token makes final (``""`` while a character is incomplete); the increments,
    then :meth:`flush`, concatenate to ``tokenizer.decode(ids)``. :attr:`text` is that decode at any point.
    """

    def __init__(self, tokenizer: Tokenizer, *, max_held: int = MAX_HELD) -> None:
        if max_held < 1:
            raise ValueError(f"IncrementalDetokenizer: max_held {max_held} must be >= 1 (tokens held back at most)")
        self._tok = tokenizer
        self._max_held = max_held
        self._ids: list[int] = []
        self._start = 0  # the window: ids[start:] is decoded per token
        self._read = 0  # ids[start:read] is final; its text is _prefix, decoded from the same start
        self._prefix = ""
        self._final: list[str] = []  # the increments made final so far
        self._tail = ""  # the provisional text of ids[read:] (ends in U+FFFD while held)
        self._next_cut = max_held  # held tokens at which the next cut is tried
        # The character tokenizers' ids are whole pieces (a character, a tag): decode([token]) is exactly the text a
        # token adds, and the window would only cost time (0.7 -> 4 us a token, in the tiny presets' hot loop).
        self._per_token = isinstance(tokenizer, ToolTokenizer)

    @property
    def text(self) -> str:
        """``tokenizer.decode(ids)``: the final text, then the provisional tail (what a turn's text is)."""
        if len(self._final) > 1:
            self._final[:] = ["".join(self._final)]
        head = self._final[0] if self._final else ""
        return head + self._tail if self._tail else head

    def push(self, token: int) -> str:
        """Add ``token``; returns the text it makes final (``""`` while the text ends in an incomplete character)."""
        if self._per_token:
            return self._make_final(self._tok.decode([token]))
        self._ids.append(token)
        window = self._tok.decode(self._ids[self._start:])
        if not window.startswith(self._prefix):
            # A decoder rewrote final text (SentencePiece byte fallback over an invalid byte): keep what is final,
            # and decode the new tokens on their own from here.
            self._start, self._prefix = self._read, ""
            window = self._tok.decode(self._ids[self._start:])
        new = window[len(self._prefix):]
        held = len(self._ids) - self._read
        if not new.endswith(REPLACEMENT):
            out = self._make_final(new)
            self._start, self._read = self._read, len(self._ids)
            self._prefix = self._tok.decode(self._ids[self._start:self._read])
            return out
        self._tail = new
        if held >= self._next_cut:
            return self._cut(window)
        return ""

    def flush(self) -> str:
        """Make the provisional tail final (the sequence ended); returns it."""
        out = self._make_final(self._tail)
        self._start = self._read = len(self._ids)
        self._prefix = ""
        return out

    def _make_final(self, piece: str) -> str:
        if piece:
            self._final.append(piece)
        self._tail = ""
        self._next_cut = self._max_held
        return piece

    def _cut(self, window: str) -> str:
        """Bound a run of held tokens: make final up to the latest boundary ``j`` where the window splits cleanly
        (``decode(ids[start:j]) + decode(ids[j:]) == decode(ids[start:])``), and start the window at ``j``."""
        n = len(self._ids)
        for j in range(n - 1, max(self._read, n - self._max_held), -1):  # the incomplete tail is <= 3 tokens
            head = self._tok.decode(self._ids[self._start:j])
            rest = self._tok.decode(self._ids[j:])
            if head + rest == window and head.startswith(self._prefix):
                out = self._make_final(head[len(self._prefix):])
                self._start = self._read = j
                self._prefix, self._tail = "", rest
                return out
        self._next_cut += self._max_held  # no clean split: try again after as many more tokens
        return ""


def increments(tokenizer: Tokenizer, ids: Iterable[int]) -> list[str]:
    """The text each of ``ids`` makes final, in order, the last one with the flushed tail: ``"".join`` of it
    is ``tokenizer.decode(ids)`` (see the module docstring for the one exception)."""
    d = IncrementalDetokenizer(tokenizer)
    out = [d.push(i) for i in ids]
    if out:
        out[-1] += d.flush()
    return out
