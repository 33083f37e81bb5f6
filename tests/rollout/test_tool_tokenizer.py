import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.rollout.tokenizer import CHARS, TAGS, TOKENIZER, ToolTokenizer

PIECES = st.lists(st.sampled_from(list(CHARS) + list(TAGS) + ["<pad>", "<bos>", "<eos>"]), max_size=40)


@given(PIECES)
def test_round_trip(pieces: list[str]) -> None:
    text = "".join(pieces)
    ids = TOKENIZER.encode(text)
    assert TOKENIZER.decode(ids) == text
    assert len(ids) == len(pieces)  # every tag and special is one token


def test_tags_are_single_tokens_and_ids_are_fixed() -> None:
    assert TOKENIZER.vocab_size == 3 + 6 + len(CHARS) == 28
    assert (TOKENIZER.pad_id, TOKENIZER.bos_id, TOKENIZER.eos_id) == (0, 1, 2)
    assert TOKENIZER.encode("<calc>47+38</calc>") == TOKENIZER.encode("<calc>47+38</calc>")
    assert len(TOKENIZER.encode("<calc>47+38</calc>")) == 1 + 5 + 1
    assert ToolTokenizer().pieces == TOKENIZER.pieces  # deterministic across instances


def test_bos_and_skip_special() -> None:
    ids = TOKENIZER.encode("Q:1+2=?", bos=True)
    assert ids[0] == TOKENIZER.bos_id
    assert TOKENIZER.decode(ids, skip_special=True) == "Q:1+2=?"


@pytest.mark.parametrize("text", ["Q:a", "<calc", "<foo>1", "1 2"])
def test_unknown_text_is_named(text: str) -> None:
    with pytest.raises(ValueError, match="not in the alphabet"):
        TOKENIZER.encode(text)


def test_decode_out_of_range() -> None:
    with pytest.raises(ValueError, match="out of range"):
        TOKENIZER.decode([28])
