"""A small SentencePiece-style tokenizer built offline, as Llama 2 and Mistral ship theirs (nothing downloads).

A BPE over ``▁``-marked words (the ``tokenizers`` library's ``Metaspace`` pre-tokenizer, ``prepend_scheme="first"``)
trained on a tiny corpus, with byte fallback (``<0x00>`` .. ``<0xFF>``, ids 3..258, after ``<unk>``, ``<s>``,
``</s>``) for every character it did not learn, and the Llama decoder: ``▁`` to a space, bytes fused into UTF-8,
then one leading space stripped. That last step is why ``decode([token])`` loses each word's space, and the byte
fallback is why it spells ``東`` as three tokens. Wrapped as a transformers ``PreTrainedTokenizerFast`` with a
Llama-2-style chat template, behind :class:`~asyncrl.rollout.tokenizer.HFTokenizer`.

``legacy=True`` marks words as Llama 2's first conversion did: a normalizer (``Prepend("▁")``, spaces to ``▁``) in
place of the pre-tokenizer, run on each stretch of text between special tokens, so text after ``<s>`` is marked too
(``Metaspace`` with ``prepend_scheme="first"`` marks only the text's first word).
"""

import functools
import json

from asyncrl.rollout.tokenizer import HFTokenizer

SPECIALS = ("<unk>", "<s>", "</s>")
BYTES = tuple(f"<0x{b:02X}>" for b in range(256))
FIRST_BYTE_ID = len(SPECIALS)  # the id of <0x00>; byte b is FIRST_BYTE_ID + b
CORPUS = ("the cat sat on the mat", "hello world, the world is wide", "naïve café at the inn", "a tool call")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'assistant' %}{{ ' ' + m['content'] + eos_token }}"
    "{% else %}{{ '[INST] ' + m['content'] + ' [/INST]' }}{% endif %}{% endfor %}"
)


@functools.lru_cache(maxsize=2)
def sentencepiece_tokenizer(legacy: bool = False) -> HFTokenizer:
    """The tokenizer (built once per process, ~0.1 s; the same ids every time)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    learner = Tokenizer(models.BPE(unk_token="<unk>"))
    learner.pre_tokenizer = metaspace
    learner.train_from_iterator(list(CORPUS) * 20, trainers.BpeTrainer(vocab_size=160, special_tokens=list(SPECIALS),
                                                                       show_progress=False))
    learnt = json.loads(learner.to_str())["model"]
    pieces = [p for p, _ in sorted(learnt["vocab"].items(), key=lambda kv: kv[1]) if p not in SPECIALS]
    vocab = {p: i for i, p in enumerate([*SPECIALS, *BYTES, *pieces])}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learnt["merges"]]
    core = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    if legacy:
        core.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    else:
        core.pre_tokenizer = metaspace
    core.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)])
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    hf = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                 clean_up_tokenization_spaces=False)
    hf.chat_template = CHAT_TEMPLATE
    return HFTokenizer(hf, "sentencepiece-legacy-test" if legacy else "sentencepiece-test")
