"""Evidence that AsyncRLEwmaResetStorm fires for a lagging reference and stays silent for a healthy one.

Usage::

    PATH=<helm's folder>:$PATH nice -n 5 .venv/bin/python bench/paper/storm_evidence.py [--seed 0]

The machinery of :mod:`alert_evidence` (two real ``asyncrl run`` jobs, each serving ``/metrics``, under a real
Prometheus evaluating the chart's rules as helm renders them with the shipped values), with two other jobs:

- ``healthy``: the EWMA reference, decay auto, the ``recentre`` reset rule, at learning rate 3e-4 (the rate
  where the paper's rule resets every 3 versions without recovering);
- ``lagging``: decay 0.9 with the paper's rule at learning rate 1e-3 (section 2's stress block), a reference
  that a reset to the current weights does not bring back into the mask.

AsyncRLEwmaResetStorm counts ``asyncrl_ewma_reset_outcomes_total{outcome="unrecovered"}`` (at least 2 within
1h): it must fire for ``lagging`` only, while it runs. The record goes to
``docs/results/data/alerts/storm_evidence.json``.
"""

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import alert_evidence as ae  # noqa: E402
import harness as h  # noqa: E402

ALERT = "AsyncRLEwmaResetStorm"
RECORD = h.ROOT / "docs" / "results" / "data" / "alerts" / "storm_evidence.json"
RECENTRE = {"enabled": True, "rule": "recentre", "margin": 0.1, "consecutiveSteps": 3}
PAPER = {**h.reset_rule(True), "rule": "paper"}


def roles() -> dict[str, ae.Role]:
    healthy = h.Config("lr 0.0003: decay auto, recentre", h.correction("ewma", ewma={"reset": RECENTRE}),
                       learning_rate=3e-4)
    lagging = h.Config("lr 0.001: decay 0.9, paper reset", h.correction("ewma", ewma={"decay": 0.9, "reset": PAPER}),
                       learning_rate=1e-3)
    scale = ae.SCALE  # 20 versions: the lagging job resets from version 4, two outcomes are decided by about 10
    return {"healthy": (healthy.name, scale, healthy), "lagging": (lagging.name, scale, lagging)}


def collect(out: Path, *, seed: int = 0, warm_start: Path | None = None, log: Any = print,
            only: list[str] | None = None) -> dict[str, Any]:
    """Both jobs (``only``: a subset, e.g. when the machine has no memory for two Ray clusters at once)."""
    chosen = {k: v for k, v in roles().items() if only is None or k in only}
    return ae.collect(out, seed=seed, warm_start=warm_start, log=log, roles=chosen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/paper/storm"))
    p.add_argument("--warm-start", type=Path, default=h.warm_dir(Path("runs/paper/full"), h.FULL))
    p.add_argument("--only", nargs="+", choices=("healthy", "lagging"), default=None,
                   help="run these jobs only; the record keeps the other job's entry from the committed record")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ev = collect(args.out, seed=args.seed, warm_start=args.warm_start if args.warm_start.exists() else None,
                 only=args.only)
    if args.only and RECORD.exists():  # one job per run: merge with the other job's committed evidence
        old = json.loads(RECORD.read_text())
        ev["jobs"] = {**{k: v for k, v in old["jobs"].items() if k not in ev["jobs"]}, **ev["jobs"]}
        ev["firing"] = [f for f in old["firing"] if f["labels"].get("asyncrljob") not in args.only] + ev["firing"]
        ev["separate_runs"] = sorted(set(old.get("separate_runs", [])) | set(args.only))
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(ev, indent=1, sort_keys=True) + "\n")
    print(json.dumps(ev["firing"], indent=1))
    print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
