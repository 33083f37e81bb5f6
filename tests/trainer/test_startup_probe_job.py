"""A whole local job: the start-up probe before the first step, exports during training, and where both show.

Slow (a local Ray with the real rollout workers and actor, ~30 s per job on 2 shared cores).
"""

import json
from pathlib import Path

import pytest
import torch
import yaml

from asyncrl.api.validation import validate_job
from asyncrl.trainer import export
from asyncrl.trainer.cli import main
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from asyncrl.trainer.driver.status.reporter import StatusReporter

pytestmark = pytest.mark.slow


def _doc(**extra: dict) -> dict:
    spec = {
        "correction": {"reference": "behavior"},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "task": {"name": "calculator", "groupSize": 2, "maxNewTokens": 16},
        "train": {"steps": 3, "promptsPerStep": 2, "warmStartSteps": 0},
        "rollout": {"replicas": 1},
        "monitoring": {"enabled": False},
    }
    for key, value in extra.items():
        spec[key] = {**spec.get(key, {}), **value}
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "probe"}, "spec": spec}


def test_a_job_probes_exports_and_reports_the_final_export(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from asyncrl.rollout.tokenizer import TOKENIZER
    from asyncrl.trainer.actor.megatron_actor import MegatronActor
    from tests.support.megatron_parts import full_logits

    job = validate_job(_doc(checkpoint={"everySteps": 3, "exportEverySteps": 1, "exportKeep": 2}), "job.yaml")
    patches: list[dict] = []
    reporter = StatusReporter(patches.append)  # the first report goes at once, the final one on flush
    result = run_job(job, RunOptions(run_dir=tmp_path / "run", num_cpus=2), on_step=reporter)
    assert reporter.flush()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    probe = summary["startup_check"]
    assert probe["passed"] and [e["engine"] for e in probe["engines"]] == ["rollout-0 (transformers, bfloat16)"]
    assert probe["engines"][0]["cause"] == "dtype" and probe["engines"][0]["tokens"] > 0
    final = tmp_path / "run" / "checkpoints" / "exports" / "step-000003"
    assert summary["export"]["path"] == result.summary.export["path"] == str(final)
    assert [v for v, _ in export.complete_exports(tmp_path / "run" / "checkpoints")] == [2, 3]  # keep 2 of 3
    training = patches[-1]["status"]["training"]
    assert training["lastExport"] == str(final) and training["lastExportVersion"] == 3
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [s.get("export") for s in steps if "version" in s] == [
        str(tmp_path / "run" / "checkpoints" / "exports" / f"step-{v:06d}") for v in (1, 2, 3)]
    # the final export is the policy of the final checkpoint
    actor = MegatronActor.from_spec(job.spec, TOKENIZER.vocab_size,
                                    max_sequence_length=export.model_files(job.spec).arch.max_sequence_length)
    actor.load_checkpoint(str(tmp_path / "run" / "checkpoints" / "step-000003"), old_logits=False)
    tokens = torch.randint(0, TOKENIZER.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    hf = AutoModelForCausalLM.from_pretrained(str(final), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, full_logits(actor._gpt, tokens), rtol=0.0, atol=1e-6)


def test_asyncrl_run_refuses_to_start_with_exit_code_2_and_names_the_cause(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Limits below the bfloat16 engine's noise (~1e-3), above float32 rounding: refused, cause dtype.
    doc = _doc(correction={"startupCheck": {"maxMeanAbsLogRatio": 1e-5, "maxP99AbsLogRatio": 1e-4}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    code = main(["run", str(tmp_path / "job.yaml"), "--run-dir", str(tmp_path / "run"), "--quiet"])
    out = capsys.readouterr().out
    print(out)
    assert code == 2
    assert "the start-up discrepancy probe refused the job" in out and "dtype noise" in out
    assert "REFUSED, looks like dtype" in out  # the console's probe line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and not summary["startup_check"]["passed"]
    assert summary.get("steps_done", 0) == 0 and not (tmp_path / "run" / "checkpoints").exists()
