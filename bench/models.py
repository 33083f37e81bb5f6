"""Loading a model folder into the actor against model size, side by side with transformers.

For each size (``tiny``: a 0.3M-parameter random Llama; ``smollm2``: SmolLM2-135M pulled by
``asyncrl models pull smollm2``; ``1b``: a random TinyLlama-1.1B-shaped Llama written straight to bf16
safetensors shards under a temporary folder, never committed), each in a fresh process so the peak
RSS is its own:

- ``actor``: build megatron's ``GPTModel`` (fp32) and stream the folder into it
  (``convert.load_folder``: memory-mapped shards, one tensor at a time), then export it back to an
  HF folder (``trainer/export.py`` ``write_hf_folder``, the export helper's code: the export column);
- ``transformers``: ``AutoModelForCausalLM.from_pretrained(folder, dtype=float32)``, the baseline.

Printed: seconds and peak RSS of each, and the ratios actor / transformers (measured side by side on
the same machine, so load on the cores affects both alike).

    nice -n 10 .venv/bin/python bench/models.py --sizes tiny,smollm2,1b
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TINYLLAMA_1B = {  # TinyLlama-1.1B's shape: 1.10e9 parameters
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu",
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "attention_bias": False, "mlp_bias": False,
}


def _peak_rss() -> int:
    from asyncrl.trainer.megatron.convert import peak_rss_bytes  # VmHWM: a child's own, not its parent's

    return peak_rss_bytes()


def synthetic_folder(out: Path, config: dict[str, Any], shard_bytes: int = 1 << 30) -> Path:
    """A random bf16 checkpoint of ``config`` written tensor by tensor (no model object), sharded, plus
    the tiny BPE tokenizer (enough for an export; its ids are a subset of the vocabulary)."""
    import torch
    from safetensors.torch import save_file

    from asyncrl.api.model_arch import arch_from_hf_config, hf_param_shapes
    from asyncrl.rollout.tiny_models import bpe_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    arch = arch_from_hf_config(config)
    gen = torch.Generator().manual_seed(0)
    shapes = hf_param_shapes(arch, with_tied_head=False)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, shape in shapes.items():
        t = (1.0 + 0.1 * torch.randn(shape, generator=gen)) if name.endswith("norm.weight") else (
            0.02 * torch.randn(shape, generator=gen))
        t = t.to(torch.bfloat16)
        if shards[-1] and size + 2 * t.numel() > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += 2 * t.numel()
    weight_map, total = {}, 0
    for k, chunk in enumerate(shards, start=1):
        fname = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file(chunk, str(out / fname), metadata={"format": "pt"})
        weight_map |= dict.fromkeys(chunk, fname)
        total += sum(2 * t.numel() for t in chunk.values())
    shards.clear()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(config | {"dtype": "bfloat16"}, indent=2))
    bpe_tokenizer().save_pretrained(str(out))
    return out


def measure_actor(folder: str, export_dir: str | None) -> dict[str, Any]:
    import torch

    from asyncrl.api.model_arch import arch_from_hf_config, folder_config
    from asyncrl.trainer.megatron import compat
    from asyncrl.trainer.megatron.convert import load_folder, megatron_to_hf
    from asyncrl.trainer.megatron.model import build_gpt_model

    compat.init_megatron(0, device="cpu")
    arch = arch_from_hf_config(folder_config(folder) or {})
    base = _peak_rss()
    t0 = time.perf_counter()
    gpt = build_gpt_model(arch, random_init=False)  # as the actor builds it for a folder
    build_s = time.perf_counter() - t0
    report = load_folder(gpt, arch, folder)
    out = {"params": sum(p.numel() for p in gpt.parameters()), "build_s": build_s, "load_s": report.seconds,
           "file_bytes": report.file_bytes, "dtypes": list(report.dtypes), "rss_before": base,
           "peak_rss": report.peak_rss_bytes, "export_s": None}
    if export_dir is not None:
        try:
            from asyncrl.rollout.tokenizer import HFTokenizer
            from asyncrl.trainer.export import ModelFiles, write_hf_folder
        except ImportError:  # the export helper's module: the column stays empty without it
            return out
        t0 = time.perf_counter()
        with torch.no_grad():
            hf = megatron_to_hf(gpt.state_dict(), arch)
            files = ModelFiles(arch, HFTokenizer.from_folder(folder), Path(folder), 1.0)
            write_hf_folder(hf, files, Path(export_dir), version=0, dtype="bfloat16")
        out["export_s"] = time.perf_counter() - t0
    return out


def measure_transformers(folder: str) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    AutoModelForCausalLM._model_mapping[type(config)]  # import the modeling module now, outside the timing
    base = _peak_rss()
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    seconds = time.perf_counter() - t0
    return {"params": sum(p.numel() for p in model.parameters()), "load_s": seconds, "rss_before": base,
            "peak_rss": _peak_rss()}


def _child(side: str, folder: str, export_dir: str | None) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", side, folder] + (["--export-dir", export_dir] if export_dir else [])
    env = os.environ | {"OMP_NUM_THREADS": "2", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{side} on {folder} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def folders(sizes: list[str], root: Path, smollm_dir: str | None) -> dict[str, Path]:
    from asyncrl.rollout.tiny_models import make_tiny

    out: dict[str, Path] = {}
    for size in sizes:
        if size == "tiny":
            out[size] = make_tiny("llama", root / "tiny")
        elif size == "smollm2":
            if smollm_dir is None:
                from asyncrl.rollout.models import pull

                smollm_dir = str(pull("smollm2", root=root / "cache").path)
            out[size] = Path(smollm_dir)
        elif size == "1b" and (root / "1b" / "config.json").is_file():
            out[size] = root / "1b"  # --work-dir: made by an earlier run
        elif size == "1b":
            t0 = time.perf_counter()
            out[size] = synthetic_folder(root / "1b", TINYLLAMA_1B)
            print(f"(wrote the synthetic 1.1B bf16 folder in {time.perf_counter() - t0:.0f} s)", flush=True)
        else:
            raise SystemExit(f"unknown size {size!r}; valid: tiny, smollm2, 1b")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="tiny,smollm2,1b", help="comma-separated: tiny, smollm2, 1b")
    p.add_argument("--smollm-dir", help="an already pulled SmolLM2 folder (default: pull into a temp cache)")
    p.add_argument("--no-export", action="store_true", help="skip the export column")
    p.add_argument("--work-dir", help="keep the made folders here and reuse them (default: a temporary folder)")
    p.add_argument("--child", nargs=2, metavar=("SIDE", "FOLDER"), help=argparse.SUPPRESS)
    p.add_argument("--export-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        side, folder = args.child
        result = measure_actor(folder, args.export_dir) if side == "actor" else measure_transformers(folder)
        print(json.dumps(result))
        return
    mib = 2**20
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-models-") as tmp:
        root = Path(args.work_dir) if args.work_dir else Path(tmp)
        rows = []
        for size, folder in folders(args.sizes.split(","), root, args.smollm_dir).items():
            export_dir = None if args.no_export else str(root / f"export-{size}-{os.getpid()}")
            a = _child("actor", str(folder), export_dir)
            if export_dir is not None:
                shutil.rmtree(export_dir, ignore_errors=True)
            h = _child("transformers", str(folder), None)
            rows.append((size, a, h))
            print(f"measured {size}", flush=True)
        print("\nload + convert into the fp32 actor vs transformers.from_pretrained (fp32), fresh process each; "
              "RSS = peak resident set of that process (incl. ~imports), MiB")
        head = (f"{'size':8s} {'params':>9s} {'on disk':>12s} {'actor build s':>13s} {'actor load s':>12s} "
                f"{'HF load s':>9s} {'load ratio':>10s} {'actor RSS':>9s} {'HF RSS':>7s} {'RSS ratio':>9s} "
                f"{'export s':>8s}")
        print(head)
        for size, a, h in rows:
            disk = f"{a['file_bytes'] / mib:.0f}M {'/'.join(a['dtypes'])}"
            actor_s = a["build_s"] + a["load_s"]
            export = "-" if a["export_s"] is None else f"{a['export_s']:.2f}"
            print(f"{size:8s} {a['params'] / 1e6:8.1f}M {disk:>12s} {a['build_s']:13.2f} {a['load_s']:12.2f} "
                  f"{h['load_s']:9.2f} {actor_s / h['load_s']:10.2f} {a['peak_rss'] / mib:9.0f} "
                  f"{h['peak_rss'] / mib:7.0f} {a['peak_rss'] / h['peak_rss']:9.2f} {export:>8s}")
        print("load ratio = (actor build + load) / HF from_pretrained; export = megatron_to_hf + write_hf_folder "
              "(bf16 shards, tokenizer, configs)")


if __name__ == "__main__":
    main()
