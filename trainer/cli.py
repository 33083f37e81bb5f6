"""The ``asyncrl`` command line: validate, crd, thresholds (and run, once the loop exists).

Imports stay inside the commands so that ``asyncrl validate`` never loads torch.
"""

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_validate(args: argparse.Namespace) -> int:
    from asyncrl.api.validation import SpecError, load_jobs

    failed = 0
    for path in args.files:
        try:
            jobs = load_jobs(path)
        except FileNotFoundError:
            print(f"{path}: no such file", file=sys.stderr)
            failed += 1
            continue
        except SpecError as exc:
            for problem in exc.problems:
                print(f"{path}: {problem}", file=sys.stderr)
            failed += 1
            continue
        for job in jobs:
            print(f"{path}: AsyncRLJob {job.metadata.name} is valid")
    return 1 if failed else 0


def _cmd_crd(args: argparse.Namespace) -> int:
    from asyncrl.api.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def _cmd_thresholds(args: argparse.Namespace) -> int:
    from asyncrl.trainer.thresholds import behaviour_weight, effective_bounds

    try:
        bounds = effective_bounds(tuple(args.mask), tuple(args.clip), args.gap, args.interp)
    except ValueError as exc:
        print(f"asyncrl thresholds: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(bounds.as_json()))
        return 0
    alpha = behaviour_weight(args.gap)
    print(f"{args.interp} interpolation, version gap {args.gap}: behaviour weight alpha = 1/(n+1) = {alpha:.6g}")
    print("effective bounds on the total ratio r = pi_theta / mu_old:")
    print(f"  mask  r_d in [{args.mask[0]:g}, {args.mask[1]:g}]  ->  r in [{bounds.mask[0]:.6g}, {bounds.mask[1]:.6g}]")
    print(f"  clip  r_s in [{args.clip[0]:g}, {args.clip[1]:g}]  ->  r in [{bounds.clip[0]:.6g}, {bounds.clip[1]:.6g}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl", description="Asynchronous RL for LLM agents with decoupled off-policy correction."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check AsyncRLJob YAML files (the files kubectl apply takes)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("crd", help="print the AsyncRLJob CustomResourceDefinition")
    p.set_defaults(func=_cmd_crd)

    p = sub.add_parser(
        "thresholds",
        help="effective bounds on pi_theta/mu_old induced by an interpolated reference (paper Prop. 1)",
    )
    p.add_argument("--mask", nargs=2, type=float, required=True, metavar=("LO", "HI"),
                   help="keep interval of the discrepancy ratio r_d, e.g. 0.99 1.01")
    p.add_argument("--clip", nargs=2, type=float, required=True, metavar=("LO", "HI"),
                   help="clip interval of the staleness ratio r_s, e.g. 0.997 1.004")
    p.add_argument("--gap", type=int, required=True, metavar="N", help="version gap n >= 0 of the token")
    p.add_argument("--interp", choices=("linear", "loglinear"), required=True)
    p.add_argument("--json", action="store_true", help='print {"mask": [lo, hi], "clip": [lo, hi]} only')
    p.set_defaults(func=_cmd_thresholds)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
