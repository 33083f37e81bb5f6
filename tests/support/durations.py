"""Print a suite's budget from its recorded durations (``ASYNCRL_DURATIONS=<file> pytest ...``).

    python tests/support/durations.py tests/durations/test.json            # the slowest 30 and the total
    python tests/support/durations.py before.json after.json --top 30      # side by side
    python tests/support/durations.py tests/durations/*.json --by-file     # seconds per test file

The committed records in ``tests/durations/`` are the measured budget of ``make test``, ``make test-slow``
and ``make test-vllm`` (CONTRIBUTING.md says when to refresh them).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> dict[str, float]:
    record = json.loads(path.read_text())
    return {k: float(v) for k, v in record["durations"].items()}


def by_file(durations: dict[str, float]) -> dict[str, float]:
    files: dict[str, float] = defaultdict(float)
    for nodeid, seconds in durations.items():
        files[nodeid.split("::", 1)[0]] += seconds
    return dict(files)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("records", nargs="+", type=Path)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--by-file", action="store_true", help="sum the seconds of each test file")
    args = ap.parse_args(argv)
    runs = [load(p) for p in args.records]
    if args.by_file:
        runs = [by_file(r) for r in runs]
    names = sorted(set().union(*runs), key=lambda n: -max(r.get(n, 0.0) for r in runs))[: args.top]
    width = max((len(n) for n in names), default=10)
    print(f"{'test':<{width}}  " + "  ".join(f"{p.stem:>10}" for p in args.records))
    for n in names:
        print(f"{n:<{width}}  " + "  ".join(f"{r[n]:10.1f}" if n in r else f"{'-':>10}" for r in runs))
    print(f"{'total (' + str(len(runs[0])) + ' rows)':<{width}}  " + "  ".join(f"{sum(r.values()):10.1f}" for r in runs))


if __name__ == "__main__":
    main()
