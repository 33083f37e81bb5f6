"""The tokenizer files of an exported model folder.

A model trained from a folder brings its own tokenizer files, and the export copies them unchanged
(:data:`TOKENIZER_FILES`). The tiny presets use the built-in character tokenizer
(:data:`asyncrl.rollout.tokenizer.TOKENIZER`), which has no files: :func:`char_tokenizer_hf` builds a
transformers ``PreTrainedTokenizerFast`` with the same vocabulary and the same ids, so that
``AutoTokenizer.from_pretrained(folder)`` encodes the built-in tasks' text to exactly the ids the policy
was trained on:

- every special token (``<pad>``, ``<bos>``, ``<eos>``) and tool tag (``<calc>`` ... ``</ans>``) is an
  *added token*, matched before the model sees the text (the character tokenizer matches tags greedily
  before characters, the same rule);
- the rest of the text is split into single characters (a ``Split`` pre-tokenizer on ``.``) and looked up
  in a ``WordLevel`` vocabulary of the alphabet; there is no unknown token, so ``encode`` raises on a
  character outside the alphabet, as the original does;
- decoding concatenates the pieces (``Fuse``: no spaces between characters).

``encode`` prepends nothing (the character tokenizer's ``bos=False``); the folder's chat template is
``<bos>`` + the user turn, so ``apply_chat_template`` gives the ids of :meth:`ToolTokenizer.chat_prompt`.
"""

import shutil
from pathlib import Path
from typing import Any

# Files a transformers tokenizer may consist of (AutoTokenizer reads whichever are present).
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
# The character tokenizer's chat template: <bos> + the user turn (ToolTokenizer.chat_prompt ignores the
# system text and examples: its alphabet cannot spell them).
CHAR_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ message['content'] }}{% endif %}{% endfor %}"
)


def copy_tokenizer_files(source: Path, dest: Path) -> list[str]:
    """Copy the tokenizer files of ``source`` into ``dest``; the names copied (empty: none there)."""
    copied = []
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)
            copied.append(name)
    return copied


def char_tokenizer_hf(tokenizer: Any) -> Any:
    """A ``PreTrainedTokenizerFast`` with the ids of ``tokenizer`` (a
    :class:`~asyncrl.rollout.tokenizer.ToolTokenizer`, or the text alphabet derived from it:
    ``pieces``, ``pad_id``, ``bos_id``, ``eos_id``)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from asyncrl.rollout.tokenizer import SPECIALS

    pieces: tuple[str, ...] = tuple(tokenizer.pieces)
    vocab = {p: i for i, p in enumerate(pieces)}
    # No unk_token: a character outside the alphabet is an error, as in ToolTokenizer.encode.
    core = Tokenizer(models.WordLevel(vocab=vocab))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    # Multi-character pieces are the specials and the tags (tool tags too, for the text alphabet).
    core.add_special_tokens([AddedToken(p, normalized=False) for p in SPECIALS])
    core.add_tokens([AddedToken(p, normalized=False) for p in pieces if len(p) > 1 and p not in SPECIALS])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=pieces[tokenizer.pad_id],
        bos_token=pieces[tokenizer.bos_id],
        eos_token=pieces[tokenizer.eos_id],
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    hf.chat_template = CHAR_CHAT_TEMPLATE
    return hf
