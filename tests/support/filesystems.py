"""A small real file system for full-disk tests: a tmpfs mounted for one test, unmounted after.

Mounting needs CAP_SYS_ADMIN (root in CI's container). A loop-mounted ext4 image is the fallback
(``mkfs.ext4`` + ``mount -o loop``); where neither can be mounted the test is skipped with the
reason, since no other mechanism gives a real ``ENOSPC``.
"""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(cmd: list[str]) -> str | None:
    out = subprocess.run(cmd, capture_output=True, text=True)
    return None if out.returncode == 0 else (out.stderr.strip() or f"exit {out.returncode}")


@contextlib.contextmanager
def small_filesystem(where: Path, size_mib: int) -> Iterator[Path]:
    """A fresh file system of ``size_mib`` MiB mounted at ``where`` (created), removed afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    why = _mount(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(where)])
    image = where.with_name(where.name + ".img")
    if why is not None and shutil.which("mkfs.ext4"):
        with open(image, "wb") as f:
            f.truncate(size_mib << 20)
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
        why_loop = _mount(["mount", "-o", "loop", str(image), str(where)]) if made.returncode == 0 else made.stderr
        why = None if why_loop is None else f"{why}; loop-mounted ext4: {why_loop}"
    if why is not None:
        image.unlink(missing_ok=True)
        # a fail, not a skip: CI runs as root, where this mounts; a skip would hide the disk-full tests
        pytest.fail(f"cannot mount a small file system for a real ENOSPC here (run the tests as root, or with "
                    f"CAP_SYS_ADMIN): {why}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        image.unlink(missing_ok=True)


def fill(fs: Path, leave_bytes: int) -> Path:
    """Write a filler file so that about ``leave_bytes`` stay free on ``fs``; returns it (delete to free)."""
    filler = fs / "filler.bin"
    free = shutil.disk_usage(fs).free
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * (1 << 20)
        left = max(0, free - leave_bytes)
        while left > 0:
            n = f.write(chunk[: min(len(chunk), left)])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return filler
