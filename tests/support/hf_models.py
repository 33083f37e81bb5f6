"""Tiny random Hugging Face model folders of each family, for tests (no network).

The folders come from :mod:`asyncrl.rollout.tiny_models` (the same code ``asyncrl models make-tiny``
runs); this module adds what tests need around them: a cache per session, the reference
transformers model, the megatron actor's model loaded from the folder, and a scripted environment.
"""

import random
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model_arch import FAMILIES, Family, ModelArch, arch_from_hf_config, folder_config
from asyncrl.rollout.envs.base import CONTINUE, EnvStep
from asyncrl.rollout.tiny_models import make_tiny

ALL_FAMILIES: tuple[Family, ...] = tuple(FAMILIES)
SHARDED: frozenset[Family] = frozenset({"qwen3", "qwen3_moe"})  # saved with a small max_shard_size


def tiny_folder(root: Path, family: Family, **kwargs: Any) -> Path:
    """``root/family`` holding the tiny ``family`` model (made once; sharded for :data:`SHARDED`)."""
    folder = root / family
    if not (folder / "config.json").is_file():
        shard = "60KB" if family in SHARDED else None
        make_tiny(family, folder, max_shard_size=kwargs.pop("max_shard_size", shard), **kwargs)
    return folder


def folder_arch(folder: Path) -> ModelArch:
    cfg = folder_config(str(folder))
    assert cfg is not None, f"{folder} has no config.json"
    return arch_from_hf_config(cfg)


def transformers_model(folder: Path, attn: str = "eager") -> Any:
    """``AutoModelForCausalLM.from_pretrained(folder)`` in fp32 (eager attention: exact reference)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, attn_implementation=attn).eval()


def megatron_model(folder: Path) -> Any:
    """The actor's ``GPTModel`` for the folder's architecture, loaded from it (call init_megatron first)."""
    from asyncrl.trainer.megatron.convert import load_folder_into
    from asyncrl.trainer.megatron.hf_folder import HFFolder
    from asyncrl.trainer.megatron.model import build_gpt_model

    gpt = build_gpt_model(folder_arch(folder), random_init=False).eval()  # as the actor builds it
    load_folder_into(gpt, folder_arch(folder), HFFolder(folder))
    return gpt


def tokens(vocab: int, batch: int = 3, seq: int = 24, seed: int = 1) -> torch.Tensor:
    """``[batch, seq]`` random ids (seq > the mistral window of 8, so the window matters)."""
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))


class CountingEnv:
    """Prompts of 3-8 random ids; forces two fixed ids every ``every`` agent tokens; ends after ``turns``
    forced observations (so trajectories hold agent and environment tokens)."""

    task = "count"
    truncated_reward = 0.0

    def __init__(self, tokenizer: Any, every: int = 4, turns: int = 2) -> None:
        self.tokenizer = tokenizer
        self.every, self.turns = every, turns
        self.seen = self.answers = 0

    def reset(self, rng: random.Random) -> list[int]:
        return [rng.randrange(3, 200) for _ in range(rng.randint(3, 8))]

    def step(self, turn_text: str) -> EnvStep:
        self.seen += 1
        if self.answers == self.turns:
            return EnvStep(done=True, reward=1.0, success=True, reason="counted")
        if self.seen % self.every == 0:
            self.answers += 1
            return EnvStep(tokens=(40, 41))
        return CONTINUE

    def info(self) -> dict[str, Any]:
        return {"seen": self.seen}
