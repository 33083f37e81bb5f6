"""The customer-service warm start learns what it must (slow): a supervised pass on the demonstrations, with the
task's BPE and chat template, gives a policy that looks the user up with the id copied from the request (passes)
and whose sampled held-out episodes sometimes succeed (not yet: xfail, strict).

A cheaper stand-in for the job's own warm start (``bench/customer_service.py``, Megatron actor, 300 steps of
128): the same tiny-llama shape as a transformers model, the same demonstrations (the default mix with its copy
demonstrations, ``customer_service.COPY_SHARE``), loss weights (``demos.loss_weights``: the agent's digits count
``DIGIT_WEIGHT`` times) and learning-rate schedule (``trainer/driver/hosts/warm_start.py``), fewer and smaller
steps (200 of 64). Trained once per module (a fixture), on one torch thread; two tests read it. Without the copy
demonstrations and the weights the v2 warm start sat on the plateau where no id is copied (``copied_user``
0.00-0.03); with them the pilot of the same recipe (``bench/cs_warmstart_pilots.py``) copied the user in 0.94 of
sampled held-out episodes, but 0.78 of them acted on an id no lookup had shown and success was 0.016. See
docs/tasks.md (Warm start).

The cost (issue 39): the file took 256-300 s in CI at 300 steps on torch's default threads. At 200 steps this
stand-in copies the user in 0.97 of its 64 sampled held-out episodes (62; 0.94 at 300 steps), at 150 in 0.67 (too
few steps: the copy is learned between steps 50 and 100 of the schedule, and the sampled policy needs the rest).
The 64 episodes keep the assertions meaningful: at the measured 0.94-0.97, 51 or fewer of 64 (``copied_user``
<= 0.8) has a binomial probability below 1e-4; on the plateau (<= 0.03) 52 or more, below 1e-14. The strict xfail's
``success >= 0.03`` is 2 of 64: at the imitation ceiling (0.22) missed with probability 2e-6, at a 0.016 policy
met with probability 0.27 -- the training and sampling are seeded, so one tree gives one answer (measured: 1 of
64 at 200 steps, 0 at 300).
"""

import random
from collections.abc import Iterator

import pytest
import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.cs_behaviour import rates, tally
from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
from asyncrl.rollout.envs.customer_service import CustomerService, ScenarioSamples
from asyncrl.rollout.envs.demos import demonstrations, loss_weights, pad_batch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model
from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr

T = cs_tokenizer()
STEPS, BATCH, EVAL = 200, 64, 64


def _sft(model: torch.nn.Module, steps: int, rng: random.Random) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98), weight_decay=0.0)
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = warm_start_lr(step, steps)
        b = pad_batch(demonstrations("customer-service", BATCH, rng, tokenizer=T), pad_id=T.pad_id)
        logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits[:, :-1]  # [B, T-1, V]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.tokens[:, 1:], reduction="none")
        weights = loss_weights("customer-service", b, T)  # the job's warm start weighs the copied digits so
        assert weights is not None
        w = weights[:, 1:]  # [B, T-1]: predict agent tokens only
        loss = (nll * w).sum() / w.sum()
        mask = b.loss_mask[:, 1:]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(((nll * mask).sum() / mask.sum()).detach()))  # unweighted, per agent token
    return losses


@pytest.fixture(scope="module")
def warm() -> Iterator[tuple[list[float], float, dict[str, float]]]:
    """The stand-in trained once: its losses, and the success and behaviour rates of its sampled held-out episodes.

    On one torch thread: the model is tiny (350k parameters), and torch's default (every core) made a step 3-6x
    slower on 2 cores that other jobs also use (forward, backward and AdamW on one batch of 64, side by side at a
    load average of 4-5: 0.53-0.58 s on one thread, 1.6-3.3 s on two; ``bench/cs_warmstart_test_cost.py`` times
    the whole step before and after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield _trained()
    finally:
        torch.set_num_threads(threads)


def _trained() -> tuple[list[float], float, dict[str, float]]:
    torch.manual_seed(0)
    arch = resolve_arch(ModelSpec(preset="tiny-llama"), T.vocab_size, 256)
    model = build_model(arch, seed=0).train()
    losses = _sft(model, STEPS, random.Random(0))
    engine = HFEngine(arch, dtype="float32", seed=0, pad_id=T.pad_id)
    engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()}, version=0)
    tasks = ScenarioSamples().heldout(EVAL, seed=0)
    eps = [Episode.start(str(i), "g", TurnAdapter("customer-service", CustomerService(4), s, T), random.Random(i))
           for i, s in enumerate(tasks)]
    engine.generate(eps, max_new_tokens=128, temperature=1.0, seed=0)
    success = sum(e.success for e in eps) / EVAL
    seen = rates(tally(e.to_trajectory().info.get("behaviour") or {} for e in eps))
    print(f"losses {losses[::50]} success {success} behaviour {seen}")
    return losses, success, seen


@pytest.mark.slow
def test_warm_start_copies_the_users_id_on_heldout_scenarios(warm) -> None:
    losses, success, seen = warm
    assert losses[0] > 4.0 and losses[-1] < 0.5 * losses[0], losses[::25]
    # a random user is right 1 time in 90: the plain mix's plateau named the user in 0.00-0.03 of episodes
    assert seen["looked_up"] > 0.9 and seen["copied_user"] > 0.8, (success, seen)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 39: the warm start copies the user's id but not yet the order's from "
                   "the listing (the recipe's pilot: guessed 0.78, success 0.016; docs/tasks.md, Warm start); strict, "
                   "so the day a recipe copies both it says so")
def test_warm_start_gives_a_policy_that_sometimes_succeeds_on_heldout_scenarios(warm) -> None:
    _, success, seen = warm
    # the mix's imitator copies the user in 0.95 of episodes, guesses in 0.10 and succeeds 0.22
    # (bench/customer_service_baselines.py)
    assert seen["guessed"] < 0.3 and 0.03 <= success <= 0.5, (success, seen)
