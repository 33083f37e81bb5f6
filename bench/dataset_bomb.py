"""Benchmark: peak memory of reading a Parquet *dictionary bomb*, the plain reader against the capped one.

Usage::

    .venv/bin/python bench/dataset_bomb.py [--bombs 1000x200000,5000x200000,20000x200000] [--naive-up-to 1.5e9]

A bomb of ``R x V`` is ``R`` rows whose prompt is one ``V``-byte string, held once in a dictionary page
(``tests/support/hostile_datasets.dictionary_bomb``), written without the Arrow schema that pyarrow stores
(as any other writer would): a file of a few hundred bytes that decodes to ``R * V`` bytes. Each bomb is read, in a fresh process each, by

- ``plain``: what the dataset reader did before the caps, ``pyarrow.parquet.read_table(path).to_pylist()``
  (skipped above ``--naive-up-to`` decoded bytes: it holds the decoded table and its Python copy);
- ``capped``: ``read_rows`` with the spec's defaults (``maxDecodedBytes`` 2 GiB: a bomb under it is read);
- ``capped-256MiB``: ``read_rows`` with ``maxDecodedBytes`` 256 MiB.

Reported: the child's peak resident memory (``ru_maxrss``) above an idle child's (the interpreter, pyarrow
and the reader imported), the seconds the read took, and what came of it (rows, or the refusal).
"""

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(mode: str, path: str) -> dict[str, object]:
    import pyarrow.parquet as pq

    from asyncrl.api.dataset import DatasetFormat
    from asyncrl.api.dataset_file import DatasetError, read_rows
    from asyncrl.api.dataset_limits import MIB, ReadLimits

    start = time.perf_counter()
    outcome = "idle"
    if mode == "plain":
        outcome = f"{len(pq.read_table(path).to_pylist())} rows"
    elif mode.startswith("capped"):
        limits = ReadLimits(decoded_bytes=256 * MIB) if mode == "capped-256MiB" else ReadLimits()
        try:
            outcome = f"{len(read_rows(path, DatasetFormat.PARQUET, limits)[0])} rows"
        except DatasetError as exc:
            outcome = "refused: " + exc.problems[0].split(": ", 1)[1][:60]
    return {"seconds": time.perf_counter() - start,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "outcome": outcome}


def run_child(mode: str, path: Path) -> dict[str, object]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bombs", default="1000x200000,5000x200000,20000x200000")
    ap.add_argument("--naive-up-to", type=float, default=1.5e9, help="largest decoded size the plain reader gets")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return

    sys.path.insert(0, str(ROOT))
    import pyarrow.parquet as pq

    from tests.support.hostile_datasets import dictionary_bomb

    with tempfile.TemporaryDirectory() as tmp:
        idle = run_child("idle", Path(tmp) / "none")["peak_mib"]
        print(f"idle child (interpreter, pyarrow, the reader): {idle:.0f} MiB")
        print(f"{'bomb':>14} {'on disk':>8} {'decoded':>9} | {'reader':<14} {'peak - idle':>11} {'seconds':>8}  outcome")
        for bomb in args.bombs.split(","):
            rows, value = map(int, bomb.split("x"))
            path = Path(tmp) / f"bomb-{bomb}.parquet"
            # no stored Arrow schema: read_table then decodes the dictionary, as for a file from any other writer
            pq.write_table(dictionary_bomb(rows, value), path, compression="zstd", store_schema=False)
            for mode in ("plain", "capped", "capped-256MiB"):
                if mode == "plain" and rows * value > args.naive_up_to:
                    result = {"peak_mib": float("nan"), "seconds": float("nan"), "outcome": "not run (--naive-up-to)"}
                else:
                    result = run_child(mode, path)
                print(f"{bomb:>14} {path.stat().st_size:>8} {rows * value / 1e6:>7.0f}MB | {mode:<14} "
                      f"{result['peak_mib'] - idle:>7.0f} MiB {result['seconds']:>8.2f}  {result['outcome']}")


if __name__ == "__main__":
    main()
