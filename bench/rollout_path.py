"""CPU seconds of one rollout worker's ``generate`` (the quickstart's task and engine), for several source trees.

Usage (the trees linked as in ``bench/step_path.py``)::

    .venv/bin/python bench/rollout_path.py --version old=../old-src --version new=../new-src --version fixed= \\
        --warm-start runs/<run>/warm_start [--rounds 8 --calls 3 --groups 4]

Each ``--version LABEL=SRC`` runs in its own worker process with ``PYTHONPATH=SRC`` (``LABEL=`` alone: the
``asyncrl`` this interpreter imports). Every worker builds the :class:`RolloutWorker` its tree's driver builds
for rollout worker 0 of ``examples/quickstart.yaml`` (calculator, tiny-llama, bf16 rollout, the task's
temperature and maxNewTokens, ``partialRollout``, one torch thread), loads the same HF weights (``--warm-start``:
a run's cached warm start, exported once as HF arrays by the first version's ``ActorHost``; without it a seeded
random init of the first version's model) and makes the same calls: call ``k`` starts at prompt cursor
``k * groups`` with the engine's sampler reseeded to ``1000 + k``, so every version samples the same prompts
with the same noise. Each call's sampled tokens, ``logp_mu`` and version stamps are hashed: equal digests mean
the versions generated bit-identical trajectories (the fair comparison: the same tokens, the same env steps).

CPU: ``time.thread_time`` of the calling thread and ``time.process_time`` of the whole process (the env runner's
threads, timers, torch's pool), per call and per generated token, split into ``forward`` (the thread CPU inside
the model's ``forward`` calls, timed by a wrapper on the engine's module) and ``rest`` (everything else: the
sampling ops, the token loop, the environments, the episodes' bookkeeping); rounds alternate the order of the versions
(A B C, C B A, ...) and each version's ratio to the first is taken per round (the ratio of the two medians) and
reported as a mean with a 95 % t interval. ``--profile N``: N calls of each version under cProfile (the calling
thread's CPU clock), the functions whose own or cumulative CPU differs most between the first and last version.

Measured (2026-12-02, 2 cores under the background suite's load, the fe603b0 warm start of the quickstart, 20
rounds of 3 calls of 4 groups x 8 = 32 episodes, 423 tokens a call, all five versions' trajectories
bit-identical call for call): CPU ms per call fe603b0 41.0, b4ed9a9 45.0 (1.13 +- 0.08), 3b41e2e 48.1
(1.20 +- 0.09), with the fixes 44.9 and, the same tree in a second process, 44.3 (1.14 +- 0.07, 1.11 +- 0.06).
The model's forward is the same code in every tree (the same config, SDPA, bf16) and its ratios (1.07-1.13)
stay inside the A/A's spread; the rest -- the Python around it -- is what grew: 7.4 ms a call at fe603b0,
10.0 at b4ed9a9 and 10.9 at 3b41e2e (1.41 +- 0.09, 1.49 +- 0.10), 9.7 / 9.5 with the fixes (1.35 +- 0.09,
1.31 +- 0.08): the turn-level environment layer (``TurnAdapter``: the prompt rendered and its messages
checked at every reset, each turn's answer through a future, ``check_turn`` and ``render_observation``),
and, until the fixes, three ``runtime_checkable`` protocol checks per episode (3-6 us each without a
profiler), two property hops in ``Episode.new_tokens`` (asked three times a token), a ``settle`` call per
row per step and a step tensor per decode step even when no row waits for its environment.
"""

import argparse
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as sbs  # noqa: E402  (the worker processes, alternation and statistics shared with step_path)
from side_by_side import ci  # noqa: E402

REPO = sbs.REPO
QUICKSTART = REPO / "examples" / "quickstart.yaml"


# ------------------------------------------------------------------------------------------ the worker
def export_weights(out: str, warm_start: str | None) -> None:
    """The HF weights every version loads, as one ``.npz`` (this tree's ``ActorHost`` or its model init)."""
    import numpy as np
    import yaml

    spec_doc = yaml.safe_load(QUICKSTART.read_text())["spec"]
    if warm_start:
        try:
            from asyncrl.trainer.driver.hosts.actor_host import ActorHost
        except ImportError:  # fe603b0: one hosts module
            from asyncrl.trainer.driver.hosts import ActorHost  # type: ignore[no-redef,attr-defined]
        with tempfile.TemporaryDirectory() as work_dir:
            host = ActorHost(spec_doc, 1, work_dir)
            if not host.load_warm_start(warm_start):
                raise SystemExit(f"no warm start in {warm_start}")
            weights = host.weights()
    else:
        import torch

        from asyncrl.rollout.hf_model import build_model

        worker = _build(spec_doc)
        model = build_model(worker.arch, torch.float32, seed=1234)
        weights = {k: v.float().numpy() for k, v in model.state_dict().items()}
    np.savez(out, **{k: np.asarray(v, dtype=np.float32) for k, v in weights.items()})


def _build(spec_doc: dict[str, Any]) -> Any:
    """Rollout worker 0 as this tree's ``RolloutHost`` builds it (``workers=`` only where it exists)."""
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.rollout.worker import RolloutWorker

    spec = AsyncRLJobSpec.model_validate(spec_doc)
    kwargs: dict[str, Any] = {"worker_index": 0, "seed": spec.train.seed, "rollout": spec.rollout}
    if "workers" in inspect.signature(RolloutWorker).parameters:
        kwargs["workers"] = spec.rollout.replicas
    return RolloutWorker(spec.task, spec.model, spec.async_, **kwargs)


def worker(src: str, weights_path: str, groups: int, warmup: int) -> None:
    """Build the worker, load the weights, then serve ``{"calls": n, "start": k}`` / ``{"profile": n, ...}``."""
    import numpy as np
    import torch
    import yaml

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    w = _build(yaml.safe_load(QUICKSTART.read_text())["spec"])
    w.load_weights({k: torch.from_numpy(v) for k, v in np.load(weights_path).items()}, 0)
    spent = [0.0]  # the model's forward calls' thread CPU (the rest of a call is the Python around them)
    model = w.engine._model  # both trees' HFEngine: the module its loop calls
    forward = model.forward

    def timed_forward(*a: Any, **kw: Any) -> Any:
        t0 = time.thread_time()
        try:
            return forward(*a, **kw)
        finally:
            spent[0] += time.thread_time() - t0

    model.forward = timed_forward

    def one_call(k: int) -> dict[str, Any]:
        w.set_prompt_cursor(k * groups)
        w.engine._sampler.manual_seed(1000 + k)  # the same noise in every version (both trees' HFEngine)
        spent[0] = 0.0
        c0, p0 = time.thread_time(), time.process_time()
        trajs = w.generate(groups)
        c1, p1 = time.thread_time(), time.process_time()
        fwd = spent[0]
        digest = hashlib.sha256()
        tokens = sampled = 0
        for t in sorted(trajs, key=lambda t: t.traj_id):
            digest.update(repr((t.traj_id, t.tokens, t.loss_mask, t.versions, t.logp_mu, t.status.value,
                                t.reward)).encode())
            tokens += len(t.tokens) - t.prompt_len
            sampled += sum(t.loss_mask)
        return {"thread": c1 - c0, "process": p1 - p0, "forward": fwd, "rest": c1 - c0 - fwd, "tokens": tokens, "sampled": sampled,
                "digest": digest.hexdigest()[:12], "n": len(trajs)}

    for i in range(warmup):
        one_call(10_000 + i)
    sbs.serve(one_call, "calls", {"ready": src})


# ------------------------------------------------------------------------------------------ the parent
def report(labels: list[str], rounds: list[dict[str, list[dict[str, Any]]]]) -> str:
    """CPU ms per call and us per generated token (medians over every call), paired ratios to the first."""
    lines = [f"CPU per generate call (median over every call); ratio to {labels[0]}: mean of the per-round ratios "
             f"of the round medians, +- the 95 % t interval over {len(rounds)} rounds"]
    w, wr = max(12, *(len(lab) + 2 for lab in labels)), 24
    lines.append(f"{'figure':<22}" + "".join(f"{lab:>{w}}" for lab in labels)
                 + "".join(f"{lab + '/' + labels[0]:>{wr}}" for lab in labels[1:]))

    def per(s: dict[str, Any], key: str, unit: str) -> float:
        if unit == "tok":
            return s[key] / max(1, s["tokens"])
        return float(s[key])

    figures = (("thread", "call", 1e3, "thread ms/call"), ("process", "call", 1e3, "process ms/call"),
               ("forward", "call", 1e3, "  forward ms/call"), ("rest", "call", 1e3, "  rest ms/call"),
               ("thread", "tok", 1e6, "thread us/token"), ("process", "tok", 1e6, "process us/token"),
               ("rest", "tok", 1e6, "  rest us/token"))
    for key, unit, scale, name in figures:
        med = [scale * statistics.median(per(s, key, unit) for r in rounds for s in r[lab]) for lab in labels]
        row = f"{name:<22}" + "".join(f"{m:>{w}.2f}" for m in med)
        for lab in labels[1:]:
            ratios = sbs.paired_ratio(rounds, labels[0], lab, lambda s, key=key, unit=unit: per(s, key, unit))
            mean, half = ci(ratios)
            row += f"{mean:>{wr - 8}.3f} +-{half:>5.3f}"
        lines.append(row)
    for key in ("tokens", "sampled", "n"):
        lines.append(f"{key + '/call':<22}" + "".join(
            f"{statistics.fmean(s[key] for r in rounds for s in r[lab]):>{w}.1f}" for lab in labels))
    digests = {lab: [s["digest"] for r in rounds for s in r[lab]] for lab in labels}
    for lab in labels[1:]:
        same = sum(a == b for a, b in zip(digests[labels[0]], digests[lab], strict=True))
        lines.append(f"trajectories identical to {labels[0]} ({lab}): {same}/{len(digests[lab])} calls")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="append", default=[], metavar="LABEL=SRC")
    parser.add_argument("--warm-start", help="a run's warm_start folder (the first version's ActorHost exports it)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=3, help="generate calls per version per round")
    parser.add_argument("--groups", type=int, default=4, help="GRPO groups per generate call")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--profile", type=int, default=0, help="N: cProfile N calls per version instead")
    parser.add_argument("--json", help="write every call's figures here")
    parser.add_argument("--from-json", help="print the table of a --json file (no run)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--weights-file", help=argparse.SUPPRESS)
    parser.add_argument("--export", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.weights_file, args.groups, args.warmup)
        return
    if args.export:
        export_weights(args.export, args.warm_start)
        return
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        print(report(saved["labels"], saved["rounds"]))
        return
    versions = sbs.versions_of(args.version)
    if len(versions) < 2:
        parser.error("give at least two --version LABEL=SRC")
    labels = [lab for lab, _ in versions]
    with tempfile.TemporaryDirectory() as tmp:
        weights = str(Path(tmp) / "weights.npz")
        cmd = [sys.executable, __file__, "--export", weights]
        if args.warm_start:
            cmd += ["--warm-start", os.path.abspath(args.warm_start)]
        subprocess.run(cmd, check=True, env=sbs.worker_env(versions[0][1]), cwd=str(REPO))
        workers = [sbs.Worker(lab, src, __file__, ["--weights-file", weights, "--groups", str(args.groups),
                                                   "--warmup", str(args.warmup)]) for lab, src in versions]
        try:
            if args.profile:
                print(sbs.profile_diff(labels, sbs.profile(workers, args.profile, Path(tmp)), args.profile, "call"))
                return
            rounds = sbs.alternate(workers, args.rounds, "calls", args.calls, "process")
        finally:
            for w in workers:
                w.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"labels": labels, "rounds": rounds}))
    print(report(labels, rounds))


if __name__ == "__main__":
    main()
