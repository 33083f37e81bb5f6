"""examples/smollm2.yaml for two steps on a local Ray (slow): a real pretrained LLM end to end.

The model is pulled into a temporary cache (``asyncrl models pull smollm2``'s code, once per session:
``smollm2_folder`` in conftest.py) and named by
``spec.model.weights``, as the example does with the user's cache. What reaches the actor must be
SmolLM2's own BPE text (its chat template and tokenizer), sampled with finite log-probs, trained
with a finite loss, and the pretrained model must already answer in the task's tags.
"""

import math
from pathlib import Path

import pytest
import yaml

from asyncrl.api.validation import validate_job
from asyncrl.rollout.tokenizer import HFTokenizer, tokenizer_for
from asyncrl.trainer.driver.loop.training_loop import RunOptions, run_job

pytestmark = [pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smollm2.yaml"


@pytest.fixture(scope="module")
def run(ray_session: None, smollm2_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    folder = smollm2_folder
    doc = yaml.safe_load(EXAMPLE.read_text())
    assert doc["spec"]["model"]["weights"] == "~/.cache/asyncrl/models/smollm2-135m"  # the default cache
    doc["spec"]["model"]["weights"] = str(folder)
    job = validate_job(doc)
    batches = []
    result = run_job(job, RunOptions(run_dir=tmp_path_factory.mktemp("run"), steps=2, port=0),
                     on_batch=lambda groups, version: batches.append([t for g in groups for t in g]))
    return job, result, batches


def test_two_steps_of_the_example_train_on_smollm2_text(run) -> None:
    job, result, batches = run
    assert result.summary.status == "succeeded" and result.summary.totals.final_version == 2
    assert len(result.steps) == 2 and all(math.isfinite(r["loss"]) for r in result.steps)
    tok = tokenizer_for(job.spec.model)
    assert isinstance(tok, HFTokenizer)
    trajs = [t for b in batches for t in b]
    # promptsPerStep 2 x groupSize 8 per step
    assert len(batches) == 2 and all(len(b) == 16 for b in batches)
    for t in trajs:
        prompt = tok.decode(t.tokens[: t.prompt_len])
        assert prompt.startswith("<|im_start|>system\nSolve the arithmetic question") and prompt.endswith(
            "<|im_start|>assistant\n"
        ), prompt
        assert "<|im_start|>user\nQ:3*4=?<|im_end|>\n<|im_start|>assistant\n<ans>12</ans>" in prompt
        sampled = [lp for lp, m in zip(t.logp_mu, t.loss_mask, strict=True) if m]
        assert sampled and all(math.isfinite(lp) and lp <= 0.0 for lp in sampled)
    # the instruct model follows the protocol from its prompt alone (no warm start): it answers in
    # tags (measured: 12 of 12 samples '<ans>N</ans>', 1 of them correct)
    texts = [tok.decode(t.tokens[t.prompt_len :]) for t in trajs]
    assert sum(x.startswith("<ans>") for x in texts) >= len(texts) // 2, texts
