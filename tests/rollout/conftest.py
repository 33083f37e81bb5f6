"""Shared fixtures of the rollout tests: a tiny architecture and seeded HF-named weights."""

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import LlamaArch, resolve_arch
from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.tokenizer import TOKENIZER, ToolTokenizer

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def arch() -> LlamaArch:
    # hidden 64, 2 layers, 4 heads / 2 KV heads (GQA), SwiGLU 128, tied embeddings, vocab 28
    return resolve_arch(ModelSpec(hidden_size=64, ffn_hidden_size=128), TOKENIZER.vocab_size)


@pytest.fixture(scope="session")
def weights(arch: LlamaArch) -> Callable[[int], dict[str, torch.Tensor]]:
    """Seeded fp32 HF-named state dicts, with logits scaled up so sampling is far from uniform."""
    cache: dict[int, dict[str, torch.Tensor]] = {}

    def make(seed: int) -> dict[str, torch.Tensor]:
        if seed not in cache:
            model = build_model(arch, seed=seed)
            with torch.no_grad():
                model.model.embed_tokens.weight.mul_(8.0)  # sharper distributions than N(0, 0.02)
            cache[seed] = {k: v.clone() for k, v in model.state_dict().items()}
        return cache[seed]

    return make


class ScriptEnv:
    """A deterministic test environment with variable-length prompts.

    After every ``every`` sampled agent tokens it forces ``<res>7</res>`` (3 tokens); after
    ``turns`` answers the next agent token ends the episode with reward 1. ``on_step`` is called
    with the number of agent tokens seen so far (hook for weight updates and delays).
    """

    task = "script"
    truncated_reward = 0.0

    def __init__(self, every: int = 3, turns: int = 2, on_step: Callable[[int], None] | None = None) -> None:
        self.tokenizer: ToolTokenizer = TOKENIZER
        self.every, self.turns, self.on_step = every, turns, on_step
        self.seen = 0
        self.in_turn = 0
        self.answers = 0

    def reset(self, rng: random.Random) -> list[int]:
        n = rng.randint(3, 8)
        return TOKENIZER.encode("Q:" + "".join(rng.choice("0123456789") for _ in range(n)), bos=True)

    def step(self, turn_text: str) -> EnvStep:
        self.seen += 1
        if self.on_step is not None:
            self.on_step(self.seen)
        if self.answers == self.turns:
            return EnvStep(done=True, reward=1.0, success=True, reason="script done")
        self.in_turn += 1
        if self.in_turn == self.every:
            self.in_turn = 0
            self.answers += 1
            return EnvStep(tokens=tuple(TOKENIZER.encode("<res>7</res>")))
        return CONTINUE

    def info(self) -> dict[str, Any]:
        return {"seen": self.seen}


@pytest.fixture(scope="session")
def script_env() -> type[ScriptEnv]:
    """The :class:`ScriptEnv` class (a fixture, so tests need no import path to this file)."""
    return ScriptEnv


def _generate_in_background(
    eng: Any, *, started_after: int = 1, n: int = 4, until_interrupt: bool = False
) -> tuple[threading.Thread, list[Any]]:
    """Start ``eng.generate`` on ``n`` slow scripted episodes in a thread; return once the
    environment has seen ``started_after`` agent steps (generation is then surely in flight).

    ``until_interrupt``: from then on every step waits until the first ``interrupt()`` is asked for (the
    boundary engine's ``_interrupt_req``), so the episodes are still in flight when it comes, however
    slowly the test's thread runs."""
    from asyncrl.rollout.episode import Episode

    started, asked = threading.Event(), threading.Event()

    def slow(seen: int) -> None:
        if seen >= started_after:
            started.set()
            if until_interrupt and not asked.is_set() and eng._interrupt_req.wait(60):
                asked.set()  # the first interrupt came: a later generate() (the resume) runs freely
        time.sleep(0.002)

    eps = [
        Episode.start(f"t{i}", "g", ScriptEnv(every=4, turns=4, on_step=slow), random.Random(i)) for i in range(n)
    ]
    th = threading.Thread(target=eng.generate, args=(eps,), kwargs={"max_new_tokens": 40})
    th.start()
    assert started.wait(10), "generation did not start within 10 s"
    return th, eps


@pytest.fixture(scope="session")
def generate_in_background() -> Callable[..., tuple[threading.Thread, list[Any]]]:
    """:func:`_generate_in_background` as a fixture."""
    return _generate_in_background
