"""A private, quiet local Ray for one job (docs/architecture.md, local Ray).

- ``address="local"``: never join another cluster on the machine.
- Per-run token auth: Ray's GCS, raylet and workers listen on every interface (Ray's gRPC servers
  bind the wildcard address and Ray offers no setting to bind loopback only: ``GrpcServer::Run`` in
  ray-project/ray ``src/ray/rpc/grpc_server.cc`` chooses ``127.0.0.1`` only for a constructor flag no
  Ray option reaches). So reachable must not mean usable: each run draws a random token
  (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``) that only this process and the workers it starts hold;
  a client without it is refused by the GCS (``Unauthenticated``). The cluster path does the same
  with the job's Secret (:mod:`.cluster`).
- A private session folder: ``asyncrl-ray-XXXX/`` (mode 0700, from ``mkdtemp``) holds Ray's
  ``_temp_dir``; Ray makes its own folders world-writable (``try_make_directory_shared``), but
  nobody else can reach them through the private parent.
- Cleanup: after ``ray.shutdown()`` every process this Ray started (the raylet's agents and workers
  outlive it by up to minutes otherwise) is waited for, then terminated by pid, and the session
  folder is removed; folders that killed runs left (no cleanup ran) are swept when a run starts.
- ``RAY_USAGE_STATS_ENABLED=0`` and ``include_dashboard=False``: no phone-home, ~1 GiB less RAM.
- ``RAY_worker_niceness=0``: the workers (the actor, the rollout workers, the scorers: all of the job's work)
  run at the priority the run was started with. Ray's default starts them at ``nice`` +15 over it, so any
  ordinary process on the machine took nearly all of the CPU from them (CFS weight 36 against 1024): under
  ``stress --cpu 2`` a job test's processes crawled. ``nice -n 10 asyncrl run`` still runs them all at 10.
- Logical ``num_cpus``: the job's processes ask for fractional CPUs, so the budget is a count of
  processes Ray may place, while each process caps its own torch threads (see ``hosts.py``).
"""

import contextlib
import gc
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from asyncrl.api import constants as C

log = logging.getLogger(__name__)

_AUTH_VARS = (C.ENV_RAY_AUTH_MODE, C.ENV_RAY_AUTH_TOKEN, f"{C.ENV_RAY_AUTH_TOKEN}_PATH")
PREFIX = "asyncrl-ray-"


def reload_ray_auth() -> None:
    """Make this process's Ray read the auth mode and token from the environment now.

    Ray reads its config once per process (when ``ray`` is imported): a process whose environment
    gained (or lost) a token later would connect with the old setting. The config is refreshed
    before the token cache is dropped (Ray's own order: a draining gRPC thread reloading the token
    under a stale token mode fails a check).
    """
    import importlib

    raylet: Any = importlib.import_module("ray._raylet")  # compiled: no type information
    raylet.Config.initialize("")
    raylet.AuthenticationTokenLoader.instance().reset_cache()


def _configure_env() -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_worker_niceness", "0")  # the workers at the run's own priority, not 15 below it


@contextlib.contextmanager
def _run_token() -> Iterator[str]:
    """``RAY_AUTH_MODE=token`` with a fresh random token while inside; the previous settings after."""
    saved = {k: os.environ.get(k) for k in _AUTH_VARS}
    token = secrets.token_hex(32)
    os.environ[C.ENV_RAY_AUTH_MODE] = "token"
    os.environ[C.ENV_RAY_AUTH_TOKEN] = token
    os.environ.pop(f"{C.ENV_RAY_AUTH_TOKEN}_PATH", None)
    reload_ray_auth()
    try:
        yield token
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        reload_ray_auth()


# ------------------------------------------------------------------------- processes of this Ray

def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``; None when it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int | None = None) -> dict[int, int]:
    """``{pid: start time}`` of every live process below ``root`` (default: this process). Linux only."""
    root = os.getpid() if root is None else root
    parent: dict[int, tuple[int, int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for name in entries:
        if name.isdigit() and (st := _stat(int(name))) is not None:
            parent[int(name)] = st
    out: dict[int, int] = {}
    for pid, (_, start) in parent.items():
        p, seen = pid, 0
        while p in parent and seen < 64:
            p = parent[p][0]
            seen += 1
            if p == root:
                out[pid] = start
                break
    return out


def alive(procs: Mapping[int, int]) -> list[int]:
    """The pids of ``procs`` still running as the same process (same start time: no reused pid)."""
    return [pid for pid, start in procs.items() if (st := _stat(pid)) is not None and st[1] == start]


def reap(procs: Mapping[int, int], *, grace_s: float = 5.0, term_s: float = 3.0) -> list[int]:
    """Wait ``grace_s`` for ``procs`` to exit, then SIGTERM the rest, then SIGKILL; returns the pids
    that had to be signalled. Only these pids are touched (each checked against its start time)."""
    deadline = time.monotonic() + grace_s
    while (left := alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    signalled = list(left)
    for sig, wait_s in ((signal.SIGTERM, term_s), (signal.SIGKILL, 1.0)):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while (left := alive(procs)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not left:
            break
    return signalled


def sweep_stale_sessions(root: Path | None = None, *, min_age_s: float = 600.0) -> list[Path]:
    """Remove ``asyncrl-ray-*`` folders of this user that a killed run left (SIGKILL, OOM: no cleanup ran):
    older than ``min_age_s`` and named by no live process's command line (Ray's gcs_server and raylet
    name their session folder there). Returns what was removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    now = time.time()
    candidates = []
    for d in root.glob(PREFIX + "*"):
        try:
            st = d.lstat()
        except OSError:
            continue
        if d.is_dir() and not d.is_symlink() and st.st_uid == os.getuid() and now - st.st_mtime > min_age_s:
            candidates.append(d)
    if not candidates:
        return []
    in_use: set[Path] = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        in_use.update(d for d in candidates if str(d).encode() in cmd)
    removed = [d for d in candidates if d not in in_use]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    if removed:
        log.info("removed %d session folder(s) of killed runs: %s", len(removed), ", ".join(map(str, removed)))
    return removed


# ------------------------------------------------------------------------- the local Ray

@contextlib.contextmanager
def local_ray(num_cpus: int, *, quiet: bool = True, resources: Mapping[str, float] | None = None) -> Iterator[bool]:
    """Start a private local Ray (or reuse one already started in this process, e.g. by a test).

    Yields True when this call started Ray (and will shut it down), False when it reused one.
    ``resources``: custom resources of the one node (``asyncrl driver --local``: the role resources).
    """
    import ray

    if ray.is_initialized():
        yield False
        return
    _configure_env()
    sweep_stale_sessions()
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))  # 0700: Ray's shared folders stay private below it
    before = descendants()
    with _run_token():
        try:
            ray.init(
                address="local",
                _temp_dir=str(parent / "r"),  # short: Ray's socket paths must stay under 107 bytes
                include_dashboard=False,
                num_cpus=num_cpus,
                resources=dict(resources) if resources else None,
                logging_level=logging.ERROR if quiet else logging.INFO,
                log_to_driver=not quiet,
                configure_logging=True,
            )
            os.chmod(parent, 0o700)
            yield True
        finally:
            started = {pid: t for pid, t in descendants().items() if pid not in before}
            # Free the run's unreachable Ray handles (object refs, actor handles held in reference cycles) while
            # Ray is still up: a collection that finds them after ray.shutdown() runs their finalizers against a
            # core worker that is gone, and Ray then ends the whole process (exit status 1, nothing printed).
            gc.collect()
            with contextlib.suppress(Exception):  # a Ray that never started has nothing to shut down
                ray.shutdown()
            stragglers = reap(started)
            if stragglers:
                log.info("terminated %d process(es) of this run's Ray that outlived ray.shutdown(): %s",
                         len(stragglers), stragglers)
            shutil.rmtree(parent, ignore_errors=True)
            if parent.exists():
                log.warning("could not remove Ray's session folder %s", parent)
