"""Run a planned list of cells (by experiment and name) over seeds, skipping recorded ones.

Usage::

    .venv/bin/python bench/paper/suite.py --seeds 0 1 2 3 4 --cells "methods:current" "ewma:decay 0.9, reset"

The cells run interleaved (every cell of the first seed, then of the next), into the committed record
folder at full scale; this is how the records of ``docs/results.md`` were scheduled across parallel
commands (its header says which). ``--records`` writes elsewhere (a regeneration staged beside the committed
records, swapped in once every cell of the document is there).
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cell  # noqa: E402
import harness as h  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cells", nargs="+", required=True, help='"experiment:cell name" (see cell.py --list)')
    p.add_argument("--seeds", type=int, nargs="+", default=list(h.FULL.seeds))
    p.add_argument("--out", type=Path, default=Path("runs/paper"))
    p.add_argument("--records", type=Path, default=h.RECORDS, help="record folder (default: the committed one)")
    args = p.parse_args(argv)
    cfgs = [cell.find(*c.split(":", 1)) for c in args.cells]
    runner = h.Runner(h.FULL, args.records, work=args.out / "full")
    try:
        runner.results(cfgs, args.seeds)
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
