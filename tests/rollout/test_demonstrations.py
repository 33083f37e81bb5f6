import random

import pytest
import torch

from asyncrl.rollout.envs import TASKS, demonstrations, get_task, pad_batch
from asyncrl.rollout.envs.demos import agent_turns
from asyncrl.rollout.envs.math_tasks import parse_question
from asyncrl.rollout.tokenizer import TOKENIZER


@pytest.mark.parametrize("name", list(TASKS))
def test_demo_success_mix_scored_by_the_env(name: str) -> None:
    task = get_task(name)
    demos = demonstrations(name, 1000, random.Random(0))
    scores = []
    for tokens, mask in demos:
        prompt_len = mask.index(True)
        assert not any(mask[:prompt_len]) and tokens[0] == TOKENIZER.bos_id
        assert len(tokens) - prompt_len <= task.max_new_tokens_needed
        ep = task.rescore(tokens, mask, prompt_len)  # environment tokens are re-checked here
        assert ep.done
        scores.append(ep.success)
    success = sum(scores) / len(scores)
    # only "good" demos are right by construction (guesses rarely are; every other kind never)
    good = task.demo_mix["good"]
    assert good - 0.05 <= success <= good + 0.07, (success, good)


def test_demos_are_deterministic_and_mixed() -> None:
    a = demonstrations("chain-calculator", 50, random.Random(7))
    b = demonstrations("chain-calculator", 50, random.Random(7))
    assert a == b
    texts = {TOKENIZER.decode(t) for t, _ in a}
    assert any("<calc>" not in t for t in texts) and any(t.count("<calc>") == 2 for t in texts)


def test_demo_kinds_on_a_fixed_problem() -> None:
    p = parse_question("(47+38)*12")  # 85, then 85*12 = 1020
    rng = random.Random(0)
    assert agent_turns(p, "good", rng) == ["<calc>47+38</calc>", "<calc>85*12</calc>", "<ans>1020</ans>"]
    for _ in range(20):
        bad = agent_turns(p, "badcall", rng)
        assert bad != agent_turns(p, "good", rng) and bad[-1] != "<ans>1020</ans>"
        mis = agent_turns(p, "miscopy", rng)
        assert mis[0] == "<calc>47+38</calc>" and mis[-1] != "<ans>1020</ans>"


def test_pad_batch() -> None:
    demos = [([1, 5, 6, 7], [False, False, True, True]), ([1, 5], [False, True])]
    b = pad_batch(demos, pad_id=0)
    assert b.tokens.tolist() == [[1, 5, 6, 7], [1, 5, 0, 0]]
    assert b.loss_mask.tolist() == [[False, False, True, True], [False, True, False, False]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert b.tokens.dtype == torch.long and b.loss_mask.dtype == torch.bool
    with pytest.raises(ValueError, match="no demonstrations"):
        pad_batch([])
