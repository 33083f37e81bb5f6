"""A user's model folder (``spec.model.weights``) loaded by a tensor-parallel actor gives the folder's own
log-probs: each TP=2 rank holds half of every split weight, and the group's log-probs match transformers
running the folder (the independent reference) and a one-process actor. Megatron marks a weight as tensor
parallel only inside its init, which a folder load skipped: at TP>1 the shards then went unmarked and the
HF -> megatron load wrote full tensors into half-sized shards (found by the dedicated scorer gang)."""

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.support.hf_models import tiny_folder, transformers_model
from tests.support.parallel_ranks import spawn_ranks

pytestmark = pytest.mark.slow  # two spawned megatron processes per family (~20-40 s on loaded cores)

B, T = 3, 12


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(1, vocab, (B, T), generator=torch.Generator().manual_seed(5))


def _rank_main(rank: int, world: int, tp: int, init_method: str | None, out: str, folder: str) -> None:
    torch.set_num_threads(1)
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.rollout.tokenizer import tokenizer_for
    from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
    from asyncrl.trainer.megatron.parallel import Layout

    spec = AsyncRLJobSpec.model_validate({"model": {"weights": folder, "rolloutDtype": "float32"},
                                          "task": {"temperature": 1.0}})
    vocab = tokenizer_for(spec.model).vocab_size
    settings = replace(ActorSettings.from_spec(spec, vocab), device="cpu",
                       layout=Layout(tp=tp, rank=rank, world=world, init_method=init_method))
    actor = MegatronActor(settings)
    shapes = {name: tuple(p.shape) for name, p in actor.named_weights().items()}
    torch.save({"logp": actor.logprobs(_tokens(vocab), temperature=1.0), "shapes": shapes, "vocab": vocab},
               os.path.join(out, f"rank{rank}.pt"))


def _hf_logprobs(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` log pi(tokens[t] | tokens[:t]) by transformers (position 0 = 0, the actor's convention)."""
    model = transformers_model(folder)
    with torch.no_grad():
        logits = model(tokens).logits.float()
    lp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros(B, 1), lp], dim=1)


@pytest.mark.parametrize("family", ["llama", "qwen3"])  # qwen3: explicit head_dim and QK-norm
def test_a_tp2_actor_loads_a_folder_into_half_shards_and_gives_its_logprobs(family: Any, tmp_path: Path) -> None:
    folder = tiny_folder(tmp_path / "models", family)
    (tmp_path / "tp1").mkdir()
    (tmp_path / "tp2").mkdir()
    (one,) = spawn_ranks(_rank_main, (str(folder),), 1, 1, str(tmp_path / "tp1"), 600.0)
    ranks = spawn_ranks(_rank_main, (str(folder),), 2, 2, str(tmp_path / "tp2"), 600.0, what=f", {family}")
    ref = _hf_logprobs(folder, _tokens(one["vocab"]))

    halved = [n for n, s in one["shapes"].items() if ranks[0]["shapes"][n] != s]
    assert halved, "no weight is split at TP=2"
    for n in halved:  # a split weight: exactly half of one dimension on each rank
        full, part = one["shapes"][n], ranks[0]["shapes"][n]
        assert sorted(f // p for f, p in zip(full, part, strict=True))[-1] == 2 and sum(
            f != p for f, p in zip(full, part, strict=True)) == 1, (n, full, part)
    assert torch.equal(ranks[0]["logp"], ranks[1]["logp"])  # every TP rank returns the group's log-probs
    d_hf = float((ranks[0]["logp"] - ref).abs().max())
    d_one = float((ranks[0]["logp"] - one["logp"]).abs().max())
    print(f"{family}: TP=2 vs transformers {d_hf:.2e}, vs one process {d_one:.2e}; {len(halved)} split weights")
    assert float((one["logp"] - ref).abs().max()) < 1e-4
    assert d_hf < 1e-4 and d_one < 1e-5, (d_hf, d_one)
