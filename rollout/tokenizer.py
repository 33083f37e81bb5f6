"""Tokenizers of the built-in tasks: the :class:`Tokenizer` protocol, the character-level default and
a pretrained model's own (HF) tokenizer, chosen per model by :func:`tokenizer_for`.

The environments, the rollout engine and the actor only talk to a :class:`Tokenizer`: text in and
out, ``vocab_size``, ``pad_id`` and the end-of-sequence token. A model without its own tokenizer
(the ``tiny-llama``/``small-llama`` presets, random or self-trained weights) uses the character
tokenizer :data:`TOKENIZER`; a weights folder that carries tokenizer files (``asyncrl models pull
smollm2``) uses those, so the prompts, tool tags and answers are the model's own BPE text.

Character tokenizer: tags (``<calc>``, ``</calc>``, ``<res>``, ``</res>``, ``<ans>``, ``</ans>``) are single tokens, as in
real tokenizers: spelled-out tags make a tiny model need ~4x more warm-up steps and plateau lower
(``docs/architecture.md`` (the embedded model and tasks)). The vocabulary is fixed, so ids are deterministic across
processes and the actor and every rollout worker agree on them without exchanging files.

A model folder's tokenizer is untrusted data (``docs/security.md``, "Model folders"): its files are
checked first (:func:`asyncrl.api.model_folder.file_problems`: inside the folder, regular, within
their size limits), transformers loads it with ``trust_remote_code=False`` (an ``auto_map`` naming the
folder's Python code is never run and never prompts), and every chat-template render is stopped at
:data:`TEMPLATE_RENDER_LIMIT_S` (:func:`render_chat`).
"""

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from asyncrl.rollout.content_shield import ContentShield
from asyncrl.rollout.time_limit import TimeLimitError, call_within

if TYPE_CHECKING:
    from asyncrl.api.model import ModelSpec

PAD = "<pad>"
BOS = "<bos>"
EOS = "<eos>"
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS)
TAGS: tuple[str, ...] = ("<calc>", "</calc>", "<res>", "</res>", "<ans>", "</ans>")
CHARS = "0123456789+-*()=?Q:"
TOKENIZER_FILE = "tokenizer.json"  # a weights folder holding this file brings its own tokenizer
TEMPLATE_RENDER_LIMIT_S = 5.0  # one chat-template render: real templates take about a millisecond


@runtime_checkable
class Tokenizer(Protocol):
    """What environments, engines and the actor need of a tokenizer (text <-> ids)."""

    @property
    def name(self) -> str: ...  # "char", or the folder an HF tokenizer was loaded from

    @property
    def vocab_size(self) -> int: ...  # ids are in [0, vocab_size); the model's embedding rows

    @property
    def pad_id(self) -> int: ...  # filler of padded batches (masked out; any valid id works)

    @property
    def eos_id(self) -> int: ...

    @property
    def eos_token(self) -> str: ...  # the text ``decode([eos_id])`` gives: an episode ends on it

    @property
    def special_tokens(self) -> Mapping[str, int]: ...  # the strings ``encode`` reads as special ids, and their ids

    def encode(self, text: str, *, bos: bool = False, special: bool = True) -> list[int]:
        """Ids of ``text``; ``bos`` prepends the BOS id if any. ``special``: a :attr:`special_tokens` string in
        ``text`` becomes its id (a chat template's markers); False: it is text like any other (content from outside:
        message contents, tool results, tool schemas; ``rollout/content_shield.py``)."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """Text of ``ids``. ``decode([i])`` alone is not the text token ``i`` adds to a sequence (a multibyte
        character spans tokens; SentencePiece drops the first token's word space): the engine's turn text is
        decoded incrementally (``rollout/detokenize.py``)."""
        ...

    def chat_prompt(self, system: str, user: str, examples: Sequence[tuple[str, str]] = ()) -> list[int]:
        """Prompt ids of a task: ``system`` instructions, worked ``examples`` as earlier (user,
        assistant) turns, then the ``user`` question, ready to sample the answer after (a chat model's
        template; the character tokenizer ignores ``system`` and ``examples``)."""
        ...


@dataclass(frozen=True)
class ToolTokenizer:
    """Maps text of the built-in tasks to ids and back.

    ``encode`` matches tags greedily before single characters; an unknown character raises a
    ``ValueError`` that names it and lists the alphabet. ``<pad>``, ``<bos>`` and ``<eos>`` are the special
    tokens (``encode(special=False)`` reads them as characters); the tags are vocabulary, single ids in any
    text, as a real tokenizer's added non-special tokens are (the math tasks' tools answer ``<res>..</res>``).
    """

    pieces: tuple[str, ...] = SPECIALS + TAGS + tuple(CHARS)
    _ids: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ids = {p: i for i, p in enumerate(self.pieces)}
        if len(ids) != len(self.pieces):
            raise ValueError(f"ToolTokenizer: duplicate pieces in {self.pieces}")
        object.__setattr__(self, "_ids", ids)

    @property
    def name(self) -> str:
        return "char"

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

    @property
    def eos_token(self) -> str:
        return EOS

    @property
    def special_tokens(self) -> Mapping[str, int]:
        return {p: self._ids[p] for p in SPECIALS if p in self._ids}

    def chat_prompt(self, system: str, user: str, examples: Sequence[tuple[str, str]] = ()) -> list[int]:
        """``<bos>`` + ``user`` (data: a ``<eos>`` typed in it is no end of turn): the character alphabet cannot
        spell ``system`` (a tiny model learns the protocol from demonstrations instead, not from ``examples``
        in its short context)."""
        return self.encode(user, bos=True, special=False)

    def token_id(self, piece: str) -> int:
        """Id of one piece (a tag, a special token or a character)."""
        try:
            return self._ids[piece]
        except KeyError:
            raise ValueError(
                f"ToolTokenizer: {piece!r} is not a token; valid tokens: {list(self.pieces)}"
            ) from None

    def encode(self, text: str, *, bos: bool = False, special: bool = True) -> list[int]:
        """Ids of ``text``; ``bos`` prepends ``<bos>``. Tags are one id each, and so are ``<pad>``/``<bos>``/``<eos>``
        when ``special`` (else they are characters, which this alphabet cannot spell)."""
        out = [self.bos_id] if bos else []
        i = 0
        while i < len(text):
            if text[i] == "<":
                end = text.find(">", i)
                piece = text[i : end + 1] if end >= 0 else ""
                if piece in self._ids and (special or piece not in SPECIALS):
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
"""The default tokenizer of the built-in tasks (vocabulary size 28)."""


class HFTokenizer:
    """A pretrained model's transformers tokenizer behind the :class:`Tokenizer` protocol.

    Tags like ``<calc>`` are plain text here (several BPE tokens); the episode ends on the model's
    EOS token (SmolLM2-Instruct: ``<|im_end|>``, its end of turn). Prompts use the model's chat template.
    """

    def __init__(self, hf: Any, name: str, generation_eos: Sequence[int] = ()) -> None:
        self.hf = hf
        self._name = name
        self._vocab = len(hf)  # base vocabulary plus added special tokens
        # The episode ends where the model ends its turn: the token the chat template closes an
        # assistant message with (Qwen/SmolLM2 instruct: <|im_end|>), else generation_config.json's
        # first eos id, else the tokenizer's eos (a base model's <|endoftext|>).
        turn_end = _end_of_turn(hf)
        eos = turn_end if turn_end is not None else (generation_eos[0] if generation_eos else hf.eos_token_id)
        if eos is None:
            raise ValueError(
                f"tokenizer {name}: no end-of-turn or eos token; set eos_token in its tokenizer_config.json "
                "or eos_token_id in generation_config.json"
            )
        self._eos = int(eos)
        self._stop = tuple(dict.fromkeys([self._eos, *map(int, generation_eos)]))
        # SmolLM2 pads with its EOS; a tokenizer without a pad token gets the same (masked anyway)
        self._pad = int(hf.pad_token_id) if hf.pad_token_id is not None else self._eos
        self._bos = hf.bos_token_id
        # the added tokens marked special: what split_special_tokens=True spells as text (non-special added
        # tokens, e.g. Qwen's <tool_call>, stay single ids in any text, as the tokenizer itself has them)
        self._special = {str(t.content): int(i) for i, t in hf.added_tokens_decoder.items() if t.special}

    @classmethod
    def from_folder(cls, folder: str | os.PathLike[str]) -> "HFTokenizer":
        """The tokenizer of a model folder, its files checked first; every failure is one ``ValueError``
        line naming the folder (a folder's code is never run: ``trust_remote_code=False``)."""
        from asyncrl.api.model_folder import file_problems

        path = Path(folder).expanduser()
        if problems := file_problems(path):
            raise ValueError(f"tokenizer of {path}: " + "; ".join(problems))
        hf = _load_hf_tokenizer(path)
        return cls(hf, str(folder), generation_eos_ids(path))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the end-of-turn id first, then generation_config.json's eos ids."""
        return self._stop

    @property
    def name(self) -> str:
        return self._name

    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def eos_id(self) -> int:
        return self._eos

    @property
    def eos_token(self) -> str:
        return str(self.hf.eos_token)

    @property
    def special_tokens(self) -> Mapping[str, int]:
        return self._special

    def encode(self, text: str, *, bos: bool = False, special: bool = True) -> list[int]:
        ids = list(self.hf.encode(text, add_special_tokens=False, split_special_tokens=not special))
        return ([int(self._bos)] if bos and self._bos is not None else []) + ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        bad = [i for i in ids if not 0 <= i < self._vocab]
        if bad:
            raise ValueError(f"tokenizer {self._name}: ids {bad[:5]} are out of range [0, {self._vocab})")
        return str(self.hf.decode(list(ids), skip_special_tokens=skip_special, clean_up_tokenization_spaces=False))

    def chat_prompt(self, system: str, user: str, examples: Sequence[tuple[str, str]] = ()) -> list[int]:
        """The chat template's prompt; the texts are content (data: only the template's markers are special)."""
        if not self.hf.chat_template:
            shots = "".join(f"{q}\n{a}\n" for q, a in examples)
            return self.encode(f"{system}\n{shots}{user}\n", bos=True, special=False)
        msgs = [{"role": "system", "content": system}]
        for q, a in examples:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": user})
        shield = ContentShield(self)
        return shield.encode(render_chat(self.hf, shield.data(msgs), add_generation_prompt=True))


def _load_hf_tokenizer(path: Path) -> Any:
    """``AutoTokenizer.from_pretrained(path)`` offline and without the folder's code, its errors as one line."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 -- transformers and tokenizers raise many types for a bad folder
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if _auto_map(path):
            raise ValueError(
                f"tokenizer of {path}: tokenizer_config.json's auto_map names the folder's own Python code, which "
                "asyncrl never runs (trust_remote_code=False); set tokenizer_class to a transformers class (e.g. "
                "PreTrainedTokenizerFast) and remove auto_map"
            ) from None
        raise ValueError(f"tokenizer of {path} does not load ({type(exc).__name__}: {reason[:300]}); "
                         "re-save it with tokenizer.save_pretrained(folder)") from None


def _auto_map(path: Path) -> bool:
    from asyncrl.api.model_folder import FolderFileError, read_json

    try:
        cfg = read_json(path, "tokenizer_config.json")
    except FolderFileError:
        return False
    return isinstance(cfg, dict) and bool(cfg.get("auto_map"))


def render_chat(hf: Any, messages: Sequence[Any], *, limit_s: float | None = None, **kwargs: Any) -> str:
    """``hf.apply_chat_template(messages, tokenize=False, **kwargs)``, stopped after ``limit_s`` seconds
    (default :data:`TEMPLATE_RENDER_LIMIT_S`) with a one-line :class:`~asyncrl.rollout.time_limit.TimeLimitError`:
    a template is the model folder's program, and one with nested loops would otherwise never return."""
    limit = TEMPLATE_RENDER_LIMIT_S if limit_s is None else limit_s
    what = f"the chat template of {getattr(hf, 'name_or_path', '') or 'the tokenizer'}"
    try:
        return str(call_within(limit, what, hf.apply_chat_template, list(messages), tokenize=False, **kwargs))
    except TimeLimitError as exc:
        raise TimeLimitError(f"{exc} (TEMPLATE_RENDER_LIMIT_S); real templates render in milliseconds: fix or "
                             "replace the folder's chat_template.jinja (or tokenizer_config.json's chat_template)"
                             ) from None


def generation_eos_ids(folder: Path) -> tuple[int, ...]:
    """``eos_token_id`` of the folder's ``generation_config.json`` (an int or a list) as a tuple; () if none.

    Read as untrusted data (confined, at most ``SMALL_JSON_MAX_BYTES``); ids must be JSON integers >= 0."""
    from asyncrl.api.model_bounds import show
    from asyncrl.api.model_folder import read_json

    path = Path(folder).expanduser()
    fix = "re-save it with GenerationConfig.save_pretrained"
    doc = read_json(path, "generation_config.json", fix=fix)
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        raise ValueError(f"{path / 'generation_config.json'}: holds JSON {type(doc).__name__}, not an object; {fix}")
    value = doc.get("eos_token_id")
    if value is None:
        return ()
    ids = value if isinstance(value, list) else [value]
    if not ids or not all(type(v) is int and v >= 0 for v in ids):
        raise ValueError(f"{path / 'generation_config.json'}: eos_token_id {show(value)} must be an integer id >= 0 "
                         f"or a list of them; {fix}")
    return tuple(ids)


def _end_of_turn(hf: Any) -> int | None:
    """The special token the chat template puts right after an assistant message's content, or None."""
    if not getattr(hf, "chat_template", None):
        return None
    marker = "\u2063marker\u2063"
    try:
        text = render_chat(hf, [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}])
    except TimeLimitError:
        raise  # a template that does not end is refused, not worked around
    except Exception:  # noqa: BLE001 -- a template that needs other inputs: fall back to eos ids
        return None
    rest = text[text.find(marker) + len(marker):] if marker in text else ""
    for token in sorted(hf.all_special_tokens, key=len, reverse=True):
        if token and rest.lstrip("\n ").startswith(token):
            return int(hf.convert_tokens_to_ids(token))
    return None


def weights_folder(weights: str) -> Path:
    """``spec.model.weights`` as an existing folder (``~`` expanded: pulled models live in a user cache).

    A missing folder raises ``FileNotFoundError`` with the fix: a silent fallback would give the rollout
    workers the character tokenizer while the actor fails (or loads another model's tokenizer).
    """
    folder = Path(weights).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"spec.model.weights {weights!r}: no such folder here; pull the model first "
            "('asyncrl models pull smollm2' prints its folder) or fix the path"
        )
    return folder


def tokenizer_for(model: "ModelSpec") -> Tokenizer:
    """The tokenizer of ``model`` (``spec.model``), the same in the actor and every rollout worker.

    ``model.weights`` names a folder holding ``tokenizer.json`` (e.g. ``asyncrl models pull smollm2``):
    that folder's tokenizer; otherwise the character tokenizer :data:`TOKENIZER`. Raises a
    ``FileNotFoundError`` when the folder is missing and a ``ValueError`` when the tokenizer has more
    ids than the preset's vocabulary.
    """
    if model.weights is None:
        return TOKENIZER
    folder = weights_folder(model.weights)
    from asyncrl.api.model_arch import folder_config, resolve_arch

    if not (folder / TOKENIZER_FILE).is_file():
        if folder_config(model.weights) is not None:  # a real model folder must bring its tokenizer
            raise FileNotFoundError(
                f"spec.model.weights {model.weights!r}: no {TOKENIZER_FILE} in {folder}; save the model's "
                "tokenizer there too (tokenizer.save_pretrained(folder)) -- the character tokenizer only fits "
                "the tiny presets"
            )
        return TOKENIZER
    tok = _hf_tokenizer(str(folder.resolve()))
    vocab = resolve_arch(model, tok.vocab_size).vocab_size
    if tok.vocab_size > vocab:
        where = (f"vocab_size {vocab} in {folder / 'config.json'}" if folder_config(model.weights) is not None
                 else f"preset {model.preset or 'tiny-llama'!r} embeds {vocab}")
        raise ValueError(
            f"spec.model.weights {model.weights!r}: its tokenizer has {tok.vocab_size} ids but {where}; "
            "use the tokenizer the weights were made for (or the preset they fit)"
        )
    return tok


@functools.lru_cache(maxsize=4)
def _hf_tokenizer(folder: str) -> HFTokenizer:
    # one load per process: workers build one per engine, and parsing tokenizer.json takes ~0.5 s
    return HFTokenizer.from_folder(folder)
