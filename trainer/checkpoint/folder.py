"""Atomic, verified actor checkpoints: one folder per checkpoint, written to a temporary sibling and renamed.

A reader sees either the previous complete folder or the new complete folder, never a partial
one: the files are written and fsync'ed inside ``.<name>.tmp-<pid>``, then the folder is renamed
into place (``rename`` of a directory is atomic on POSIX file systems). Replacing an existing
folder moves it aside first and deletes it after the new one is in place. A write that fails
(a full disk) removes its temporary folder before the error goes on.

The marker ``meta.json`` is written last and records the size and SHA-256 of every other file
(``files``). A folder is *complete* only when its marker parses and every recorded file has that
size and checksum (:func:`verify_checkpoint`): a rename makes a folder atomic against a crash, not
against a disk that returns a truncated file, a copy cut short or a hand-edited marker.

The marker also says what the folder *is*: every file in it must be listed (nothing unchecked lies
beside the checked ones), every listed name is a plain relative path inside the folder (no ``..``, not
absolute), and nothing in the folder is a symbolic link (a listed name resolves to itself, never to a
file elsewhere). Checksums detect corruption, not tampering: whoever writes a folder can compute them;
that a folder's *content* is data and never code is :mod:`asyncrl.trainer.checkpoint.safe_load`'s part.
"""

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import Any

STATE_FILE = "actor.pt"
META_FILE = "meta.json"
FILES_KEY = "files"  # in meta.json: {file name: {"bytes": int, "sha256": hex}}
_CHUNK = 1 << 20  # checksums are streamed: a checkpoint never has to fit in memory twice


class CheckpointError(RuntimeError):
    """A checkpoint folder that is not complete: ``path`` and ``reason`` say which file and why."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"checkpoint {self.path} is not usable: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:  # torch.distributed gathers a rank's error by pickling it
        return type(self), (self.path, self.reason)


def sha256_file(path: Path) -> str:
    """SHA-256 of ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    """What the marker records about one file: its size and checksum."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def verify_checkpoint(directory: str | os.PathLike[str], *, checksums: bool = True) -> dict[str, Any]:
    """The marker of a complete folder; :class:`CheckpointError` naming the file and the fault otherwise.

    ``checksums=False`` checks the marker and the sizes only (cheap: used to decide what pruning may
    delete); resuming always checks the checksums too.
    """
    folder = Path(directory)
    marker = folder / META_FILE
    if marker.is_symlink():
        raise CheckpointError(folder, f"{META_FILE} is a symbolic link: a marker is a file of the folder itself; "
                                      "copy the folder without links (cp -rL) from a source you trust")
    if not marker.is_file():
        raise CheckpointError(folder, f"no {META_FILE} (the marker written last): the write never finished")
    try:
        meta = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointError(folder, f"{marker.name} is unreadable ({type(exc).__name__}: {exc})") from exc
    files = meta.get(FILES_KEY) if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not files:
        raise CheckpointError(folder, f"{marker.name} records no file sizes and checksums ('{FILES_KEY}'): "
                                      "written without verification or edited by hand")
    problems = listing_problems(folder, files)
    if problems:
        raise CheckpointError(folder, "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""))
    for name, want in sorted(files.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(folder, f"{name} is missing (the marker records {want.get('bytes')} bytes)")
        size = path.stat().st_size
        if size != want.get("bytes"):
            raise CheckpointError(folder, f"{name} has {size} bytes, the marker records {want.get('bytes')} "
                                          "(truncated or overwritten)")
        if checksums and sha256_file(path) != want.get("sha256"):
            raise CheckpointError(folder, f"{name} has the recorded size but not the recorded SHA-256 (corrupted)")
    return dict(meta)


def listing_problems(folder: Path, files: dict[Any, Any]) -> list[str]:
    """What is wrong with the folder's listing (empty: nothing), one line each: a listed name that is not a
    plain relative path, escapes the folder or passes through a symbolic link; a record that is not
    ``{bytes, sha256}``; a file, link or other entry in the folder that the marker does not list."""
    problems = []
    for name, want in sorted(files.items(), key=lambda kv: str(kv[0])):
        why = _name_problem(folder, name)
        if why is not None:
            problems.append(f"{META_FILE} lists {name!r}, {why}: a checkpoint lists only its own files by "
                            "relative name; use a checkpoint from a source you trust")
        elif not (isinstance(want, dict) and isinstance(want.get("bytes"), int) and isinstance(want.get("sha256"), str)):
            problems.append(f"{META_FILE} records {name!r} as {want!r}, not {{'bytes': int, 'sha256': hex}}: "
                            "edited by hand")
    listed = {str(n) for n in files}
    for rel, kind in _entries(folder):
        if kind == "link":
            problems.append(f"{rel} is a symbolic link (a checkpoint holds files, never links to elsewhere); "
                            "copy the folder without links (cp -rL) from a source you trust")
        elif rel not in listed:
            problems.append(f"{rel} is not listed in {META_FILE} (unchecked: a checkpoint holds only the files "
                            "its marker records); remove it, or use a checkpoint from a source you trust")
    return problems


def _name_problem(folder: Path, name: Any) -> str | None:
    """Why ``name`` (a key of the marker's ``files``) is not a file of ``folder``'s own; None when it is."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    pure = PurePosixPath(name)
    if pure.is_absolute():
        return "an absolute path"
    if ".." in pure.parts:
        return "a path with '..' (out of the folder)"
    if pure.as_posix() != name or name == META_FILE:
        return "not a plain relative name" if name != META_FILE else "the marker itself"
    path = folder
    for part in pure.parts:  # no link on the way: each component is lstat'ed, never followed
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except ValueError:  # an embedded NUL
            return "not a file name"
        except OSError:
            return None  # missing: the size check says so
        if stat.S_ISLNK(mode):
            return f"which is a symbolic link ({path.relative_to(folder)} -> {os.readlink(path)})"
    if not stat.S_ISREG(mode):
        return "which is not a regular file"
    return None


def _entries(folder: Path, rel: str = "") -> list[tuple[str, str]]:
    """``(relative name, "file" | "link")`` of every non-folder entry under ``folder`` except the marker,
    links never followed (a folder that is a link is a link)."""
    out: list[tuple[str, str]] = []
    with os.scandir(folder / rel if rel else folder) as it:
        for entry in sorted(it, key=lambda e: e.name):
            name = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                out.append((name, "link"))
            elif entry.is_dir(follow_symlinks=False):
                out += _entries(folder, name)
            elif name != META_FILE:
                out.append((name, "file"))
    return out


def temporary_folder(directory: str | os.PathLike[str], pid: int | None = None) -> Path:
    """Where the folder ``directory`` is written before :func:`seal_folder` renames it into place:
    ``.<name>.tmp-<pid>`` beside it (a group of ranks uses rank 0's pid, so all write into one folder)."""
    final = Path(directory)
    return final.parent / f".{final.name}.tmp-{os.getpid() if pid is None else pid}"


def seal_folder(tmp: Path, directory: str | os.PathLike[str], meta: dict[str, Any]) -> Path:
    """Seal a folder whose files are all written: fsync and checksum every file under ``tmp``, write the
    marker ``meta.json`` last (``meta`` plus ``files``), then rename ``tmp`` to ``directory`` (an existing
    folder there is moved aside first and deleted after). Returns the final folder.

    One process calls this (rank 0 of a group, after a barrier says every rank's files are on disk)."""
    final = Path(directory)
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    records: dict[str, Any] = {}
    for path in files:
        with open(path, "rb") as f:  # writers that do not fsync (megatron's common.pt, metadata.json)
            os.fsync(f.fileno())
        records[path.relative_to(tmp).as_posix()] = file_record(path)
    with open(tmp / META_FILE, "w") as f:
        json.dump({**meta, FILES_KEY: records}, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    replace_folder(tmp, final)
    return final


def replace_folder(tmp: Path, final: Path) -> None:
    """Put the complete folder ``tmp`` in place as ``final`` (atomic rename; an existing ``final`` is moved
    aside as ``.<name>.old-<pid>`` first and deleted once the new one is in place), then fsync the parent.

    Nothing is left aside: a failed rename puts the old folder back, and a link or file found there is
    removed, never followed."""
    old = None
    if final.exists() or final.is_symlink():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        _remove_entry(old)
        os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        if old is not None:
            os.rename(old, final)
        raise
    _fsync_dir(final.parent)
    if old is not None:
        _remove_entry(old)


def _remove_entry(path: Path) -> None:
    """Remove a folder (best effort: what remains makes the next rename fail loudly), a link or a file."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def disk_error(exc: BaseException, writing: Path) -> BaseException:
    """``exc`` as the error to raise: an ``OSError`` naming the file when a failed write hides one.

    torch.save turns a failed write into "RuntimeError: [enforce fail at inline_container.cc] unexpected
    pos": the OSError (ENOSPC) is only its context. Say the real error, with the file."""
    cause = _os_error(exc)
    if cause is not None and (cause is not exc or cause.filename is None):
        return OSError(cause.errno, cause.strerror, str(writing))
    return exc


def read_checkpoint(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, meta)`` of a single-file folder (``actor.pt`` + ``meta.json``, the format before sharded folders; tensors on the CPU).

    Verifies sizes and checksums first; any fault is a :class:`CheckpointError` naming the folder.
    """
    import torch

    folder = Path(directory)
    meta = verify_checkpoint(folder)
    try:
        state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- verified bytes that torch cannot read: say which file
        raise CheckpointError(folder, f"{STATE_FILE} does not load ({type(exc).__name__}: {exc})") from exc
    return state, meta


def _os_error(exc: BaseException) -> OSError | None:
    """The first OSError with an errno in ``exc``'s chain (itself, its cause or context)."""
    seen: set[int] = set()
    probe: BaseException | None = exc
    while probe is not None and id(probe) not in seen:
        if isinstance(probe, OSError) and probe.errno is not None:
            return probe
        seen.add(id(probe))
        probe = probe.__cause__ or probe.__context__
    return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
