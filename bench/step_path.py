"""CPU seconds of the single-process actor's step path, per stage, for several source trees side by side.

Usage::

    git worktree add --detach ../old-tree <commit>
    mkdir -p ../old-src/asyncrl && touch ../old-src/asyncrl/__init__.py
    for t in api trainer rollout operator; do ln -sfn "$PWD/../old-tree/$t" ../old-src/asyncrl/$t; done
    # ... the same for a frozen copy of HEAD (../new-src), then:
    .venv/bin/python bench/step_path.py --version old=../old-src --version new=../new-src [--rounds 16 --steps 4]

Each ``--version LABEL=SRC`` is a folder holding an ``asyncrl`` package (a worktree's ``api``, ``trainer``,
``rollout`` and ``operator`` linked under ``SRC/asyncrl``); each runs in its own worker process with
``PYTHONPATH=SRC``, so trees whose files moved can be compared (one adapter, :class:`Adapter`, covers the
driver's ``ActorHost`` before and after it moved). The same tree given twice is the A/A control: it shows how
far two processes of identical code part (memory layout, caches), the floor under any ratio. Every worker builds the actor the way the
driver's ``ActorHost`` of its tree does (``examples/quickstart.yaml``: tiny-llama, promptsPerStep 16 x
groupSize 8 = 128 rows, the EWMA reference with its token mask, one torch thread as in a local run) and
trains on the same seeded batches: calculator demonstrations padded as the driver pads them, versions up
to ``async.maxStaleness`` behind, group-normalised advantages, and ``logp_mu`` = the worker's own arrival
log-probs plus seeded noise (sd 0.1 nats, so the ratios sit near 1 as in a run), drawn outside the timing.

Why CPU time and not wall time: the machine is shared; ``time.thread_time`` per stage (exclusive: a stage
nested in another is counted only in the inner one) and ``time.process_time`` per step. The workers run one
at a time, in rounds that alternate their order (A B C, C B A, ...), so load drifting over minutes hits
every version alike; the ratio of each version to the first is taken per round (paired: the ratio of the
two medians of that round) and reported as a mean with a 95 % t interval over the rounds.

Stages: ``forward`` (the gradient forward ``_logprobs``), ``loss`` (``correction_loss``), ``backward``
(``Tensor.backward``, DDP hooks included), ``optimizer`` (zero_grad + step: clip, norm, Adam),
``reference`` (the held reference: the provider's ``theta_prox`` forward and ``logp_ref``), ``ewma_update``
(``observe_update``: the EWMA blend and its reset check), ``other`` (the rest of ``train_step``: plan,
slicing, statistics, the report), ``step`` (the whole ``train_step``), ``batch_in`` (``TrainBatch.from_numpy``)
and ``export`` (the weights for rollout: the old tree's ``hf_state_dict`` as numpy, the new tree's buckets
cast to the wire dtype; Ray's store is left out, one host copy of what it would store stands in).
``--profile N`` instead runs N steps of each version under cProfile (CPU clock) and prints the functions
whose own CPU differs most.

Measured (2026-12-02, 2 cores under a load average of 40-80, one torch thread, [128, 29] batches, 16 rounds of
4 steps): ``train_step`` took 166 ms of CPU at fe603b0 and 165 ms at b4ed9a9 (ratio 0.996 +- 0.022); in a
four-way run fe603b0 / b4ed9a9 / 0333e52 / 0333e52 again: 0.943 +- 0.054, 1.017 +- 0.077 and, for the same
tree in a second process, 0.972 +- 0.069 -- the spread of two processes of one tree is as large as any
difference between the trees. The stages agree (forward, backward and the reference forward within a few
per cent); the export is 0.1-0.2 ms slower with buckets (the wire dtype cast and the pack) and is 0.5 % of
the step. The profile diff shows no function of the step path whose own CPU grew: at one process every
DP/TP reduction, the reference all-gather and the bf16 cast are skipped before any tensor is touched.
The whole quickstart loop, fe603b0 and b4ed9a9 started together (warm starts cached), twice: the actor
process spent 32.2 / 31.9 s and 31.4 / 32.9 s of CPU, the two rollout workers 27.6 / 31.7 s and 27.6 / 32.7 s
(the same 1492 trained tokens a step), the loop's wall 91 / 82 s and 86 / 98 s: on two cores what the
rollout workers spend more is what the actor's wall waits for.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import side_by_side as sbs  # noqa: E402  (the worker processes, alternation and statistics shared with rollout_path)
from side_by_side import ci  # noqa: E402

REPO = sbs.REPO
QUICKSTART = REPO / "examples" / "quickstart.yaml"
STAGES = ("forward", "loss", "backward", "optimizer", "reference", "ewma_update", "other", "step", "batch_in",
          "export")


# ------------------------------------------------------------------------------------------ the worker
class StageClock:
    """Exclusive CPU seconds per stage: a wrapped call's time minus that of the wrapped calls inside it."""

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open call: [start, nested seconds]

    def wrap(self, stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [self.clock(), 0.0]
            self._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = self.clock() - frame[0]
                self.seconds[stage] = self.seconds.get(stage, 0.0) + spent - frame[1]
                if self._stack:
                    self._stack[-1][1] += spent

        return timed

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


class Adapter:
    """One tree's actor behind the calls the bench makes (``ActorHost`` and ``TrainBatch`` moved between the
    trees)."""

    def __init__(self, spec_doc: dict[str, Any], work_dir: str) -> None:
        try:  # the tree after TrainBatch joined the actor
            from asyncrl.trainer.actor.batch import TrainBatch
        except ImportError:  # before: under the megatron primitives
            from asyncrl.trainer.megatron.batch import TrainBatch  # type: ignore[no-redef]
        self.batch = TrainBatch
        try:  # the tree after the driver split
            from asyncrl.trainer.driver.hosts.actor_host import ActorHost
        except ImportError:  # fe603b0: one hosts module
            from asyncrl.trainer.driver.hosts import ActorHost  # type: ignore[no-redef,attr-defined]
        self.host = ActorHost(spec_doc, 1, work_dir)
        self.actor = self.host.actor
        self.bucketed = hasattr(self.host, "weight_handle")
        if self.bucketed:  # the object store's ray.put is left out on both sides
            from asyncrl.trainer.weight_sync import objectstore

            def publish(buckets: Any) -> Any:  # a handle holding one host copy of each bucket instead of refs
                built = list(buckets)
                return objectstore.BucketRefs(built[0].manifest.version, tuple(b.manifest for b in built),
                                              tuple(b.data.cpu().numpy().copy() for b in built))

            objectstore.publish = publish

    def export(self) -> Any:
        """The weights rollout gets, with one host copy of what Ray would store standing in for the store."""
        if self.bucketed:
            return self.host.weight_handle()  # buckets, each copied once (the patched publish)
        return {k: v.copy() for k, v in self.host.weights().items()}  # the returned dict's arrays, copied once


def _instrument(adapter: Adapter, clock: StageClock) -> None:
    import torch

    import asyncrl.trainer.correction as correction

    actor = adapter.actor
    correction.correction_loss = clock.wrap("loss", correction.correction_loss)  # imported at call time
    torch.Tensor.backward = clock.wrap("backward", torch.Tensor.backward)  # type: ignore[method-assign]
    actor._logprobs = clock.wrap("forward", actor._logprobs)
    actor.logprobs_under = clock.wrap("reference", actor.logprobs_under)
    for name in ("step", "zero_grad"):
        setattr(actor._optimizer, name, clock.wrap("optimizer", getattr(actor._optimizer, name)))
    provider = actor.old_logits
    for name in ("score", "logp_ref"):
        setattr(provider, name, clock.wrap("reference", getattr(provider, name)))
    provider.observe_update = clock.wrap("ewma_update", provider.observe_update)


def _batch_arrays(batches: Any, index: int, actor: Any, version: int) -> dict[str, Any]:
    """Batch ``index`` of the shared file at the actor's ``version``, ``logp_mu`` from the actor (untimed)."""
    import numpy as np
    import torch

    tokens = batches["tokens"][index]
    loss_mask = batches["loss_mask"][index]
    rng = np.random.default_rng(1000 + index)
    logp = actor.logprobs(torch.from_numpy(tokens)).cpu().numpy()
    logp_mu = np.where(loss_mask, logp + rng.normal(0.0, 0.1, logp.shape), 0.0).astype(np.float32)
    lag = batches["lag"][index]  # [B] versions behind (0..W)
    versions = np.where(loss_mask, np.maximum(version - lag[:, None], 0), -1).astype(np.int64)
    return {
        "tokens": tokens, "loss_mask": loss_mask, "logp_mu": logp_mu, "versions": versions,
        "advantages": np.where(loss_mask, batches["advantages"][index][:, None], 0.0).astype(np.float32),
        "turn_ids": np.where(loss_mask, 0, -1).astype(np.int64),
    }


def worker(src: str, batches_path: str, warmup: int) -> None:
    """Build the actor, warm up, then serve ``{"steps": n, "start": i}`` / ``{"profile": n, "out": f}``."""
    import numpy as np
    import torch
    import yaml

    spec_doc = yaml.safe_load(QUICKSTART.read_text())["spec"]
    with tempfile.TemporaryDirectory() as work_dir:
        adapter = Adapter(spec_doc, work_dir)
        torch.set_num_threads(1)
        actor, clock = adapter.actor, StageClock()
        data = dict(np.load(batches_path))
        n_batches = data["tokens"].shape[0]

        def one_step(index: int) -> dict[str, float]:
            arrays = _batch_arrays(data, index % n_batches, actor, actor.version)
            clock.take()
            c0, p0 = time.thread_time(), time.process_time()
            tb = adapter.batch.from_numpy(arrays)
            c1 = time.thread_time()
            actor.train_step(tb)
            c2 = time.thread_time()
            adapter.export()
            c3, p3 = time.thread_time(), time.process_time()
            stages = clock.take()
            out = {k: stages.get(k, 0.0) for k in ("forward", "loss", "backward", "optimizer", "reference",
                                                    "ewma_update")}
            out |= {"step": c2 - c1, "batch_in": c1 - c0, "export": c3 - c2, "process": p3 - p0}
            out["other"] = out["step"] - sum(stages.values())
            return out

        _instrument(adapter, clock)
        for i in range(warmup):
            one_step(10_000 + i)
        sbs.serve(one_step, "steps", {"ready": src, "version": actor.version})


def make_batches(out: str, count: int, seed: int) -> None:
    """``count`` quickstart-shaped batches of calculator demonstrations (the tree on PYTHONPATH's tasks)."""
    import random

    import numpy as np
    import yaml

    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.rollout.envs.demos import demonstrations, pad_batch

    spec = AsyncRLJobSpec.model_validate(yaml.safe_load(QUICKSTART.read_text())["spec"])
    try:
        from asyncrl.rollout.envs.binding import task_tokenizer

        tokenizer = task_tokenizer(spec.model, spec.task)
    except ImportError:
        from asyncrl.rollout.tokenizer import tokenizer_for  # type: ignore[attr-defined]

        tokenizer = tokenizer_for(spec.model)
    rows, group = spec.train.prompts_per_step * spec.task.group_size, spec.task.group_size
    rng, nprng = random.Random(seed), np.random.default_rng(seed)
    padded = [pad_batch(demonstrations(spec.task.name, rows, rng, max_tool_calls=spec.task.max_tool_calls,
                                       tokenizer=tokenizer), pad_id=tokenizer.pad_id) for _ in range(count)]
    T = max(b.tokens.shape[1] for b in padded)  # one width for every batch: np arrays of one shape
    tokens = np.full((count, rows, T), tokenizer.pad_id, dtype=np.int64)
    mask = np.zeros((count, rows, T), dtype=bool)
    for i, b in enumerate(padded):
        tokens[i, :, : b.tokens.shape[1]] = b.tokens.numpy()
        mask[i, :, : b.tokens.shape[1]] = b.loss_mask.numpy()
    reward = nprng.random((count, rows // group, group))
    adv = (reward - reward.mean(-1, keepdims=True)) / (reward.std(-1, keepdims=True) + 1e-6)
    lag = nprng.integers(0, spec.async_.max_staleness + 1, (count, rows))
    np.savez(out, tokens=tokens, loss_mask=mask, advantages=adv.reshape(count, rows).astype(np.float32), lag=lag)
    print(f"{count} batches [{rows}, {T}] ({int(mask.sum()) // count} trained tokens each) -> {out}", file=sys.stderr)


# ------------------------------------------------------------------------------------------ the parent
def report(labels: list[str], rounds: list[dict[str, list[dict[str, float]]]]) -> str:
    """CPU ms per step and stage (median over every step) and each version's paired ratio to the first."""
    lines = [f"CPU ms/step (median over every step); ratio to {labels[0]}: mean of the per-round ratios of the "
             f"round medians, +- the 95 % t interval over {len(rounds)} rounds"]
    w = max(10, *(len(lab) + 2 for lab in labels))
    wr = max(22, *(len(lab) + len(labels[0]) + 3 for lab in labels))
    head = f"{'stage':<12}" + "".join(f"{lab:>{w}}" for lab in labels)
    head += "".join(f"{lab + '/' + labels[0]:>{wr}}" for lab in labels[1:])
    lines.append(head)
    for stage in (*STAGES, "process"):
        med = [1e3 * statistics.median(s[stage] for r in rounds for s in r[lab]) for lab in labels]
        row = f"{stage:<12}" + "".join(f"{m:>{w}.1f}" for m in med)
        for lab in labels[1:]:
            ratios = sbs.paired_ratio(rounds, labels[0], lab, lambda s, stage=stage: s[stage])
            mean, half = ci(ratios)
            row += f"{mean:>{wr - 8}.3f} +-{half:>5.3f}" if ratios else f"{'-':>{wr}}"
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="append", default=[], metavar="LABEL=SRC",
                        help="a tree to measure (repeat; the first is the baseline of the ratios; LABEL= with no "
                             "SRC: the asyncrl this interpreter imports)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3, help="steps per version per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=6, help="distinct seeded batches (reused in turn)")
    parser.add_argument("--profile", type=int, default=0, help="N: cProfile N steps per version instead")
    parser.add_argument("--json", help="write every step's figures here")
    parser.add_argument("--from-json", help="print the table of a --json file (no run)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--make-batches", help=argparse.SUPPRESS)
    parser.add_argument("--batches-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.batches_file, args.warmup)
        return
    if args.make_batches:
        make_batches(args.make_batches, args.batches, seed=0)
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
        batches = str(Path(tmp) / "batches.npz")
        subprocess.run([sys.executable, __file__, "--make-batches", batches, "--batches", str(args.batches)],
                       check=True, env=sbs.worker_env(versions[-1][1]), cwd=str(REPO))
        workers = [sbs.Worker(lab, src, __file__, ["--batches-file", batches, "--warmup", str(args.warmup)])
                   for lab, src in versions]
        try:
            if args.profile:
                print(sbs.profile_diff(labels, sbs.profile(workers, args.profile, Path(tmp)), args.profile, "step"))
                return
            rounds = sbs.alternate(workers, args.rounds, "steps", args.steps, "step")
        finally:
            for w in workers:
                w.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"labels": labels, "rounds": rounds}))
    print(report(labels, rounds))


if __name__ == "__main__":
    main()
