"""A two-step ``asyncrl run`` from a tiny random folder (slow): local Ray, the megatron actor loaded from the
folder, the transformers engine building the folder's own family, the folder's tokenizer and chat template.
Float32 rollout with exact old logits, so r_d = pi_old / mu_old is 1 up to kernel rounding: any mapping
mistake between actor and engine shows as r_d far from 1.

Every family's mapping is tested in-process (tests/trainer/test_convert_families.py: the actor's logits equal
transformers', the engine's logp_mu equals the actor's log-probs, the MoE router picks the same experts, the
weights round-trip); a whole job adds the job's path from a weights folder, which two families cover: a dense
one loaded from one file (llama) and the MoE one loaded from shards (qwen3_moe). The other three ran the
same path."""

from pathlib import Path

import pytest

from asyncrl.api.model_arch import FAMILIES, Family
from asyncrl.api.validation import validate_job
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job
from tests.support.hf_models import SHARDED, tiny_folder

pytestmark = [pytest.mark.slow]

RD_TOLERANCE = 1e-4


def _job(family: Family, folder: Path) -> dict:
    return {
        "apiVersion": "asyncrl.io/v1alpha1",
        "kind": "AsyncRLJob",
        "metadata": {"name": f"tiny-{family.replace('_', '-')}"},
        "spec": {
            "correction": {"reference": "exact"},
            "oldLogits": {"strategy": "snapshot"},
            "async": {"maxStaleness": 1},
            "model": {"weights": str(folder), "rolloutDtype": "float32"},
            "task": {"name": "arithmetic", "groupSize": 2, "maxNewTokens": 8},
            "train": {"steps": 2, "promptsPerStep": 2, "warmStartSteps": 0},
            "rollout": {"replicas": 1, "engine": "transformers"},
            "monitoring": {"enabled": False},
        },
    }


JOB_FAMILIES: tuple[Family, ...] = ("llama", "qwen3_moe")


def test_the_job_families_cover_a_single_file_and_a_sharded_folder() -> None:
    assert set(JOB_FAMILIES) <= set(FAMILIES)
    assert {f in SHARDED for f in JOB_FAMILIES} == {True, False}


@pytest.mark.parametrize("family", JOB_FAMILIES)
def test_two_steps_per_family_report_rd_of_one(ray_session: None, family: Family, tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path / "models", family)
    job = validate_job(_job(family, folder))
    result = run_job(job, RunOptions(run_dir=tmp_path / "run", steps=2))
    assert result.summary.status == "succeeded", result.summary
    load = result.summary.model_load
    assert load["architecture"] == FAMILIES[family].architecture
    assert load["folder"] == str(folder) and load["seconds"] > 0 and load["peak_rss_bytes"] > 0
    assert len(result.steps) == 2
    for r in result.steps:
        assert r["reference"] == "exact"
        print(f"{family}: rd_min {r['rd_min']:.8f} rd_max {r['rd_max']:.8f}")
        assert abs(r["rd_min"] - 1.0) < RD_TOLERANCE and abs(r["rd_max"] - 1.0) < RD_TOLERANCE, (family, r)
