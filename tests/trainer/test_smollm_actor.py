"""SmolLM2-135M pulled into the cache, loaded by the Megatron actor through the converter (slow).

`asyncrl models pull smollm2` writes an HF folder (safetensors + config + tokenizer); the actor
loads it via ``spec.model.weights`` (``load_hf`` -> ``hf_to_megatron``) and must reproduce
transformers' own fp32 logits of that folder on a real task prompt.
"""

import json
import random
from pathlib import Path

import pytest
import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.validation import validate_job
from asyncrl.rollout.envs.registry import get_task
from asyncrl.rollout.models import MARKER, pull
from asyncrl.rollout.smollm import smollm2_arch
from asyncrl.rollout.tokenizer import HFTokenizer, tokenizer_for
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.convert import hf_to_megatron, load_hf
from asyncrl.trainer.megatron.model import build_gpt_model
from tests.support.megatron_parts import full_logits

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def folder(smollm2_folder: Path) -> Path:
    torch.set_num_threads(2)
    return smollm2_folder


def test_pull_writes_an_hf_folder_once(folder: Path) -> None:
    marker = json.loads((folder / MARKER).read_text())
    assert set(marker["files"]) >= {"model.safetensors", "config.json", "tokenizer.json"}
    again = pull("smollm2", root=folder.parent)
    assert (again.path, again.converted) == (folder, False)  # the marker matches: nothing redone
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_actor_reproduces_transformers_logits(folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    tok = tokenizer_for(ModelSpec(preset="smollm2-135m", weights=str(folder)))
    assert isinstance(tok, HFTokenizer) and tok.vocab_size == 49152 and tok.eos_token == "<|im_end|>"
    env = get_task("calculator").make_env(tokenizer=tok)
    prompt = env.reset(random.Random(0))
    assert env.problem is not None
    answer = tok.encode(f"<calc>{env.problem.question}</calc><res>{env.problem.answer}</res>")
    tokens = torch.tensor([prompt + answer, (prompt + answer)[::-1]])  # [2, T]: a real and a shuffled row

    hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        logits = hf.eval()(tokens).logits  # [2, T, V]
    expected = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
    del hf

    # the converter alone: megatron's full logits against transformers'
    arch = smollm2_arch()
    compat.init_megatron(seed=0, device="cpu")
    gpt = build_gpt_model(arch).eval()
    gpt.load_state_dict(hf_to_megatron(load_hf(str(folder)), arch), strict=True)
    with torch.no_grad():
        got_logits = full_logits(gpt, tokens)  # [2, T, V]
    del gpt
    # Measured max |diff| 0.0 (bit-identical) over logits up to |43|, as for the toy architectures of
    # test_convert.py; 1e-5 leaves room for kernels. A wrong head group or norm mapping is off by O(1).
    torch.testing.assert_close(got_logits, logits, rtol=0.0, atol=1e-5)

    job = validate_job({
        "apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "smollm2-parity"},
        "spec": {"model": {"preset": "smollm2-135m", "weights": str(folder), "rolloutDtype": "float32"},
                 "correction": {"reference": "current"}, "train": {"warmStartSteps": 0}},
    })
    actor = MegatronActor.from_spec(job.spec, tok.vocab_size)
    got = actor.logprobs(tokens)  # [2, T]; position 0 has no prediction
    assert got.shape == tokens.shape
    # Measured max |diff| 1.2e-6 nats: the actor's fp32 chunked log-softmax vs an fp64 one over the
    # same logits; 1e-5 is tight against a wrong mapping (>= 0.1 nats).
    torch.testing.assert_close(got[:, 1:].double(), expected, rtol=0.0, atol=1e-5)
    # the pretrained model knows the protocol text it is prompted with: the task tokens are likely
    assert expected[0, len(prompt) - 1 :].mean() > expected[1, len(prompt) - 1 :].mean()
