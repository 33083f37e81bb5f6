"""A local run's Ray is the run's alone: a per-run token refuses an unauthenticated attach, its session
folder is private, and nothing of it (processes, folder) outlives the run. Real Ray, real processes."""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.trainer.driver.hosts import ray_env
from asyncrl.trainer.driver.hosts.ray_env import descendants, local_ray

ATTACH = """
import sys, ray
try:
    ray.init(address=sys.argv[1])
except Exception as exc:  # refused: say how
    print("REFUSED", type(exc).__name__, str(exc)[:2000])
    sys.exit(3)

@ray.remote
def whoami():
    import os
    return os.getpid()

print("ATTACHED", ray.get(whoami.remote()))
"""


def _attach(address: str, **env: str) -> "subprocess.Popen[str]":
    """``ray.init(address=...)`` from another process, without this run's token (its own env, plus ``env``);
    started, not awaited (:func:`_outcome`), so that two attempts' retries overlap."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    clean.update(env, RAY_USAGE_STATS_ENABLED="0", HOME=env.get("HOME", clean.get("HOME", "/")))
    # a short connect budget: a refusal is immediate, the retries are Ray's
    clean.setdefault("RAY_gcs_rpc_server_connect_timeout_s", "5")
    return subprocess.Popen([sys.executable, "-c", ATTACH, address], env=clean, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _outcome(proc: "subprocess.Popen[str]") -> tuple[int, str]:
    """The attempt's exit status and output (killed past 180 s: the test then fails on its status)."""
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return proc.returncode, out


@pytest.mark.slow  # two refused attaches, side by side: Ray retries each for a while (about 30 s on 2 shared cores)
def test_an_unauthenticated_attach_to_a_local_run_is_refused(no_shared_ray: None, tmp_path: Path) -> None:
    import ray

    with local_ray(num_cpus=1) as own:
        assert own
        address = ray.get_runtime_context().gcs_address
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        parent = next(p for p in session.parents if p.name.startswith(ray_env.PREFIX))
        # private: nobody but this user can even look inside (Ray's own folders below are 0777)
        assert stat.S_IMODE(parent.stat().st_mode) == 0o700, oct(parent.stat().st_mode)
        # no token (token mode off, as a stranger's plain `ray.init` has it) and a wrong token
        # both at once: each waits out Ray's connection retries
        attempts = [_attach(address, HOME=str(tmp_path)),
                    _attach(address, HOME=str(tmp_path), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)]
        outcomes = [_outcome(a) for a in attempts]
        # the run itself still works with its own token
        assert ray.get(ray.remote(lambda: 41 + 1).remote()) == 42
    for code, out in outcomes:
        assert code == 3 and "ATTACHED" not in out, out[-3000:]
        assert "REFUSED" in out and ("Authentication" in out or "Unauthenticated" in out), out[-3000:]


@pytest.mark.slow  # a Ray start and stop: about 25 s on 2 loaded cores
def test_after_a_local_ray_no_process_of_it_remains_and_its_folder_is_gone(no_shared_ray: None) -> None:
    import ray

    before = descendants()
    with local_ray(num_cpus=1) as own:
        assert own
        # a worker process and the raylet's agents exist now
        assert ray.get(ray.remote(lambda: os.getpid()).remote()) > 0
        session = Path(ray._private.worker._global_node.get_session_dir_path())
        parent = next(p for p in session.parents if p.name.startswith(ray_env.PREFIX))
        during = {pid: t for pid, t in descendants().items() if pid not in before}
        assert len(during) >= 3, during  # gcs_server, raylet, a worker (at least)
    assert ray_env.alive(during) == [], [Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in ray_env.alive(during)]
    assert not parent.exists()
    assert not ray.is_initialized()
    assert os.environ.get("RAY_AUTH_TOKEN") is None  # the run's token left with the run
