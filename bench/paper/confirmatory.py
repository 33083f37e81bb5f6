"""The registered confirmatory experiment (docs/results/confirmatory-plan.md) and the reset-rule comparison.

Usage::

    nice -n 5 .venv/bin/python bench/paper/confirmatory.py confirm [--seeds 10 11 ...] [--quick]
    nice -n 5 .venv/bin/python bench/paper/confirmatory.py resets [--seeds 10 11 12] [--lrs 1e-4 3e-4 1e-3]

Both reuse :mod:`external` (``spell_backward``, its shared warm start, :func:`external.run_one`): the same
task, scale and thresholds as the external section, mask ``[0.99, 1.01]``, clip ``[0.997, 1.004]``, W = 3.

``confirm``: the plan's five arms, seeds interleaved (every arm of a seed, then the next seed), one JSON
record per run under ``docs/results/data/confirmatory/``. ``resets``: the EWMA reference (decay auto) under
the three reset rules at three learning rates, records under ``docs/results/data/reset_rules/``. Every record
adds to :func:`external.run_one`'s: the arm, the learning rate the optimizer actually used (from the step
reports, ``ActorOptimizer.learning_rate()``), and the load average before and after (the machine is shared).
A record that exists is not run again, so an interrupted campaign resumes.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/paper

import external  # noqa: E402
import harness  # noqa: E402

DATA = external.DATA
WIDE_MASK = {"mode": "mask", "level": "token", "bounds": {"low": 0.5, "high": 2.0}}
RESET_K = 3
RULES: dict[str, dict[str, Any]] = {
    "paper": {"enabled": True, "rule": "paper", "keepRatioBelow": 0.8, "consecutiveSteps": RESET_K},
    "paperCooldown": {"enabled": True, "rule": "paperCooldown", "keepRatioBelow": 0.8, "consecutiveSteps": RESET_K},
    "recentre": {"enabled": True, "rule": "recentre", "margin": 0.1, "consecutiveSteps": RESET_K},
}


def _corr(reference: str, mask: dict[str, Any] | None = None, ewma: dict[str, Any] | None = None) -> dict[str, Any]:
    return harness.correction(reference, mask=mask or external.PAPER_MASK, clip=external.PAPER_CLIP, ewma=ewma)


# The registered arms (docs/results/confirmatory-plan.md), in the order each seed runs them.
ARMS: tuple[harness.Config, ...] = (
    harness.Config("exact", _corr("exact"), old_logits={"strategy": "snapshot"}),
    harness.Config("current", _corr("current")),
    harness.Config("ewma_reset_off", _corr("ewma", ewma={"reset": {"enabled": False}})),
    harness.Config("ewma_recentre", _corr("ewma", ewma={"reset": RULES["recentre"]})),
    harness.Config("current_wide_mask", _corr("current", mask=WIDE_MASK)),
)
RULE_ARMS: tuple[harness.Config, ...] = tuple(
    harness.Config(f"ewma_{name}", _corr("ewma", ewma={"reset": rule})) for name, rule in RULES.items())
CONFIRM_SEEDS = tuple(range(10, 22))  # 12 seeds never used by the exploratory external runs (0..4)
RESET_SEEDS = (10, 11, 12)
RESET_LRS = (1e-4, 3e-4, 1e-3)


def actor_learning_rates(rec: dict[str, Any]) -> list[float]:
    """The distinct learning rates the optimizer reported over the run's steps."""
    return sorted({float(s["learning_rate"]) for s in rec["steps"] if "learning_rate" in s})


def run(cfg: harness.Config, scale: external.Scale, seed: int, weights: Path, out: Path, path: Path,
        experiment: str) -> None:
    if path.exists():
        return
    # The run folder is named after the configuration and seed only: a scratch folder per experiment and rate,
    # so two commands running at once (confirm and resets share the recentre configuration) never share one.
    rec = external.run_with_retries(cfg, scale, seed, weights, out / experiment / lr_tag(scale.learning_rate))
    if len(rec["steps"]) < scale.steps:  # an interrupted run (SIGINT ends the job early): no record
        raise RuntimeError(f"{cfg.name} seed {seed}: {len(rec['steps'])} of {scale.steps} versions ran; not recorded")
    lrs = actor_learning_rates(rec)
    rec.update({"kind": experiment, "arm": cfg.name, "actor_learning_rate": lrs[0] if len(lrs) == 1 else lrs})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
    curve = rec["eval_curve"]
    resets = sum(int(s.get("ewma_reset", 0)) for s in rec["steps"])
    print(f"{experiment} {cfg.name} lr {scale.learning_rate:g} seed {seed}: held-out "
          f"{curve[0]['success'] if curve else float('nan'):.3f} -> {curve[-1]['success'] if curve else float('nan'):.3f}, "
          f"keep {rec['keep_ratio_mean']:.4f}, resets {resets}, actor lr {rec['actor_learning_rate']} "
          f"({rec['wall_s']:.0f} s, load {rec['load_avg_start'][0]})", flush=True)


def lr_tag(lr: float) -> str:
    return f"{lr:.0e}".replace("-0", "-")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("confirm", "resets"))
    p.add_argument("--quick", action="store_true", help="smoke scale (records under --data, default a scratch folder)")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--lrs", type=float, nargs="+", default=list(RESET_LRS))
    p.add_argument("--arms", nargs="+", default=None)
    p.add_argument("--data", type=Path, default=None)
    p.add_argument("--out", type=Path, default=external.ROOT / "runs" / "paper-external")
    args = p.parse_args(argv)
    base = external.QUICK if args.quick else external.FULL
    data = args.data or (args.out / "quick-data" if args.quick else DATA)
    import torch

    torch.set_num_threads(1)
    out = args.out / ("quick" if args.quick else "full")
    weights = out / f"warm-{external.task_args()['generator']}-{base.warm_start_steps}x{base.warm_batch}"
    print(f"warm start: {external.warm_start(base, weights)}", flush=True)
    from asyncrl.trainer.driver.hosts.ray_env import local_ray

    with local_ray(num_cpus=2):
        if args.what == "confirm":
            arms = [a for a in ARMS if args.arms is None or a.name in args.arms]
            for seed in args.seeds or CONFIRM_SEEDS:
                for cfg in arms:
                    run(cfg, base, seed, weights, out, data / "confirmatory" / f"{cfg.name}-s{seed}.json", "confirmatory")
        else:
            arms = [a for a in RULE_ARMS if args.arms is None or a.name in args.arms]
            for seed in args.seeds or RESET_SEEDS:
                for lr in args.lrs:
                    scale = external.Scale(**{**asdict(base), "learning_rate": lr})
                    for cfg in arms:
                        path = data / "reset_rules" / f"{cfg.name}-lr{lr_tag(lr)}-s{seed}.json"
                        twin = data / "confirmatory" / f"{cfg.name}-s{seed}.json"
                        if cfg.name == "ewma_recentre" and lr == base.learning_rate and twin.exists() and not path.exists():
                            # the confirmatory arm is this very run (same configuration, scale and seed): reused
                            rec = json.loads(twin.read_text())
                            path.parent.mkdir(parents=True, exist_ok=True)
                            path.write_text(json.dumps({**rec, "kind": "reset_rules", "reused_from": twin.name},
                                                       indent=1, sort_keys=True) + "\n")
                        run(cfg, scale, seed, weights, out, path, "reset_rules")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
