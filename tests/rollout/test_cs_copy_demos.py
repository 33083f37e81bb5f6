"""The customer-service warm start's copy demonstrations (``customer_service.COPY_SHARE``, ``demos.first_turn``):
a share of the default mix's demonstrations are the prompt and the lookup call only, the user id copied from the
request; an explicit mix (the supervised controls') gets none."""

import random

import torch

from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
from asyncrl.rollout.envs.customer_service import COPY_SHARE, DEMO_MIX, DIGIT_WEIGHT, call_text
from asyncrl.rollout.envs.demos import demonstrations, first_turn, loss_weights, pad_batch

T = cs_tokenizer()


def test_first_turn_cuts_after_the_first_agent_turn() -> None:
    demo = ([1, 2, 3, 4, 5, 6, 7], [False, False, True, True, False, True, True])
    assert first_turn(demo) == ([1, 2, 3, 4], [False, False, True, True])


def _ends_with_the_lookup(tokens: list[int]) -> bool:
    text = T.decode(tokens)
    user = text.split("<|im_start|>user\n")[1].split(":")[0]  # the request's user id
    return text.endswith(call_text("orders", user=user) + T.eos_token)


def test_the_default_mix_has_its_share_of_copy_demonstrations_and_an_explicit_mix_none() -> None:
    demos = demonstrations("customer-service", 200, random.Random(0), tokenizer=T)
    copies = [t for t, _ in demos if _ends_with_the_lookup(t)]  # a whole episode never ends at the lookup
    # binomial(200, 0.3): mean 60, sd 6.5; the bounds are 4 sd either side
    assert 34 <= len(copies) <= 86 and COPY_SHARE == 0.3, len(copies)
    assert all(m[-1] and not m[0] for _, m in demos)  # each ends on the agent's end of turn
    explicit = demonstrations("customer-service", 100, random.Random(0), mix=DEMO_MIX, tokenizer=T)
    assert not any(_ends_with_the_lookup(t) for t, _ in explicit)


def test_loss_weights_weigh_the_agents_digits_only_on_the_customer_service_task() -> None:
    b = pad_batch(demonstrations("customer-service", 8, random.Random(1), tokenizer=T), pad_id=T.pad_id)
    w = loss_weights("customer-service", b, T)
    assert w is not None and loss_weights("calculator", b, T) is None
    digit = torch.tensor([[T.decode([int(t)]).isdigit() for t in row] for row in b.tokens])
    expected = b.loss_mask.float() * torch.where(digit, DIGIT_WEIGHT, 1.0)
    assert torch.equal(w, expected) and DIGIT_WEIGHT == 5.0
    assert bool((w[~b.loss_mask] == 0).all()) and bool((w[b.loss_mask & digit] == 5.0).any())
    assert bool((digit & ~b.loss_mask).any())  # the request's and the listing's digits are never weighted
