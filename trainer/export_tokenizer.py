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

A file is copied only from inside the model folder (:func:`confined_file`): a symbolic link is followed
only when it resolves into the folder (or, for a Hugging Face cache snapshot ``.../snapshots/<rev>``, into
that repository's ``blobs``), and the copy is a regular file. A ``chat_template.jinja`` linked to a secret
elsewhere is refused, never copied into the export.
"""

import os
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
# The character tokenizer's chat template: <bos> + the last user turn, wherever it is in the conversation
# (ToolTokenizer.chat_prompt ignores the system text and the worked examples, which come as earlier
# user/assistant turns: its alphabet cannot spell them). Rendering every user turn put the examples' questions before the question, so a run continued from an
# exported preset saw other prompts than the run it came from (calculator: 31 prompt tokens instead of 10).
CHAR_CHAT_TEMPLATE = (
    "{% set last = namespace(user='') %}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{% set last.user = message['content'] %}{% endif %}{% endfor %}{{ bos_token }}{{ last.user }}"
)


class UnconfinedFileError(ValueError):
    """A model folder's file that resolves out of the folder: the message names it, its target and the fix."""


def confinement_root(source: Path) -> Path:
    """The folder that ``source``'s links may point into: itself, or the repository folder of a Hugging
    Face cache snapshot (``models--org--name/snapshots/<rev>``, whose files link to ``../../blobs/<hash>``)."""
    if source.parent.name == "snapshots" and (source.parent.parent / "blobs").is_dir():
        return source.parent.parent
    return source


def confined_file(source: Path, name: str) -> Path | None:
    """The real file ``source / name`` is, when it is one inside the model folder (None: there is none).

    Raises :class:`UnconfinedFileError` for a link that leads out of the folder (or to nothing) and for
    an entry that is not a regular file."""
    path = source / name
    if not path.is_symlink() and not path.exists():
        return None
    root = confinement_root(source).resolve()
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise UnconfinedFileError(f"{path} is a symbolic link to {os.readlink(path)!r}, which does not exist; "
                                  "replace the link with the file itself") from None
    if not real.is_relative_to(root):
        raise UnconfinedFileError(f"{path} is a symbolic link to {real}, outside the model folder {source}: the "
                                  "export copies only the folder's own files (a link out of it could carry any "
                                  "file into the export); replace the link with the file it should be")
    if not real.is_file():
        raise UnconfinedFileError(f"{path} is not a regular file; a model folder's {name} must be one")
    return real


def copy_tokenizer_files(source: Path, dest: Path) -> list[str]:
    """Copy the tokenizer files of ``source`` into ``dest`` as regular files; the names copied (empty: none
    there). A file that leads out of the folder raises :class:`UnconfinedFileError` (nothing is copied)."""
    found = [(name, real) for name in TOKENIZER_FILES if (real := confined_file(source, name)) is not None]
    for name, real in found:
        shutil.copyfile(real, dest / name)
    return [name for name, _ in found]


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
