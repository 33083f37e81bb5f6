"""GPU readiness in one report: the actor's CUDA path, training speed and memory, the rollout engine on
the device, and how far the actor's log-probs are from the engine's on the same tokens.

Run by ``bench/gpu_check.sh`` on a one-GPU host (see its header for the offline wheel folder); on the CPU
``--device cpu --tiny`` is the smoke mode the tests run (tiny random models, one step each).

Stages (each under its own timeout; a failing stage does not stop the later ones):

- ``environment``: versions of torch, megatron-core, transformers and the device found;
- ``train-<model>`` for SmolLM2-135M (``asyncrl models pull smollm2``; ``--tiny``: a tiny random Llama folder)
  and a ~1.1B random Llama (TinyLlama's shape, a ``transformers.LlamaConfig``; ``--tiny``: hidden 64):
  megatron's ``GPTModel`` through the actor's building blocks (``compat.init_megatron``, ``wrap_ddp``,
  ``make_optimizer``, ``token_logprobs``). On CUDA: bf16 params, fp32 main params, megatron's
  ``DistributedOptimizer``; on the CPU: the shim's fp32 ``MainGradAdamW``. Prints tokens/s (steps after
  the first) and the peak ``torch.cuda.max_memory_allocated``;
- ``actor-<model>`` (``bench/gpu_actor.py``): the real ``MegatronActor.train_step`` on the SmolLM2 folder with
  megatron's ``DistributedOptimizer`` (CUDA: bf16 params, fp32 main params), a few steps, then a checkpoint
  save + load into a fresh actor: trained tokens/s, peak memory, save/load seconds, the reloaded actor's
  max |log-prob diff| (0) and the next step's loss and weight differences;
- ``engine-logp-<dtype>``: the transformers engine (``HFEngine``) on the device samples with log-probs
  from the SmolLM2 weights exported by the actor (``megatron_to_hf``); the actor scores the same tokens
  at the same dtype; max and mean ``|actor logp - engine logp|`` over the sampled tokens.

Output: one line per stage (``PASS``/``FAIL``), the total wall time, and with ``--json`` (default
``$OUT/gpu_check.json`` when ``$OUT`` is set) the same as JSON. Exit status 1 when a stage failed.

    python bench/gpu_check.py                    # a CUDA host
    python bench/gpu_check.py --device cpu --tiny  # the smoke mode
"""

import argparse
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

TINYLLAMA_1B: dict[str, Any] = {  # TinyLlama-1.1B's shape (bench/models.py uses the same), random weights
    "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
    "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
TINY_RANDOM: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
               "tie_word_embeddings": False}
# Worst |actor - engine| log-prob accepted per dtype, (max, mean) over the sampled tokens: the same
# weights and tokens, different kernels (megatron's vs transformers'). fp32: kernel noise only. bf16: both
# bodies round every layer (both upcast logits to fp32 before the softmax), so the limits only catch a
# gross mismatch (wrong weights or positions are nats off on average); the measured values are printed.
LOGP_LIMITS = {"float32": (1e-3, 1e-4), "bfloat16": (2.0, 0.1)}


class StageTimeout(Exception):
    pass


@dataclass
class Stage:
    name: str
    ok: bool = False
    seconds: float = 0.0
    summary: str = ""
    values: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def line(self) -> str:
        verdict = "PASS" if self.ok else "FAIL"
        text = self.summary if self.ok else (self.summary + " " + self.error).strip()
        return f"{verdict}  {self.name:22s} {self.seconds:7.1f} s  {text}"


@contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    """Raise :class:`StageTimeout` in this (main) thread after ``seconds`` (SIGALRM)."""

    def fire(_sig: int, _frame: Any) -> None:
        raise StageTimeout(f"timed out after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_stage(name: str, timeout_s: int, fn: Callable[[], tuple[str, dict[str, Any]]]) -> Stage:
    stage = Stage(name)
    t0 = time.perf_counter()
    try:
        if timeout_s < 5:
            raise StageTimeout("not started: the check's --budget is spent")
        with _deadline(timeout_s):
            stage.summary, stage.values = fn()
        stage.ok = True
    except Exception as exc:  # a failing stage is reported, the next one runs
        stage.error = f"{type(exc).__name__}: {str(exc)[:400]}"
        stage.values["traceback"] = traceback.format_exc()[-3000:]
    stage.seconds = time.perf_counter() - t0
    print(stage.line(), flush=True)
    return stage


@dataclass(frozen=True)
class Options:
    device: str  # "cuda" or "cpu"
    tiny: bool
    steps: int
    work: Path

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def _sync(opts: Options) -> None:
    import torch

    if opts.cuda:
        torch.cuda.synchronize()


def _reset_peak(opts: Options) -> None:
    import gc

    import torch

    gc.collect()  # the previous stage's model, DDP buffers and optimizer state
    if opts.cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(opts: Options) -> float | None:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if opts.cuda else None


def environment(opts: Options) -> tuple[str, dict[str, Any]]:
    import megatron.core
    import torch
    import transformers

    from asyncrl.trainer.megatron import compat

    if opts.cuda and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    runtime = compat.init_megatron(0, device=opts.device)  # type: ignore[arg-type]
    values = {"torch": torch.__version__, "megatron_core": megatron.core.__version__,
              "transformers": transformers.__version__, "python": sys.version.split()[0],
              "device": str(runtime.device), "backend": runtime.backend,
              "gpu": torch.cuda.get_device_name(0) if opts.cuda else None}
    gpu = f", {values['gpu']}" if values["gpu"] else ""
    return (f"torch {values['torch']}, megatron-core {values['megatron_core']}, transformers "
            f"{values['transformers']}, {runtime.device} ({runtime.backend}){gpu}"), values


def smollm_folder(opts: Options) -> Path:
    """SmolLM2-135M converted by ``asyncrl models pull smollm2`` (``--tiny``: a tiny random Llama folder)."""
    if opts.tiny:
        folder = opts.work / "tiny-llama"
        if not (folder / "config.json").is_file():
            from asyncrl.rollout.tiny_models import make_tiny

            make_tiny("llama", folder)
        return folder
    from asyncrl.rollout.models import pull

    return pull("smollm2").path


def _build_actor_model(opts: Options, arch: Any, folder: Path | None) -> Any:
    """megatron's ``GPTModel`` of ``arch`` on the device (fp32), random or loaded from ``folder``."""
    from asyncrl.trainer.megatron import compat
    from asyncrl.trainer.megatron.convert import load_folder
    from asyncrl.trainer.megatron.model import build_gpt_model

    runtime = compat.init_megatron(0, device=opts.device)  # type: ignore[arg-type]
    gpt = build_gpt_model(arch, use_cpu_initialization=runtime.use_cpu_initialization,
                          random_init=folder is None).to(runtime.device)
    if folder is not None:
        load_folder(gpt, arch, str(folder))
    return gpt


def train(opts: Options, arch: Any, folder: Path | None, batch: int, seq: int) -> tuple[str, dict[str, Any]]:
    """``opts.steps`` optimizer steps of a next-token loss on random tokens ``[batch, seq]``."""
    import torch

    from asyncrl.trainer.megatron import compat
    from asyncrl.trainer.megatron.logprobs import token_logprobs
    from asyncrl.trainer.megatron.optimizers import make_optimizer

    _reset_peak(opts)
    gpt = _build_actor_model(opts, arch, folder)
    if opts.cuda:  # the actor's GPU precision: bf16 params, fp32 main params in megatron's optimizer
        gpt.config.bf16, gpt.config.params_dtype = True, torch.bfloat16
        gpt = gpt.to(torch.bfloat16)
    ddp = compat.wrap_ddp(gpt, distributed_optimizer=opts.cuda)
    settings = compat.OptimizerSettings(lr=1e-5, max_grad_norm=1.0, bf16=opts.cuda, distributed_optimizer=opts.cuda)
    optimizer = make_optimizer(ddp, settings)
    params = sum(p.numel() for p in gpt.parameters())
    gen = torch.Generator().manual_seed(0)
    losses, norms, times = [], [], []
    for _ in range(opts.steps):
        tokens = torch.randint(3, arch.vocab_size, (batch, seq), generator=gen).to(next(gpt.parameters()).device)
        _sync(opts)
        t0 = time.perf_counter()
        optimizer.zero_grad()
        logp = token_logprobs(ddp, tokens)  # [B, T], position 0 = 0
        loss = -logp[:, 1:].float().mean()
        loss.backward()
        outcome = optimizer.step()
        _sync(opts)
        times.append(time.perf_counter() - t0)
        losses.append(float(loss.detach()))
        norms.append(outcome.grad_norm)
        if not outcome.stepped:
            raise RuntimeError(f"optimizer step {len(times)} skipped (grad norm {outcome.grad_norm})")
    if not all(math.isfinite(x) for x in losses + norms):
        raise RuntimeError(f"non-finite loss or grad norm: losses {losses}, norms {norms}")
    timed = times[1:] or times  # the first step pays for allocation and kernel selection
    tok_s = batch * seq * len(timed) / sum(timed)
    peak = _peak_gib(opts)
    kind = compat.optimizer_kind(optimizer)
    if opts.cuda and "DistributedOptimizer" not in kind:
        raise RuntimeError(f"asked megatron for its distributed optimizer, got {kind}")
    precision = "bf16 params + fp32 main" if opts.cuda else "fp32"
    values = {"params": params, "batch": batch, "seq": seq, "steps": opts.steps, "losses": losses,
              "grad_norms": norms, "step_seconds": times, "tokens_per_s": tok_s, "peak_mem_gib": peak,
              "optimizer": kind, "precision": precision}
    mem = f"{peak:.2f} GiB" if peak is not None else "n/a (CPU)"
    summary = (f"{params / 1e6:.1f}M params, {precision}, {values['optimizer']}, {opts.steps} steps of "
               f"{batch}x{seq}: loss {losses[0]:.3f} -> {losses[-1]:.3f}, {tok_s:,.0f} tokens/s, peak mem {mem}")
    del optimizer, ddp, gpt
    return summary, values


def train_smollm(opts: Options) -> tuple[str, dict[str, Any]]:
    from asyncrl.api.model_arch import arch_from_hf_config, folder_config

    folder = smollm_folder(opts)
    arch = arch_from_hf_config(folder_config(str(folder)) or {})
    return train(opts, arch, folder, *((2, 16) if opts.tiny else (8, 512)))


def actor_smollm(opts: Options) -> tuple[str, dict[str, Any]]:
    """The real ``MegatronActor.train_step`` with the distributed optimizer and a checkpoint round trip
    (``bench/gpu_actor.py``, beside this file: ``python -P`` leaves the script's folder off ``sys.path``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_actor import actor_roundtrip

    _reset_peak(opts)
    return actor_roundtrip(opts, smollm_folder(opts), _sync, _peak_gib)


def train_random(opts: Options) -> tuple[str, dict[str, Any]]:
    from transformers import LlamaConfig

    from asyncrl.api.model_arch import arch_from_hf_config

    config = LlamaConfig(**(TINY_RANDOM if opts.tiny else TINYLLAMA_1B))
    arch = arch_from_hf_config(config.to_dict())
    return train(opts, arch, None, *((2, 16) if opts.tiny else (4, 512)))


class _NoText:
    """An environment's tokenizer as the engine uses it: only ``decode`` of each sampled token."""

    def decode(self, ids: list[int]) -> str:
        return ""


class _RandomPromptEnv:
    """Random prompt ids; every sampled token continues; episodes end at ``max_new_tokens``."""

    task = "gpu-check"
    truncated_reward = 0.0

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab
        self.tokenizer = _NoText()

    def reset(self, rng: random.Random) -> list[int]:
        return [rng.randrange(3, self.vocab) for _ in range(rng.randint(8, 24))]

    def step(self, turn_text: str) -> Any:
        from asyncrl.rollout.envs.base import CONTINUE

        return CONTINUE

    def info(self) -> dict[str, Any]:
        return {}


def engine_logp(opts: Options, dtype: str) -> tuple[str, dict[str, Any]]:
    """The engine samples from the actor's exported weights; the actor scores the same tokens."""
    import torch

    from asyncrl.api.model_arch import arch_from_hf_config, folder_config
    from asyncrl.rollout.episode import Episode
    from asyncrl.rollout.hf_engine import HFEngine
    from asyncrl.trainer.megatron.convert import megatron_to_hf
    from asyncrl.trainer.megatron.logprobs import token_logprobs

    _reset_peak(opts)
    folder = smollm_folder(opts)
    arch = arch_from_hf_config(folder_config(str(folder)) or {})
    gpt = _build_actor_model(opts, arch, folder).eval()
    with torch.no_grad():
        own = {k: v.detach().to("cpu", torch.float32) for k, v in gpt.state_dict().items()
               if not k.endswith("_extra_state")}  # as MegatronActor.hf_state_dict exports them
        hf = megatron_to_hf(own, arch)
    engine = HFEngine(arch, dtype=dtype, seed=0, device=opts.device)
    engine.load_weights(hf, version=0)
    if dtype == "bfloat16":
        gpt = gpt.to(torch.bfloat16)
    rng = random.Random(0)
    n_eps, new_tokens = (4, 8) if opts.tiny else (16, 64)
    eps = [Episode.start(f"t{i}", "g", _RandomPromptEnv(arch.vocab_size), rng) for i in range(n_eps)]
    _sync(opts)
    t0 = time.perf_counter()
    engine.generate(eps, max_new_tokens=new_tokens, temperature=1.0)
    _sync(opts)
    gen_s = time.perf_counter() - t0
    diffs = []
    with torch.no_grad():
        for t in (e.to_trajectory() for e in eps):
            ids = torch.tensor([t.tokens], device=engine.device)
            actor = token_logprobs(gpt, ids)[0].float().cpu()  # [T]
            sampled = torch.tensor(t.loss_mask)
            diffs.append((actor[sampled] - torch.tensor(t.logp_mu)[sampled]).abs())
    d = torch.cat(diffs)
    if d.numel() == 0:
        raise RuntimeError("the engine sampled no tokens")
    worst, mean = float(d.max()), float(d.mean())
    sampled_n = int(d.numel())
    peak = _peak_gib(opts)
    values = {"dtype": dtype, "episodes": n_eps, "sampled_tokens": sampled_n, "generate_s": gen_s,
              "sampled_tokens_per_s": sampled_n / gen_s, "max_abs_diff": worst, "mean_abs_diff": mean,
              "peak_mem_gib": peak, "engine_device": str(engine.device)}
    limit_max, limit_mean = LOGP_LIMITS[dtype]
    summary = (f"engine on {engine.device} {dtype}: {sampled_n} tokens in {gen_s:.2f} s "
               f"({sampled_n / gen_s:,.0f} tokens/s); |actor - engine| logp max {worst:.2e} mean {mean:.2e} "
               f"(limits {limit_max:g} / {limit_mean:g})")
    engine.release()
    del gpt
    if not (worst <= limit_max and mean <= limit_mean):
        raise RuntimeError(summary)
    return summary, values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny random models (the CPU smoke mode)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per model (default 5; --tiny 1)")
    p.add_argument("--dtypes", default=None, help="engine/actor dtypes compared (default cuda: float32,bfloat16; "
                   "cpu: float32)")
    p.add_argument("--stage-timeout", type=int, default=100, help="most seconds per stage")
    p.add_argument("--budget", type=int, default=300, help="most seconds for all stages (a stage gets what is left)")
    p.add_argument("--json", default=None, help="report file (default $OUT/gpu_check.json when $OUT is set)")
    p.add_argument("--work-dir", default=None, help="folder for made models (default: a temporary one)")
    args = p.parse_args(argv)
    dtypes = (args.dtypes or ("float32,bfloat16" if args.device == "cuda" else "float32")).split(",")
    bad = [d for d in dtypes if d not in LOGP_LIMITS]
    if bad:
        p.error(f"--dtypes {','.join(bad)}: valid dtypes are {', '.join(LOGP_LIMITS)}")
    steps = args.steps if args.steps is not None else (1 if args.tiny else 5)
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="asyncrl-gpu-check-") as tmp:
        opts = Options(args.device, args.tiny, steps, Path(args.work_dir or tmp))
        opts.work.mkdir(parents=True, exist_ok=True)
        print(f"asyncrl GPU check: device {opts.device}{' (tiny smoke mode)' if opts.tiny else ''}, "
              f"{steps} steps per model, at most {args.stage_timeout} s per stage and {args.budget} s in all", flush=True)
        def t() -> int:
            return int(min(args.stage_timeout, args.budget - (time.perf_counter() - t_start)))

        small = "tiny" if opts.tiny else "smollm2"
        stages = [run_stage("environment", t(), lambda: environment(opts))]
        stages.append(run_stage(f"train-{small}", t(), lambda: train_smollm(opts)))
        stages.append(run_stage(f"actor-{small}", t(), lambda: actor_smollm(opts)))
        stages.append(run_stage("train-tiny-random" if opts.tiny else "train-1b-random", t(),
                                lambda: train_random(opts)))
        for dtype in dtypes:
            stages.append(run_stage(f"engine-logp-{dtype}", t(), partial(engine_logp, opts, dtype)))
    total = time.perf_counter() - t_start
    failed = [s.name for s in stages if not s.ok]
    print(f"TOTAL {total:.1f} s: {len(stages) - len(failed)} PASS, {len(failed)} FAIL"
          + (f" ({', '.join(failed)})" if failed else ""), flush=True)
    out = args.json or (os.path.join(os.environ["OUT"], "gpu_check.json") if os.environ.get("OUT") else None)
    if out:
        report = {"device": opts.device, "tiny": opts.tiny, "total_s": total, "failed": failed,
                  "stages": [{"name": s.name, "ok": s.ok, "seconds": s.seconds, "summary": s.summary,
                              "error": s.error, "values": s.values} for s in stages]}
        Path(out).write_text(json.dumps(report, indent=2, default=str))
        print(f"report: {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
