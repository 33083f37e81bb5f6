"""Every experiment's ``--quick`` form, in order, in one process: one interpreter start, one import of the
stack and one local Ray for all of them (the experiments run one after another either way).

Usage::

    .venv/bin/python bench/paper/quick.py --out /tmp/paper-quick [methods ewma ...]

This is the smoke test of the experiment scripts (``tests/trainer/test_bench_paper.py`` runs it): each one
runs its cells at the tiny :data:`harness.QUICK` scale in one shared working folder (later experiments reuse
the methods runs, as at full scale), writes its records under ``<out>/quick/records`` and renders its section
and figure. Running each script by itself (``bench/paper/methods.py --quick --out ...``) gives the same
records; this only saves four interpreter starts, four imports of torch, transformers and megatron-core and
four Ray start-ups on a CI machine.
"""

import argparse
import contextlib
import importlib
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

EXPERIMENTS = ("methods", "ewma", "thresholds", "prop1", "system_cost")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="working folder shared by the experiments")
    p.add_argument("experiments", nargs="*", default=list(EXPERIMENTS), choices=EXPERIMENTS,
                   help="which ones, in this order (default: all)")
    args = p.parse_args(argv)
    from asyncrl.trainer.driver.hosts.ray_env import local_ray

    with local_ray(num_cpus=2):  # every experiment's runner and job reuses this one
        for name in args.experiments:
            print(f"== {name} --quick ==", flush=True)
            module = importlib.import_module(name)
            saved = sys.argv
            sys.argv = [f"{name}.py", "--quick", "--out", str(args.out)]
            try:
                with contextlib.redirect_stdout(io.StringIO()) as text:
                    code = module.main()
            finally:
                sys.argv = saved
            print(text.getvalue(), flush=True)
            if code:
                print(f"{name} --quick exited {code}", file=sys.stderr)
                return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
