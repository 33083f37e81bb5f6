"""The customer-service warm start learns what it must (slow): a short supervised pass on the
demonstrations, with the task's vocabulary, gives a policy whose sampled held-out episodes succeed.

A cheaper stand-in for the job's own warm start (``asyncrl run examples/customer-service.yaml``,
Megatron actor, 300 steps of 128, held-out success 0.20): the same tiny-llama shape as a
transformers model, the same demonstrations and learning-rate schedule (``trainer/driver/hosts/warm_start.py``),
smaller steps. It fails for the vocabulary that spells ids in digits (the loss stalls at the cost
of guessing the digits, 0.34 nats per agent token, and no held-out episode succeeds) and for a warm
start too short to copy order ids from the tool's answer (175 steps: 0.08).
"""

import random

import pytest
import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
from asyncrl.rollout.envs.customer_service import CustomerService, ScenarioSamples
from asyncrl.rollout.envs.demos import demonstrations, pad_batch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model
from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr

T = cs_tokenizer()
STEPS, BATCH, EVAL = 300, 64, 64


def _sft(model: torch.nn.Module, steps: int, rng: random.Random) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0)
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = warm_start_lr(step, steps)
        b = pad_batch(demonstrations("customer-service", BATCH, rng, tokenizer=T), pad_id=T.pad_id)
        logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits[:, :-1]  # [B, T-1, V]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.tokens[:, 1:], reduction="none")
        mask = b.loss_mask[:, 1:]  # [B, T-1]: predict agent tokens only
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.slow
def test_warm_start_gives_a_policy_that_sometimes_succeeds_on_heldout_scenarios() -> None:
    torch.manual_seed(0)
    arch = resolve_arch(ModelSpec(preset="tiny-llama"), T.vocab_size, 256)
    model = build_model(arch, seed=0).train()
    losses = _sft(model, STEPS, random.Random(0))
    # far below the digit-guessing floor of the old vocabulary (0.34) and the start (ln 156 = 5.05)
    assert losses[0] > 4.0 and max(losses[-10:]) < 0.25, losses[::25]
    engine = HFEngine(arch, dtype="float32", seed=0, pad_id=T.pad_id)
    engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()}, version=0)
    eps = [Episode.start(str(i), "g", TurnAdapter("customer-service", CustomerService(4), s, T), random.Random(i))
           for i, s in enumerate(ScenarioSamples().heldout(EVAL, seed=0))]
    engine.generate(eps, max_new_tokens=96, temperature=1.0, seed=0)
    success = sum(e.success for e in eps) / EVAL
    well_formed = sum('"name":"orders"' in T.decode(e.tokens) for e in eps) / EVAL
    # measured: loss 4.98 -> 0.18, success 0.094 (6/64; half the job's batch, so below its 0.20); the
    # digit-spelled vocabulary gives 0, the demo mix's ceiling is its "good" share (~0.5)
    assert well_formed > 0.5 and 0.05 <= success <= 0.6, (success, well_formed)
