"""OCI image layers from folders, and OCI image archives for ``ctr images import`` (standard library only).

A layer is the uncompressed tar of a folder: a base root filesystem, or the upper folder of an overlay mount
after one build step (:mod:`tests.support.dockerfile`). Overlay's whiteouts (character device 0/0 for a
deleted path, the ``trusted.overlay.opaque`` attribute for a replaced folder) become OCI's ``.wh.<name>``
and ``.wh..wh..opq`` entries. The tar is deterministic (sorted names, numeric owners, no access times), so
the same folder always gives the same digest: :func:`layer_digest` hashes it without writing it anywhere,
and :func:`write_archive` streams it a second time straight into the archive, so a multi-GB layer needs no
disk beyond containerd's own copy. A layer the importer already holds (``skip``) is left out of the
archive: containerd finds it by digest in its content store.
"""

import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

BLOCK = 512
# Never part of a layer: mount points a build or a runtime fills, and apt's caches.
BASE_EXCLUDES = ("dev/", "proc/", "sys/", "run/", "var/cache/apt/archives/", "var/lib/apt/lists/")
OPAQUE_XATTR = "trusted.overlay.opaque"


@dataclass(frozen=True)
class Layer:
    """One layer: where its folder is and, once hashed, its digest and size (uncompressed: digest = diff_id)."""

    tree: Path
    digest: str
    size: int
    excludes: tuple[str, ...] = ()


class _Sink(io.RawIOBase):
    """A writer that hashes and counts what passes through it (and forwards it, if given a target)."""

    def __init__(self, target: IO[bytes] | None = None) -> None:
        self.sha = hashlib.sha256()
        self.size = 0
        self.target = target

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.sha.update(data)
        self.size += len(data)
        if self.target is not None:
            self.target.write(data)
        return len(data)


def _excluded(rel: str, is_dir: bool, excludes: tuple[str, ...]) -> bool:
    """``dev/`` excludes what is inside ``dev`` but keeps the folder itself (a mount point)."""
    probe = rel + "/" if is_dir else rel
    return any(probe.startswith(e) and probe != e for e in excludes)


def _entries(root: Path, excludes: tuple[str, ...]) -> Iterator[tuple[tarfile.TarInfo, Path | None]]:
    """Tar entries of ``root`` in a deterministic order, whiteouts translated."""
    seen_inodes: dict[tuple[int, int], str] = {}
    for rel, st in _walk_sorted(root, excludes):
        path = root / rel
        mode = st.st_mode
        if stat.S_ISCHR(mode) and st.st_rdev == 0:  # overlay whiteout: the path was deleted in this step
            parent, _, name = rel.rpartition("/")
            yield _info(f"{parent}/.wh.{name}" if parent else f".wh.{name}", st, tarfile.REGTYPE), None
            continue
        ti = _info(rel, st, tarfile.REGTYPE)
        if stat.S_ISDIR(mode):
            ti.type = tarfile.DIRTYPE
            yield ti, None
            try:
                opaque = os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
            except OSError:
                opaque = False
            if opaque:
                yield _info(f"{rel}/.wh..wh..opq", st, tarfile.REGTYPE), None
        elif stat.S_ISLNK(mode):
            ti.type, ti.linkname = tarfile.SYMTYPE, os.readlink(path)
            yield ti, None
        elif stat.S_ISREG(mode):
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1 and key in seen_inodes:
                ti.type, ti.linkname = tarfile.LNKTYPE, seen_inodes[key]
                yield ti, None
            else:
                seen_inodes[key] = rel
                ti.size = st.st_size
                yield ti, path
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            ti.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
            ti.devmajor, ti.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
            yield ti, None
        elif stat.S_ISFIFO(mode):
            ti.type = tarfile.FIFOTYPE
            yield ti, None
        # sockets are not part of an image


def _walk_sorted(root: Path, excludes: tuple[str, ...]) -> Iterator[tuple[str, os.stat_result]]:
    """Depth-first, names sorted, a folder before its contents (what ``tar --sort=name`` gives)."""
    def visit(rel: str) -> Iterator[tuple[str, os.stat_result]]:
        base = root / rel if rel else root
        for name in sorted(os.listdir(base)):
            path = f"{rel}/{name}" if rel else name
            st = os.lstat(root / path)
            is_dir = stat.S_ISDIR(st.st_mode)
            if _excluded(path, is_dir, excludes):
                continue
            yield path, st
            if is_dir:
                yield from visit(path)
    yield from visit("")


def _info(name: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.mode = stat.S_IMODE(st.st_mode)
    ti.uid, ti.gid = st.st_uid, st.st_gid
    ti.uname = ti.gname = ""
    ti.mtime = int(st.st_mtime)
    ti.size = 0
    return ti


def _write_layer(root: Path, excludes: tuple[str, ...], out: IO[bytes]) -> None:
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for ti, path in _entries(root, excludes):
            if path is None:
                tar.addfile(ti)
            else:
                with open(path, "rb") as f:
                    tar.addfile(ti, f)


def layer_digest(root: Path, excludes: Iterable[str] = ()) -> Layer:
    """Hash the layer of ``root`` without writing it (one pass over the files)."""
    ex = tuple(excludes)
    sink = _Sink()
    _write_layer(root, ex, sink)  # type: ignore[arg-type]
    return Layer(root, "sha256:" + sink.sha.hexdigest(), sink.size, ex)


def _blob_header(digest: str, size: int) -> bytes:
    ti = tarfile.TarInfo("blobs/sha256/" + digest.removeprefix("sha256:"))
    ti.size, ti.mtime, ti.mode = size, 0, 0o644
    return ti.tobuf(tarfile.USTAR_FORMAT)


def _pad(out: IO[bytes], size: int) -> None:
    if size % BLOCK:
        out.write(b"\0" * (BLOCK - size % BLOCK))


def _add_bytes(out: IO[bytes], name: str, data: bytes) -> None:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode = len(data), 0, 0o644
    out.write(ti.tobuf(tarfile.USTAR_FORMAT))
    out.write(data)
    _pad(out, len(data))


def image_config(layers: list[Layer], config: dict[str, Any]) -> bytes:
    """The OCI image config: ``config`` (Env, Cmd, Entrypoint, User, WorkingDir, ExposedPorts) and the diff_ids."""
    return json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [la.digest for la in layers]},
        "history": [{"created_by": "tests/support/oci.py"} for _ in layers],
    }, sort_keys=True).encode()


def _manifest(layers: list[Layer], config: dict[str, Any]) -> tuple[bytes, str, bytes, str]:
    cfg = image_config(layers, config)
    cdig = "sha256:" + hashlib.sha256(cfg).hexdigest()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdig, "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": la.digest, "size": la.size}
                   for la in layers],
    }).encode()
    return cfg, cdig, manifest, "sha256:" + hashlib.sha256(manifest).hexdigest()


def manifest_digest(layers: list[Layer], config: dict[str, Any]) -> str:
    """The digest containerd lists for the image (``ctr images ls``)."""
    return _manifest(layers, config)[3]


def write_archive(out: IO[bytes], ref: str, layers: list[Layer], config: dict[str, Any],
                  skip: frozenset[str] | set[str] = frozenset()) -> None:
    """An OCI image archive of ``layers`` (bottom first) named ``ref`` onto ``out``; digests in ``skip`` are
    referenced but not written (the importer has them)."""
    cfg, cdig, manifest, mdig = _manifest(layers, config)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": mdig, "size": len(manifest),
        "annotations": {"org.opencontainers.image.ref.name": ref, "io.containerd.image.name": ref},
    }]}).encode()
    _add_bytes(out, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    _add_bytes(out, "blobs/sha256/" + cdig[7:], cfg)
    _add_bytes(out, "blobs/sha256/" + mdig[7:], manifest)
    written: set[str] = set()
    for la in layers:
        if la.digest in skip or la.digest in written:
            continue
        written.add(la.digest)
        out.write(_blob_header(la.digest, la.size))
        sink = _Sink(out)
        _write_layer(la.tree, la.excludes, sink)  # type: ignore[arg-type]
        got = "sha256:" + sink.sha.hexdigest()
        if got != la.digest or sink.size != la.size:
            raise RuntimeError(f"layer {la.tree} changed since it was hashed ({la.digest} -> {got}): rebuild it")
        _pad(out, la.size)
    _add_bytes(out, "index.json", index)
    out.write(b"\0" * (2 * BLOCK))
    out.flush()
