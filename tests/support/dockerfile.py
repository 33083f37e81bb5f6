"""Build an image from one of the project's Dockerfiles here, without a registry and without Docker.

``docker/*.Dockerfile`` are the one recipe of the images; this module executes them, instruction by
instruction, as ``docker build --pull=never`` would: each ``RUN`` in a chroot of the image so far (an
overlay mount over the earlier layers' folders), each ``COPY`` from the build context (``.dockerignore``
honoured), ``ENV``/``ARG`` substitution as Docker does it (``RUN`` text is left to the shell, with the
``ARG`` and ``ENV`` values in its environment). Every ``RUN``/``COPY``/``WORKDIR`` step's upper folder is one
layer, cached under the user's cache folder by a key chained over the base image, every instruction,
the build arguments and the content of what ``COPY`` copies: a code change rebuilds only the steps from
the first ``COPY`` of code on, so the job image's dependency layer (the pins) is built once per machine.

Why not ``buildah bud``: a ``RUN pip install`` inside the image cannot verify the package index here (this
network's TLS proxy CA is in the host's trust store, not in the image's), and buildah offers no build-time
way to hand it the host's bundle without writing it into the image. Here the bundle is mounted at
``/run/build-ca.crt`` for ``RUN`` steps only (``PIP_CERT``), as Docker passes ``HTTP_PROXY`` and friends:
build-time network settings that never reach a layer. An instruction this module does not know fails the
build (``tests/cluster/test_dockerfiles.py`` parses both Dockerfiles), so the Dockerfile cannot say
something this build ignores.
"""

import fnmatch
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.oci import BASE_EXCLUDES, Layer, layer_digest

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "asyncrl" / "cluster" / "images"
SUPPORTED = ("ARG", "FROM", "ENV", "RUN", "COPY", "WORKDIR", "USER", "CMD", "ENTRYPOINT", "EXPOSE", "LABEL")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
# Build-time network settings passed to RUN (never written into a layer), as Docker's predefined ARGs.
PASS_THROUGH = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "PIP_INDEX_URL",
                "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT")


class DockerfileError(ValueError):
    pass


@dataclass(frozen=True)
class Instruction:
    line: int
    keyword: str
    args: str

    def json_args(self) -> list[str] | None:
        """The exec form (``["a", "b"]``) or None for the shell form."""
        text = self.args.strip()
        if text.startswith("["):
            value = json.loads(text)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise DockerfileError(f"line {self.line}: {self.keyword} exec form must be a JSON list of strings")
            return value
        return None


def parse(text: str, source: str = "Dockerfile") -> list[Instruction]:
    """Instructions of a Dockerfile: continuation lines joined, comments dropped, unknown keywords refused."""
    out: list[Instruction] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        if keyword.upper() not in SUPPORTED:
            raise DockerfileError(f"{source}:{start}: {keyword!r} is not supported by tests/support/dockerfile.py "
                                  f"(supported: {', '.join(SUPPORTED)}); teach it the instruction or drop it")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    if buf:
        raise DockerfileError(f"{source}: the last instruction ends with a line continuation")
    return out


_VAR = re.compile(r"\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")


def expand(text: str, env: dict[str, str]) -> str:
    """Docker's substitution: ``$X``, ``${X}``, ``${X:-default}``, ``${X:+word}``."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(4)
        value = env.get(name, "")
        if m.group(2) == "-":
            return value or expand(m.group(3), env)
        if m.group(2) == "+":
            return expand(m.group(3), env) if value else ""
        return value
    return _VAR.sub(one, text)


def _pairs(args: str, env: dict[str, str]) -> dict[str, str]:
    out = {}
    for token in shlex.split(expand(args, env)):
        k, eq, v = token.partition("=")
        if not eq:
            raise DockerfileError(f"expected KEY=VALUE, got {token!r}")
        out[k] = v
    return out


# ---------------------------------------------------------------- the local image store

@dataclass
class Image:
    ref: str
    layers: list[Layer]
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"ref": self.ref, "config": self.config, "layers": [
            {"tree": str(la.tree), "digest": la.digest, "size": la.size, "excludes": list(la.excludes)}
            for la in self.layers]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Image":
        d = json.loads(text)
        return cls(d["ref"], [Layer(Path(la["tree"]), la["digest"], la["size"], tuple(la["excludes"]))
                              for la in d["layers"]], d["config"])


def _ref_file(ref: str, cache: Path) -> Path:
    return cache / "refs" / (re.sub(r"[^A-Za-z0-9._-]", "_", ref) + ".json")


def save(image: Image, cache: Path = CACHE) -> Image:
    path = _ref_file(image.ref, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(image.to_json())
    return image


def load(ref: str, cache: Path = CACHE) -> Image:
    path = _ref_file(ref, cache)
    if not path.is_file():
        raise DockerfileError(f"image {ref!r} is not in the local store {cache} (nothing is pulled): "
                              "build it first (make cluster-images)")
    return Image.from_json(path.read_text())


def image_from_folder(ref: str, tree: Path, config: dict[str, Any], excludes: tuple[str, ...] = BASE_EXCLUDES,
                      cache: Path = CACHE) -> Image:
    """A one-layer image of ``tree`` (a base root filesystem); its digest is cached beside the store."""
    marker = cache / "folders" / (hashlib.sha256(f"{tree}|{excludes}".encode()).hexdigest()[:24] + ".json")
    if marker.is_file():
        d = json.loads(marker.read_text())
        layer = Layer(tree, d["digest"], d["size"], excludes)
    else:
        layer = layer_digest(tree, excludes)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"digest": layer.digest, "size": layer.size}))
    return save(Image(ref, [layer], config), cache)


# ---------------------------------------------------------------- the build

@dataclass
class _State:
    image: Image
    env: dict[str, str]
    args: dict[str, str]
    key: str
    user: str = ""
    workdir: str = "/"


def _dockerignore(context: Path) -> list[str]:
    f = context / ".dockerignore"
    if not f.is_file():
        return []
    return [p.strip().rstrip("/") for p in f.read_text().splitlines() if p.strip() and not p.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.removeprefix("**/"))
               or fnmatch.fnmatch(os.path.basename(rel), p.removeprefix("**/")) for p in patterns)


def _copy_sources(context: Path, sources: list[str], ignore: list[str]) -> list[tuple[Path, str]]:
    """(file, path relative to its COPY source) for every file to copy, sorted."""
    out: list[tuple[Path, str]] = []
    for src in sources:
        path = (context / src).resolve()
        if context.resolve() not in path.parents and path != context.resolve():
            raise DockerfileError(f"COPY source {src!r} is outside the build context {context}")
        if path.is_dir():
            for f in sorted(path.rglob("*")):
                rel = str(f.relative_to(context))
                if f.is_file() and not any(_ignored(p, ignore) for p in _prefixes(rel)):
                    out.append((f, str(f.relative_to(path))))
        elif path.is_file():
            out.append((path, path.name))
        else:
            raise DockerfileError(f"COPY source {src!r} does not exist in {context}")
    return out


def _prefixes(rel: str) -> list[str]:
    parts = rel.split("/")
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


class _Mounts:
    """The overlay of an image's layers plus a new upper folder, with /proc, /dev, /run and DNS for RUN."""

    def __init__(self, layers: list[Layer], step_dir: Path) -> None:
        self.step_dir, self.layers = step_dir, layers
        self.upper, self.work, self.merged = step_dir / "tree", step_dir / "work", step_dir / "merged"
        self.mounted: list[Path] = []
        self.created_resolv = False

    def __enter__(self) -> Path:
        for d in (self.upper, self.work, self.merged):
            d.mkdir(parents=True, exist_ok=True)
        lower = ":".join(str(la.tree) for la in reversed(self.layers))
        self._mount(["-t", "overlay", "overlay", "-o",
                     f"lowerdir={lower},upperdir={self.upper},workdir={self.work}"], self.merged)
        return self.merged

    def for_run(self) -> None:
        m = self.merged
        self._mount(["-t", "proc", "proc"], m / "proc")
        self._mount(["--bind", "/dev"], m / "dev")
        self._mount(["-t", "tmpfs", "tmpfs"], m / "run")
        shutil.copy(HOST_CA, m / "run" / "build-ca.crt")
        resolv = m / "etc" / "resolv.conf"
        if not resolv.exists() and not resolv.is_symlink():
            resolv.touch()
            self.created_resolv = True
        if not resolv.is_symlink():
            self._mount(["--bind", "/etc/resolv.conf"], resolv)

    def _mount(self, args: list[str], target: Path) -> None:
        target.mkdir(parents=True, exist_ok=True) if not target.suffix == ".conf" else None
        subprocess.run(["mount", *args, str(target)], check=True)
        self.mounted.append(target)

    def __exit__(self, *exc: object) -> None:
        for target in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(target)], check=False)
        if self.created_resolv:
            (self.upper / "etc" / "resolv.conf").unlink(missing_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)
        self.merged.rmdir()


def _run_env(state: _State) -> dict[str, str]:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"}
    env.update(state.args)
    env.update(state.env)
    for k in PASS_THROUGH:
        if k in os.environ:
            env[k] = os.environ[k]
    ca = "/run/build-ca.crt"
    env.update({"PIP_CERT": ca, "SSL_CERT_FILE": ca, "REQUESTS_CA_BUNDLE": ca})
    return env


def _chain(key: str, *parts: str) -> str:
    return hashlib.sha256("\0".join((key, *parts)).encode()).hexdigest()[:24]


def build(dockerfile: Path, context: Path, ref: str, build_args: dict[str, str] | None = None,
          cache: Path = CACHE, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr)) -> Image:
    """Execute ``dockerfile`` with ``context`` into the local store as ``ref`` (steps cached by key chain)."""
    instructions = parse(dockerfile.read_text(), str(dockerfile))
    overrides = dict(build_args or {})
    args: dict[str, str] = {}
    state: _State | None = None
    ignore = _dockerignore(context)
    for ins in instructions:
        if ins.keyword == "ARG":
            name, eq, default = ins.args.partition("=")
            value = overrides.get(name, expand(default, {**args, **(state.env if state else {})}) if eq else "")
            if state is None:
                args[name] = value
            else:
                state.args[name] = value
                state.key = _chain(state.key, "ARG", name, value)
            continue
        if ins.keyword == "FROM":
            base = load(expand(ins.args.split()[0], args), cache)
            env = dict(e.split("=", 1) for e in base.config.get("Env", []))
            state = _State(Image(ref, list(base.layers), dict(base.config)), env, {}, _chain(
                "", *(la.digest for la in base.layers), json.dumps(base.config, sort_keys=True)))
            state.user = base.config.get("User", "")
            state.workdir = base.config.get("WorkingDir", "") or "/"
            continue
        if state is None:
            raise DockerfileError(f"{dockerfile}:{ins.line}: {ins.keyword} before FROM")
        _step(state, ins, context, ignore, cache, log)
    if state is None:
        raise DockerfileError(f"{dockerfile}: no FROM")
    state.image.config["Env"] = [f"{k}={v}" for k, v in state.env.items()]
    return save(state.image, cache)


def _step(state: _State, ins: Instruction, context: Path, ignore: list[str], cache: Path,
          log: Callable[[str], None]) -> None:
    cfg = state.image.config
    kw = ins.keyword
    if kw == "ENV":
        state.env.update(_pairs(ins.args, {**state.args, **state.env}))
        state.key = _chain(state.key, "ENV", json.dumps(state.env, sort_keys=True))
        return
    if kw in ("LABEL", "EXPOSE"):
        if kw == "EXPOSE":
            cfg.setdefault("ExposedPorts", {}).update({f"{p}/tcp" if "/" not in p else p: {}
                                                       for p in expand(ins.args, state.env).split()})
        return
    if kw == "USER":
        state.user = cfg["User"] = expand(ins.args, {**state.args, **state.env})
        state.key = _chain(state.key, "USER", state.user)
        return
    if kw in ("CMD", "ENTRYPOINT"):
        form = ins.json_args()
        cfg["Cmd" if kw == "CMD" else "Entrypoint"] = form if form is not None else ["/bin/sh", "-c", ins.args]
        if kw == "ENTRYPOINT":  # as Docker: an ENTRYPOINT drops the base image's CMD (a later CMD sets it again)
            cfg.pop("Cmd", None)
        return
    # the steps that make a layer
    if kw == "WORKDIR":
        path = expand(ins.args, {**state.args, **state.env})
        state.workdir = cfg["WorkingDir"] = path if path.startswith("/") else f"{state.workdir.rstrip('/')}/{path}"
        state.key = _chain(state.key, "WORKDIR", state.workdir)
        _layer(state, cache, log, f"WORKDIR {state.workdir}", lambda m: (m / state.workdir.lstrip("/")).mkdir(
            parents=True, exist_ok=True))
        return
    if kw == "COPY":
        parts = shlex.split(expand(ins.args, {**state.args, **state.env}))
        if any(p.startswith("--") for p in parts):
            raise DockerfileError(f"line {ins.line}: COPY flags are not supported ({ins.args})")
        *sources, dest = parts
        files = _copy_sources(context, sources, ignore)
        digest = hashlib.sha256()
        for f, rel in files:
            digest.update(rel.encode() + b"\0" + oct(f.stat().st_mode & 0o111).encode() + b"\0" + f.read_bytes())
        dest_abs = dest if dest.startswith("/") else f"{state.workdir.rstrip('/')}/{dest}"
        into_dir = dest.endswith("/") or len(sources) > 1 or (context / sources[0]).is_dir()
        state.key = _chain(state.key, "COPY", json.dumps(parts), digest.hexdigest())

        def copy(m: Path) -> None:
            for f, rel in files:
                target = m / dest_abs.lstrip("/") / rel if into_dir else m / dest_abs.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
                os.chown(target, 0, 0)
        _layer(state, cache, log, f"COPY {ins.args}", copy)
        return
    if kw == "RUN":
        env = _run_env(state)
        command = ins.json_args() or ["/bin/sh", "-c", ins.args]
        state.key = _chain(state.key, "RUN", json.dumps(command), json.dumps(
            {k: v for k, v in env.items() if k not in PASS_THROUGH}, sort_keys=True), state.user, state.workdir)

        def run(m: Path) -> None:
            user = ["--userspec", state.user] if state.user else []
            cmd = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "chroot", *user, str(m),
                   "sh", "-c", 'mkdir -p "$0" 2>/dev/null; cd "$0" && exec "$@"', state.workdir, *command]
            subprocess.run(cmd, check=True)
        _layer(state, cache, log, f"RUN {ins.args[:100]}", run, for_run=True)
        return
    raise DockerfileError(f"line {ins.line}: {kw} is not supported")


def _layer(state: _State, cache: Path, log: Callable[[str], None], what: str, action: Callable[[Path], None],
           for_run: bool = False) -> None:
    """Run ``action`` on the overlay of the image so far, keep the upper folder as the step's layer (cached)."""
    step = cache / "steps" / state.key
    done = step / "layer.json"
    if not done.is_file():
        log(f"[build {state.image.ref}] {what}")
        shutil.rmtree(step, ignore_errors=True)
        mounts = _Mounts(state.image.layers, step)
        with mounts as merged:
            if for_run:
                mounts.for_run()
            action(merged)
        if any((step / "tree").iterdir()):
            layer = layer_digest(step / "tree")
            done.write_text(json.dumps({"digest": layer.digest, "size": layer.size}))
        else:
            done.write_text(json.dumps({"digest": "", "size": 0}))
    else:
        log(f"[build {state.image.ref}] cached: {what}")
    d = json.loads(done.read_text())
    if d["digest"]:
        state.image.layers.append(Layer(step / "tree", d["digest"], d["size"]))


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(description="Build an image from a Dockerfile into the local store (no registry).")
    p.add_argument("-f", "--file", required=True, type=Path)
    p.add_argument("-t", "--tag", required=True)
    p.add_argument("--build-arg", action="append", default=[])
    p.add_argument("context", type=Path)
    a = p.parse_args(argv)
    build(a.file, a.context, a.tag, dict(x.split("=", 1) for x in a.build_arg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
