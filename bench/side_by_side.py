"""Source trees of asyncrl measured side by side: the machinery ``bench/step_path.py`` and ``bench/rollout_path.py`` share.

Each version runs in a worker process of its own (its tree on ``PYTHONPATH``, one thread), answering JSON
commands on stdin with ``RESULT``-prefixed JSON lines (libraries may print on stdout too). The parent alternates
the versions' order every round, so a load spike on the shared machine hits every version alike, and reports
each version's paired ratio to the first (the mean of per-round ratios of round medians, with a 95 % t
interval) and, on request, a cProfile diff by function name.
"""

import cProfile
import io
import json
import math
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULT = "@@side_by_side "  # prefix of a worker's reply lines
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 30: 2.04}
Rounds = list[dict[str, list[dict[str, Any]]]]  # per round: {version label: [one measurement per step or call]}


# ------------------------------------------------------------------------------------------ the worker
def serve(measure: Callable[[int], dict[str, Any]], key: str, ready: dict[str, Any]) -> None:
    """A worker's loop: say ``ready``, then answer ``{key: n, "start": i}`` with ``n`` measurements
    (``measure(i)``, ``measure(i + 1)``, ...) and ``{"profile": n, "out": f}`` with a CPU-time cProfile of
    ``n`` of them written to ``f``."""
    print(RESULT + json.dumps(ready), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if "profile" in cmd:
            prof = cProfile.Profile(time.thread_time)  # CPU, not wall: the machine is shared
            prof.enable()
            for i in range(cmd["profile"]):
                measure(cmd.get("start", 0) + i)
            prof.disable()
            prof.dump_stats(cmd["out"])
            print(RESULT + json.dumps({"profiled": cmd["out"]}), flush=True)
        else:
            print(RESULT + json.dumps({key: [measure(cmd["start"] + i) for i in range(cmd[key])]}), flush=True)


# ------------------------------------------------------------------------------------------ the parent
def worker_env(src: str) -> dict[str, str]:
    """A worker's environment: one thread, fixed hashing, ``src`` (a tree's link folder) or the installed asyncrl."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0", PYTHONWARNINGS="ignore")
    if src:
        env["PYTHONPATH"] = src
    else:
        env.pop("PYTHONPATH", None)
    return env


class Worker:
    """One version's worker process: ``script --worker SRC *args`` (``src`` empty: the installed asyncrl)."""

    def __init__(self, label: str, src: str, script: str, args: Sequence[str]) -> None:
        self.label, self.src = label, src
        self.proc = subprocess.Popen(
            [sys.executable, script, "--worker", src or "(installed)", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=worker_env(src), cwd=str(REPO),
        )
        self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return dict(json.loads(line[len(RESULT):]))
        raise RuntimeError(f"worker {self.label} ({self.src}) exited with {self.proc.wait()}")

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait()


def versions_of(specs: Sequence[str]) -> list[tuple[str, str]]:
    """``LABEL=SRC`` arguments as ``(label, absolute src or "")``."""
    return [(lab, os.path.abspath(src) if src else "") for lab, src in (v.split("=", 1) for v in specs)]


def alternate(workers: Sequence[Worker], rounds: int, key: str, per_round: int, headline: str) -> Rounds:
    """``rounds`` rounds of ``per_round`` measurements per version, the order reversed every other round;
    one progress line per round (the mean of ``headline``, in ms)."""
    out: Rounds = []
    for r in range(rounds):
        order = workers if r % 2 == 0 else list(workers)[::-1]
        out.append({w.label: w.ask({key: per_round, "start": r * per_round})[key] for w in order})
        print(f"round {r + 1}/{rounds}: " + ", ".join(
            f"{w.label} {1e3 * statistics.fmean(s[headline] for s in out[-1][w.label]):.0f} ms" for w in workers),
            file=sys.stderr, flush=True)
    return out


def profile(workers: Sequence[Worker], n: int, folder: Path) -> dict[str, str]:
    """Each version's cProfile of ``n`` measurements: ``{label: profile file}``."""
    files = {w.label: str(folder / f"{w.label}.prof") for w in workers}
    for w in workers:
        w.ask({"profile": n, "out": files[w.label], "start": 0})
    return files


# ------------------------------------------------------------------------------------------ the statistics
def ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval."""
    if len(values) < 2:
        return (values[0] if values else math.nan), math.nan
    n = len(values)
    t = T975[max(k for k in T975 if k <= n - 1)]
    return statistics.fmean(values), t * statistics.stdev(values) / math.sqrt(n)


def paired_ratio(rounds: Rounds, base: str, label: str, value: Callable[[dict[str, Any]], float]) -> list[float]:
    """Per round, the median of ``value`` of ``label``'s measurements over that of ``base``'s (a load spike hits
    one round of both; a round whose base median is 0 is left out)."""
    ratios = []
    for r in rounds:
        b = statistics.median(value(s) for s in r[base])
        if b > 0:
            ratios.append(statistics.median(value(s) for s in r[label]) / b)
    return ratios


def short(func: tuple[str, int, str]) -> str:
    """A profile entry's name, the same in every tree: the path from the package root on (a linked tree's
    ``.../asyncrl/rollout/x.py`` and this checkout's ``REPO/rollout/x.py`` alike), or from site-packages."""
    path, _line, name = func
    for mark in ("/asyncrl/", "/site-packages/", str(REPO) + "/"):
        if mark in path:
            path = path.split(mark, 1)[1]
            break
    return f"{path}:{name}"


def profile_diff(labels: list[str], files: dict[str, str], n: int, unit: str, top: int = 30) -> str:
    """Per-``unit`` own and cumulative CPU ms of each function by name, for every version; the ``top`` largest
    differences between the first and the last version, own time first."""
    tables: dict[str, dict[str, tuple[float, float, int]]] = {}
    for lab in labels:
        st = pstats.Stats(files[lab], stream=io.StringIO())
        t: dict[str, tuple[float, float, int]] = {}
        for func, (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            key = short(func)
            old = t.get(key, (0.0, 0.0, 0))
            t[key] = (old[0] + ct, old[1] + tt, old[2] + nc)
        tables[lab] = t
    keys = set().union(*tables.values())
    a, b = labels[0], labels[-1]
    out = []
    for idx, what in ((1, "own (tottime)"), (0, "cumulative")):
        def diff(k: str, idx: int = idx) -> float:
            return abs(tables[b].get(k, (0.0, 0.0, 0))[idx] - tables[a].get(k, (0.0, 0.0, 0))[idx])

        out.append(f"per-{unit} {what} CPU ms, {n} {unit}s; sorted by |{b} - {a}|")
        out.append(f"{'function':<64}" + "".join(f"{lab:>10}{'calls':>8}" for lab in labels))
        for k in sorted(keys, key=diff, reverse=True)[:top]:
            row = f"{k[-64:]:<64}"
            for lab in labels:
                ct, tt, nc = tables[lab].get(k, (0.0, 0.0, 0))
                row += f"{1e3 * (tt if idx else ct) / n:>10.2f}{nc // n:>8}"
            out.append(row)
        out.append("")
    return "\n".join(out)
