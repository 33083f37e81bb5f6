"""What a failed run says about its cause: one line with the original error, never a later one.

A full disk is the case that made this a module: the error (``ENOSPC``) usually strikes in the
actor's process (a checkpoint) and comes back wrapped in a Ray task error; the line names the
errno, the file and the bytes still free on that file system, so the console, the job's status
and the log all carry what an operator needs to act on it.
"""

import errno
import os
import re
import shutil
from pathlib import Path


def original(exc: BaseException) -> BaseException:
    """The exception that started it: Ray's ``RayTaskError.cause`` (the error in the worker), else ``exc``."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Bytes free on the file system holding ``path`` (its nearest existing ancestor); None if unknown."""
    p = Path(path).absolute()
    for candidate in (p, *p.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def describe(exc: BaseException) -> str:
    """``Type: message``; for an OSError also its errno name and number, its path and the bytes free there."""
    cause = original(exc)
    if isinstance(cause, OSError) and cause.errno is not None:
        name = errno.errorcode.get(cause.errno, "?")
        text = f"{type(cause).__name__}: {name} (errno {cause.errno}): {cause.strerror or cause}"
        if cause.filename is not None:
            path = os.fsdecode(cause.filename)
            text += f": {path}"
            free = free_bytes(path)
            if free is not None:
                text += f" ({free} bytes free on its file system)"
        if cause.errno in (errno.ENOSPC, errno.EDQUOT):
            text += "; free space there (or point the run directory / checkpoint.dir elsewhere) and rerun: it resumes"
        return text
    return f"{type(cause).__name__}: {cause}"


def remove_matching(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    """Remove the files and folders directly in ``folder`` whose names match ``pattern`` (what interrupted
    writes left behind: temporaries swept when a run starts); returns them."""
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        if pattern.match(p.name):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed
