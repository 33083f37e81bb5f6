"""bench/gpu_check.sh and bench/gpu_check.py on the CPU: the smoke mode (``--device cpu --tiny``) runs
every stage for real (tiny models, one step) and reports one PASS line each; asking for CUDA on a host
without one fails every stage, each on its own line, and the later stages still run. No timing is
asserted: the machine is shared. The GPU numbers come from running the script on a GPU host."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"
DRIVER = ROOT / "bench" / "gpu_check.py"
STAGES = ["environment", "train-tiny", "actor-tiny", "train-tiny-random", "engine-logp-float32", "engine-logp-bfloat16"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "ASYNCRL_WHEELS")}
    return env | {"OMP_NUM_THREADS": "1", "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""} | extra


def _verdicts(stdout: str) -> dict[str, str]:
    """``{stage: PASS|FAIL}`` from the report lines (``PASS  name   1.2 s  text``)."""
    out = {}
    for line in stdout.splitlines():
        verdict, _, rest = line.partition("  ")
        if verdict in ("PASS", "FAIL"):
            out[rest.split(" s  ")[0].rsplit(None, 1)[0].strip()] = verdict
    return out


@pytest.mark.slow  # 13 s alone: every stage's process imports torch, megatron and transformers (make test's budget)
def test_smoke_mode_passes_every_stage_and_writes_the_report(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--", "--device", "cpu", "--tiny", "--dtypes", "float32,bfloat16"],
        capture_output=True, text=True, env=_env(OUT=str(tmp_path)), timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    verdicts = _verdicts(proc.stdout)
    assert verdicts == dict.fromkeys(["install", *STAGES, "gpu-tests"], "PASS"), proc.stdout
    assert "TOTAL " in proc.stdout and "GPU CHECK DONE in " in proc.stdout
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["failed"] == [] and [s["name"] for s in report["stages"]] == STAGES
    stages = {s["name"]: s["values"] for s in report["stages"]}
    for name in ("train-tiny", "train-tiny-random"):
        v = stages[name]
        assert v["tokens_per_s"] > 0 and v["steps"] == 1 and v["optimizer"] == "MainGradAdamW/AdamW"
        assert v["peak_mem_gib"] is None  # CPU: no CUDA allocator to ask
    # the real actor with megatron's distributed optimizer (the CPU shim), and its checkpoint round trip
    actor = stages["actor-tiny"]
    assert actor["optimizer"] == "MegatronAdam/DistributedOptimizer" and actor["tokens_per_s"] > 0
    assert actor["reload_logp_max_abs_diff"] == 0.0 and actor["next_step_loss_diff"] < 1e-6
    assert actor["next_step_weight_max_abs_diff"] < 1e-6 and actor["version_after_reload"] == actor["steps"]
    # the same weights and tokens on both sides: fp32 agrees to kernel noise, bf16 is visibly looser
    fp32, bf16 = stages["engine-logp-float32"], stages["engine-logp-bfloat16"]
    assert fp32["sampled_tokens"] > 0 and fp32["max_abs_diff"] < 1e-4
    assert fp32["max_abs_diff"] < bf16["max_abs_diff"] < 1.0


@pytest.mark.slow  # 7-16 s on the shared cores: every stage imports torch, megatron and transformers to fail
def test_a_failing_stage_does_not_stop_the_later_ones(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-P", str(DRIVER), "--device", "cuda", "--tiny", "--dtypes", "float32", "--json", str(report_file)],
        capture_output=True, text=True, env=_env(), timeout=120, check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert _verdicts(proc.stdout) == dict.fromkeys(STAGES[:-1], "FAIL"), proc.stdout
    assert "no CUDA device" in proc.stdout
    assert "TOTAL " in proc.stdout and "0 PASS, 5 FAIL" in proc.stdout
    report = json.loads(report_file.read_text())
    assert report["failed"] == STAGES[:-1] and all(s["error"] for s in report["stages"])

