"""The files of a model folder (``spec.model.weights``), read as untrusted data: confined, capped, JSON only.

Users bring model folders from anywhere, so nothing in one is trusted but its bytes:

- every file is read *inside* the folder: a name (a shard in ``model.safetensors.index.json``, a
  tokenizer file a config names) must be relative without a ``..`` part, and the file it resolves to,
  symbolic links followed, must lie in the resolved folder. The one exception is the layout
  ``huggingface_hub`` downloads into, ``models--<org>--<name>/snapshots/<rev>/`` whose files are links
  to ``../../blobs/<hash>``: for such a snapshot the repository's ``blobs/`` folder counts as inside;
- every file it is read from is a regular file (not a FIFO that blocks, not ``/dev/zero``) within a
  size limit per name (:data:`FILE_LIMITS`), checked before it is read and again while reading;
- JSON is parsed as data (no pickles, no code; NaN/Infinity are refused by the field bounds of
  :mod:`asyncrl.api.model_bounds`); a folder's Python files are never imported (loaders pass
  ``trust_remote_code=False``).

:func:`file_problems` lists every problem of a folder's files at once (``asyncrl validate`` and the
tokenizer's load run it); :func:`read_json` and :func:`inside` are what the readers use. Each problem
is one line naming the file, what is wrong and the fix. Pure file reading (no torch, no transformers).
"""

import json
import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

KIB, MIB = 1 << 10, 1 << 20
CONFIG_MAX_BYTES = 1 * MIB  # config.json: a few KiB in real models
SMALL_JSON_MAX_BYTES = 1 * MIB  # generation_config.json, special_tokens_map.json
INDEX_MAX_BYTES = 16 * MIB  # model.safetensors.index.json: ~5 MiB for 100k tensor names
TOKENIZER_JSON_MAX_BYTES = 64 * MIB  # tokenizer.json: 7-11 MiB for Qwen/Llama 3, 33 MiB for the largest vocabularies
TOKENIZER_CONFIG_MAX_BYTES = 4 * MIB  # tokenizer_config.json, added_tokens.json: inline templates, added tokens
VOCAB_FILE_MAX_BYTES = 16 * MIB  # vocab.json, merges.txt, sentencepiece models: 1-5 MiB in real models
CHAT_TEMPLATE_MAX_BYTES = 1 * MIB  # a chat template: real ones are under 20 KiB
MAX_ENTRIES = 10_000  # entries of the folder listed (a checkpoint has a few hundred files at most)
MAX_TEMPLATES = 64  # files in additional_chat_templates/
MAX_SHARDS = 4096  # safetensors files (405B-parameter checkpoints have ~200)

TEMPLATE_DIR = "additional_chat_templates"  # named chat templates, one *.jinja each
FILE_LIMITS: Mapping[str, tuple[int, str]] = {  # file name -> (byte limit, the constant's name)
    "config.json": (CONFIG_MAX_BYTES, "CONFIG_MAX_BYTES"),
    "generation_config.json": (SMALL_JSON_MAX_BYTES, "SMALL_JSON_MAX_BYTES"),
    "special_tokens_map.json": (SMALL_JSON_MAX_BYTES, "SMALL_JSON_MAX_BYTES"),
    "model.safetensors.index.json": (INDEX_MAX_BYTES, "INDEX_MAX_BYTES"),
    "tokenizer.json": (TOKENIZER_JSON_MAX_BYTES, "TOKENIZER_JSON_MAX_BYTES"),
    "tekken.json": (TOKENIZER_JSON_MAX_BYTES, "TOKENIZER_JSON_MAX_BYTES"),
    "tokenizer_config.json": (TOKENIZER_CONFIG_MAX_BYTES, "TOKENIZER_CONFIG_MAX_BYTES"),
    "added_tokens.json": (TOKENIZER_CONFIG_MAX_BYTES, "TOKENIZER_CONFIG_MAX_BYTES"),
    "vocab.json": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "vocab.txt": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "merges.txt": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "tokenizer.model": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "tiktoken.model": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "spiece.model": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "sentencepiece.bpe.model": (VOCAB_FILE_MAX_BYTES, "VOCAB_FILE_MAX_BYTES"),
    "chat_template.jinja": (CHAT_TEMPLATE_MAX_BYTES, "CHAT_TEMPLATE_MAX_BYTES"),
    "chat_template.json": (CHAT_TEMPLATE_MAX_BYTES, "CHAT_TEMPLATE_MAX_BYTES"),
}
LINK_FIX = "copy the file into the folder instead of linking to it (a model folder is read only inside itself)"


class FolderFileError(ValueError):
    """A file of a model folder that is refused; the message is one line naming the file and the fix."""


def roots(folder: Path) -> tuple[Path, ...]:
    """Where the files of ``folder`` may resolve to: the resolved folder (and, for a ``huggingface_hub``
    cache snapshot ``models--*/snapshots/<rev>``, that repository's ``blobs/``)."""
    base = folder.expanduser().resolve()
    if base.parent.name == "snapshots" and base.parent.parent.name.startswith(("models--", "datasets--")):
        return base, base.parent.parent / "blobs"
    return (base,)


def _within(path: Path, bases: tuple[Path, ...]) -> bool:
    return any(path == b or path.is_relative_to(b) for b in bases)


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a file inside a folder (None: it can): not a string, empty, absolute, a
    ``..`` part, a backslash or a NUL."""
    if type(name) is not str or not name.strip():
        return "is not a file name"
    if "\x00" in name or "\\" in name:
        return "holds a NUL or a backslash"
    path = PurePosixPath(name)
    if path.is_absolute() or (len(name) > 1 and name[1] == ":"):
        return "is an absolute path"
    if ".." in path.parts:
        return "has a '..' part"
    return None


def inside(folder: Path, name: str, *, where: str) -> Path | None:
    """The resolved path of ``folder/name``, None when there is no such entry.

    Raises :class:`FolderFileError` (naming ``where``, the file that named it) when ``name`` is absolute or
    has a ``..`` part, when it resolves outside the folder (a symbolic link out), when it is a link to
    nothing, or when it is not a regular file.
    """
    if (why := name_problem(name)) is not None:
        raise FolderFileError(f"{where}: {name!r} {why}; name files by their path inside {folder}")
    target = folder / name
    if not os.path.lexists(target):
        return None
    try:
        real = target.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise FolderFileError(f"{target}: cannot be resolved ({exc}); {LINK_FIX}") from None
    if not _within(real, roots(folder)):
        raise FolderFileError(f"{target}: a symbolic link to {real}, outside {folder}; {LINK_FIX}")
    if not real.exists():
        raise FolderFileError(f"{target}: a symbolic link to {real}, which does not exist; {LINK_FIX}")
    if not real.is_file():
        raise FolderFileError(f"{target}: not a regular file; replace it by the file itself")
    return real


def _limit(name: str) -> tuple[int, str] | None:
    """The byte limit of a file the loaders read (and its constant's name); None: not size-capped here
    (weights, files no loader opens)."""
    base = PurePosixPath(name).name
    if base.endswith(".jinja"):
        return CHAT_TEMPLATE_MAX_BYTES, "CHAT_TEMPLATE_MAX_BYTES"
    return FILE_LIMITS.get(base)


def _size_problem(path: Path, shown: Path, cap: tuple[int, str] | None = None) -> str | None:
    if (cap := cap or _limit(shown.name)) is None:
        return None
    limit, constant = cap
    size = path.stat().st_size
    if size <= limit:
        return None
    return (f"{shown}: {size} bytes, over the {limit}-byte limit for {shown.name} ({constant}); no supported model "
            "has one this large: re-save the folder with save_pretrained")


def read_text(folder: Path, name: str, *, where: str | None = None) -> str | None:
    """The text of ``folder/name`` (None when absent), confined by :func:`inside` and capped by its
    :data:`FILE_LIMITS` entry; the cap holds while reading too (a file that grows after its stat)."""
    shown = folder / name
    real = inside(folder, name, where=where or str(shown))
    if real is None:
        return None
    cap = _limit(name) or (CONFIG_MAX_BYTES, "CONFIG_MAX_BYTES")
    limit = cap[0]
    if (too_big := _size_problem(real, shown, cap)) is not None:
        raise FolderFileError(too_big)
    try:
        with open(real, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise FolderFileError(f"{shown}: grew past its {limit}-byte limit while read; copy the folder first")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FolderFileError(f"{shown}: not readable UTF-8 text ({exc}); re-copy or re-save it") from None


def read_json(folder: Path, name: str, *, fix: str = "re-save the folder with save_pretrained") -> Any:
    """The parsed JSON of ``folder/name`` (None when absent); see :func:`read_text`."""
    text = read_text(folder, name)
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise FolderFileError(f"{folder / name}: not readable JSON ({reason}); {fix}") from None


def _entry_problems(folder: Path, name: str) -> list[str]:
    """A folder entry's problems: any link must stay inside; a file a loader reads must be a regular file
    within its limit. Other files (README, LICENSE, a folder's *.py, never imported) are not opened."""
    path = folder / name
    try:
        if path.is_dir():  # (follows a link)
            if path.is_symlink() and not _within(path.resolve(), roots(folder)):
                return [f"{path}: a symbolic link to {path.resolve()}, outside {folder}; {LINK_FIX}"]
            return []
        if path.is_symlink() or _limit(name) is not None or name.endswith(".safetensors"):
            real = inside(folder, name, where=str(path))
            if real is not None and (too_big := _size_problem(real, path)) is not None:
                return [too_big]
    except FolderFileError as exc:
        return [str(exc)]
    except (OSError, RuntimeError) as exc:
        return [f"{path}: cannot be read ({exc}); make it a readable regular file"]
    return []


def _template_problems(folder: Path) -> list[str]:
    path = folder / TEMPLATE_DIR
    if not path.is_dir():
        return []
    if not _within(path.resolve(), roots(folder)):
        return [f"{path}: a symbolic link to {path.resolve()}, outside {folder}; {LINK_FIX}"]
    names = sorted(p.name for p in path.iterdir())
    if len(names) > MAX_TEMPLATES:
        return [f"{path}: {len(names)} entries, over MAX_TEMPLATES {MAX_TEMPLATES}; keep the templates the model uses"]
    return [p for n in names if n.endswith(".jinja") for p in _entry_problems(folder, f"{TEMPLATE_DIR}/{n}")]


def _named_file_problems(folder: Path) -> list[str]:
    """Names that ``tokenizer_config.json`` gives transformers to open (``fast_tokenizer_files``)."""
    try:
        cfg = read_json(folder, "tokenizer_config.json")
    except FolderFileError as exc:
        return [str(exc)]
    files = cfg.get("fast_tokenizer_files") if isinstance(cfg, dict) else None
    if files is None:
        return []
    where = str(folder / "tokenizer_config.json")
    if not isinstance(files, list):
        return [f"{where}: fast_tokenizer_files is not a list of file names; remove it (tokenizer.json is used)"]
    out = []
    for name in files:
        try:
            inside(folder, name, where=f"{where}: fast_tokenizer_files")
        except FolderFileError as exc:
            out.append(str(exc))
    return out


def file_problems(folder: str | os.PathLike[str]) -> list[str]:
    """Every problem of the files of a model folder, all at once (empty: every file the loaders read is a
    regular file inside the folder within its size limit). A missing folder is the caller's to report."""
    path = Path(os.path.expanduser(str(folder)))
    if not path.is_dir():
        return []
    try:
        names = []
        with os.scandir(path) as entries:
            for entry in entries:
                names.append(entry.name)
                if len(names) > MAX_ENTRIES:
                    return [f"{path}: over MAX_ENTRIES {MAX_ENTRIES} entries; a model folder holds a config, "
                            "weights and tokenizer files: point spec.model.weights at one"]
    except OSError as exc:
        return [f"{path}: cannot be listed ({exc}); make it readable"]
    out = [p for name in sorted(names) for p in _entry_problems(path, name)]
    shards = sum(n.endswith(".safetensors") for n in names)
    if shards > MAX_SHARDS:
        out.append(f"{path}: {shards} safetensors files, over MAX_SHARDS {MAX_SHARDS}; re-save with larger shards")
    return list(dict.fromkeys(out + _template_problems(path) + _named_file_problems(path)))  # each once


__all__ = [
    "CHAT_TEMPLATE_MAX_BYTES", "CONFIG_MAX_BYTES", "FILE_LIMITS", "INDEX_MAX_BYTES", "MAX_ENTRIES", "MAX_SHARDS",
    "MAX_TEMPLATES", "SMALL_JSON_MAX_BYTES", "TEMPLATE_DIR", "TOKENIZER_CONFIG_MAX_BYTES", "TOKENIZER_JSON_MAX_BYTES",
    "VOCAB_FILE_MAX_BYTES", "FolderFileError", "file_problems", "inside", "name_problem", "read_json", "read_text",
    "roots",
]
