"""The customer-service warm start learns what it must (slow): a supervised pass on the demonstrations, with the
task's BPE and chat template, gives a policy that looks the user up with the id copied from the request and whose
sampled held-out episodes sometimes succeed.

A cheaper stand-in for the job's own warm start (``bench/customer_service.py``, Megatron actor, 300 steps of
128): the same tiny-llama shape as a transformers model, the same demonstrations and learning-rate schedule
(``trainer/driver/hosts/warm_start.py``), smaller steps. On the v1 task (one-token ids) the loss sat on a plateau
near 0.18 nats per agent token, where the format is learned but no id is copied, and the copy appeared between
steps 150 and 250 of 400. The v2 task (issue 39: ids one token per digit, a mix that teaches the lookup and
copying but not which order) has its copy rate measured by this test's flags (``cs_behaviour``); see
docs/tasks.md (Warm start) for what was measured and on which machine.
"""

import random

import pytest
import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.cs_behaviour import rates, tally
from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
from asyncrl.rollout.envs.customer_service import CustomerService, ScenarioSamples
from asyncrl.rollout.envs.demos import demonstrations, pad_batch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model
from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr

T = cs_tokenizer()
STEPS, BATCH, EVAL = 400, 64, 64


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
@pytest.mark.xfail(strict=True, reason="issue 39: measured on the v2 task, this stand-in ends with copied_user 0.00 "
                   "and success 0 (docs/tasks.md, Warm start); strict, so the day a recipe copies ids it says so")
def test_warm_start_gives_a_policy_that_sometimes_succeeds_on_heldout_scenarios() -> None:
    torch.manual_seed(0)
    arch = resolve_arch(ModelSpec(preset="tiny-llama"), T.vocab_size, 256)
    model = build_model(arch, seed=0).train()
    losses = _sft(model, STEPS, random.Random(0))
    assert losses[0] > 4.0 and losses[-1] < 0.5 * losses[0], losses[::25]
    engine = HFEngine(arch, dtype="float32", seed=0, pad_id=T.pad_id)
    engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()}, version=0)
    tasks = ScenarioSamples().heldout(EVAL, seed=0)
    eps = [Episode.start(str(i), "g", TurnAdapter("customer-service", CustomerService(4), s, T), random.Random(i))
           for i, s in enumerate(tasks)]
    engine.generate(eps, max_new_tokens=128, temperature=1.0, seed=0)
    success = sum(e.success for e in eps) / EVAL
    seen = rates(tally(e.to_trajectory().info.get("behaviour") or {} for e in eps))
    # the mix's imitator copies the user in 0.95 of episodes and succeeds 0.22 (bench/customer_service_baselines.py);
    # on a plateau with no copy, a lookup names the user 1 time in 90 and success is ~0
    assert seen["copied_user"] > 0.4 and 0.03 <= success <= 0.5, (success, seen)
