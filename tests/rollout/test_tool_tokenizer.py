import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs import get_task, replay
from asyncrl.rollout.envs.registry import max_prompt_tokens
from asyncrl.rollout.tokenizer import (
    CHARS,
    TAGS,
    TOKENIZER,
    HFTokenizer,
    Tokenizer,
    ToolTokenizer,
    tokenizer_for,
)

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


# ---------------------------------------------------------------- the Tokenizer protocol, per model


def test_char_tokenizer_is_the_default_of_models_without_a_tokenizer(tmp_path: Path) -> None:
    assert isinstance(TOKENIZER, Tokenizer) and TOKENIZER.name == "char"
    assert TOKENIZER.chat_prompt("ignored system text", "Q:1+2=?") == TOKENIZER.encode("Q:1+2=?", bos=True)
    assert TOKENIZER.decode([TOKENIZER.eos_id]) == TOKENIZER.eos_token == "<eos>"
    assert tokenizer_for(ModelSpec()) is TOKENIZER
    (tmp_path / "model.safetensors").write_bytes(b"")  # weights without tokenizer files: still char
    assert tokenizer_for(ModelSpec(preset="small-llama", weights=str(tmp_path))) is TOKENIZER


def _bpe_folder(folder: Path, n_filler: int = 0) -> Path:
    """A real byte-level BPE tokenizer (tokenizers + transformers) saved as a model folder would hold it.

    Merges make tags several tokens (``<`` ``calc`` ``>``, ``</``) and one token run past a closing
    tag (``>.``), as SmolLM2's does; ``n_filler`` extra tokens enlarge the vocabulary.
    """
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = [("<", "/"), ("c", "a"), ("ca", "l"), ("cal", "c"), (">", "."), ("a", "n"), ("an", "s")]
    pieces = specials + sorted(pre_tokenizers.ByteLevel.alphabet()) + [a + b for a, b in merges]
    pieces += [f"filler{i}" for i in range(n_filler)]
    raw = RawTokenizer(models.BPE({p: i for i, p in enumerate(pieces)}, merges))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(specials)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=raw, eos_token="<|im_end|>", bos_token="<|im_start|>", pad_token="<|im_end|>"
    )
    hf.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    hf.save_pretrained(str(folder))
    return folder


def test_a_weights_folder_with_tokenizer_files_brings_its_tokenizer(tmp_path: Path) -> None:
    folder = _bpe_folder(tmp_path / "model")
    tok = tokenizer_for(ModelSpec(preset="tiny-llama", weights=str(folder)))
    assert isinstance(tok, HFTokenizer) and isinstance(tok, Tokenizer)
    # 3 specials + 256 byte symbols + 7 merges = 266 ids; pad = eos = <|im_end|> (id 2)
    assert (tok.vocab_size, tok.pad_id, tok.eos_id, tok.eos_token) == (266, 2, 2, "<|im_end|>")
    assert resolve_arch(ModelSpec(weights=str(folder)), tok.vocab_size).vocab_size == 266
    assert [tok.decode([i]) for i in tok.encode("<calc>4*3</calc>")] == [
        "<", "calc", ">", "4", "*", "3", "</", "calc", ">"
    ]
    with pytest.raises(ValueError, match=r"ids \[266\] are out of range \[0, 266\)"):
        tok.decode([266])

    env = get_task("calculator").make_env(tokenizer=tok)
    prompt = env.reset(random.Random(0))
    assert env.problem is not None
    text = tok.decode(prompt)
    assert text.startswith("<|im_start|>system\nSolve the arithmetic question with the calculator") and text.endswith(
        f"<|im_start|>user\nQ:{env.problem.question}=?<|im_end|>\n<|im_start|>assistant\n"
    )
    # worked examples as earlier turns (the last 'Q:...=?' is the question, see load_prompt)
    assert "<|im_start|>user\nQ:12*34=?<|im_end|>\n<|im_start|>assistant\n<calc>12*34</calc>" in text
    q, a = env.problem.question, env.problem.answer
    ep = replay(env, prompt, [f"<calc>{q}</calc>", f"<ans>{a}</ans>"])
    assert (ep.done, ep.reward, ep.success) == (True, 1.0, True)
    assert tok.decode(ep.tokens[len(prompt) :]) == f"<calc>{q}</calc><res>{a}</res><ans>{a}</ans>"
    pl = len(prompt)
    assert get_task("calculator").rescore(ep.tokens, ep.loss_mask, pl, tokenizer=tok).reward == 1.0
    # the bound on prompt length holds (it sizes the context both sides build)
    assert max_prompt_tokens("chain-calculator", tok) >= max(
        len(get_task("chain-calculator").make_env(tokenizer=tok).reset(random.Random(s))) for s in range(200)
    )


def test_bpe_turns_end_on_the_first_closing_tag_and_on_the_models_eos(tmp_path: Path) -> None:
    tok = tokenizer_for(ModelSpec(weights=str(_bpe_folder(tmp_path / "model"))))
    env = get_task("calculator").make_env(tokenizer=tok)
    env.load_prompt(tok.chat_prompt("system text", "Q:47*38=?"))
    # '>.' is one token: the closing tag ends inside it, and the answer still counts (47*38 = 1786)
    assert tok.encode("</ans>.")[-1] == tok.encode(">.")[0]
    assert replay(env, [], ["<ans> 1786</ans>."]).success
    # the tool answers a call whose closing tag is followed by more text in the same token
    ep = replay(env, [], ["<calc>47*38</calc>.", "<ans>1786</ans>"])
    assert "<res>1786</res>" in tok.decode(ep.tokens) and ep.success
    ep = replay(env, [], ["1786<|im_end|>"])
    assert (ep.done, ep.reward, ep.reason) == (True, 0.0, "<|im_end|> without an answer")


def test_a_tokenizer_larger_than_the_presets_vocabulary_is_refused(tmp_path: Path) -> None:
    folder = _bpe_folder(tmp_path / "model", n_filler=49152 - 266 + 1)  # one id more than SmolLM2's
    with pytest.raises(ValueError, match=r"its tokenizer has 49153 ids but preset 'smollm2-135m' embeds 49152"):
        tokenizer_for(ModelSpec(preset="smollm2-135m", weights=str(folder)))


def test_a_missing_weights_folder_is_an_error_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"spec.model.weights '.*nowhere': no such folder here; pull the "
                       r"model first \('asyncrl models pull smollm2' prints its folder\) or fix the path"):
        tokenizer_for(ModelSpec(preset="smollm2-135m", weights=str(tmp_path / "nowhere")))
