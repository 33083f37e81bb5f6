"""Warm-start demonstrations of mixed quality, and their padded batch.

A supervised pass on these should give a policy that is *far from perfect* (sampled success about
0.2-0.45) so that RL has a visible curve to climb (``docs/architecture.md`` (the embedded model and tasks)). Kinds:

- ``good``: the correct tool calls, each result copied faithfully, then the answer.
- ``guess``: no tool; the true answer with one digit changed, or a random number.
- ``badcall``: one operand digit or the operator of one call is wrong; the rest follows faithfully.
- ``miscopy``: correct calls, but one digit is wrong where a result is copied (next call or answer).
- ``near`` / ``random`` (tool-free ``arithmetic``): one digit off / a random number.

Every demo is played through the task's environment (:func:`~asyncrl.rollout.envs.base.replay`), so
its environment tokens are exactly what the engine would force.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.rollout.envs.base import replay
from asyncrl.rollout.envs.math_tasks import _CALL, OPS, Problem, eval_call
from asyncrl.rollout.envs.registry import get_task
from asyncrl.rollout.tokenizer import TOKENIZER, Tokenizer

if TYPE_CHECKING:
    from asyncrl.rollout.envs.customer_service import CustomerService

Demo = tuple[list[int], list[bool]]  # (tokens [T], loss_mask [T]); loss_mask True = agent token


def _change_number(n: int, rng: Random) -> int:
    """``n`` with one digit replaced (never a leading zero, so the value really changes)."""
    s = str(abs(n))
    i = rng.randrange(len(s))
    choices = [d for d in "0123456789" if d != s[i] and not (i == 0 and d == "0" and len(s) > 1)]
    out = int(s[:i] + rng.choice(choices) + s[i + 1 :])
    return -out if n < 0 else out


def _split(expr: str) -> tuple[int, str, int]:
    m = _CALL.match(expr)
    if m is None:
        raise ValueError(f"demo: {expr!r} is not a tool call")
    return int(m.group(1)), m.group(2), int(m.group(3))


def _tool_turns(p: Problem, kind: str, rng: Random) -> list[str]:
    """Agent turns solving ``p`` with the tool, with the mistake of ``kind``."""
    n = len(p.calls)
    bad_call = rng.randrange(n) if kind == "badcall" else -1
    # miscopy positions: 1..n-1 = copying call k-1's result into call k; n = into the answer
    miscopy_at = rng.randint(1, n) if kind == "miscopy" else -1
    turns, prev_true, prev_got = [], None, None
    for k, (expr, _) in enumerate(p.calls):
        a, op, b = _split(expr)
        if prev_true is not None:  # this call uses the previous result: carry what the tool said
            carried = int(prev_got) if prev_got not in (None, "?") else prev_true
            if k == miscopy_at:
                carried = _change_number(carried, rng)
            a, b = (carried, b) if a == prev_true else (a, carried)
        if k == bad_call:
            if rng.random() < 0.5:
                op = rng.choice([o for o in OPS if o != op])
            elif rng.random() < 0.5:
                a = _change_number(a, rng)
            else:
                b = _change_number(b, rng)
        call = f"{a}{op}{b}"
        turns.append(f"<calc>{call}</calc>")
        prev_true, prev_got = p.calls[k][1], eval_call(call)
    final = int(prev_got) if prev_got not in (None, "?") else p.answer
    if miscopy_at == n:
        final = _change_number(final, rng)
    turns.append(f"<ans>{final}</ans>")
    return turns


def _guess(p: Problem, rng: Random) -> int:
    return _change_number(p.answer, rng) if rng.random() < 0.5 else rng.randint(-99, 999)


def agent_turns(p: Problem, kind: str, rng: Random, *, uses_tool: bool = True) -> list[str]:
    """The agent turns of one demonstration of ``kind`` for problem ``p``."""
    if kind in ("good", "badcall", "miscopy"):
        if not uses_tool:  # tool-free task: a "good" demo answers directly
            if kind != "good":
                raise ValueError(f"demo kind {kind!r} needs a task with tool calls")
            return [f"<ans>{p.answer}</ans>"]
        return _tool_turns(p, kind, rng)
    if kind == "guess":
        return [f"<ans>{_guess(p, rng)}</ans>"]
    if kind == "near":
        return [f"<ans>{_change_number(p.answer, rng)}</ans>"]
    if kind == "random":
        return [f"<ans>{rng.randint(-9, 99)}</ans>"]
    raise ValueError(f"unknown demo kind {kind!r}; valid: good, guess, badcall, miscopy, near, random")


def demonstrations(
    task_name: str,
    n: int,
    rng: Random,
    *,
    mix: Mapping[str, float] | None = None,
    max_tool_calls: int = 4,
    tokenizer: Tokenizer = TOKENIZER,
) -> list[Demo]:
    """``n`` demonstrations of ``task_name`` drawn from ``rng``, kinds mixed by ``mix`` (task default).

    Returns ``(tokens, loss_mask)`` pairs in ``tokenizer``'s ids (the model's: ``tokenizer_for``);
    ``loss_mask`` is True exactly on agent tokens.
    """
    if task_name == "customer-service":
        return _cs_demonstrations(n, rng, mix=mix, max_tool_calls=max_tool_calls, tokenizer=tokenizer)
    task = get_task(task_name)
    mix = dict(task.demo_mix if mix is None else mix)
    kinds, weights = list(mix), list(mix.values())
    out: list[Demo] = []
    for _ in range(n):
        env = task.make_env(max_tool_calls=max_tool_calls, tokenizer=tokenizer)
        prompt = env.reset(rng)
        assert env.problem is not None  # set by reset
        turns = agent_turns(env.problem, rng.choices(kinds, weights)[0], rng, uses_tool=task.uses_tool)
        ep = replay(env, prompt, turns)
        if not ep.done:
            raise RuntimeError(
                f"demo for {task_name} did not end: {tokenizer.decode(ep.tokens)!r} ({ep.reason})"
            )
        out.append((ep.tokens, ep.loss_mask))
    return out


def _cs_demonstrations(n: int, rng: Random, *, mix: Mapping[str, float] | None, max_tool_calls: int,
                       tokenizer: Tokenizer) -> list[Demo]:
    """Demonstrations of the customer-service task, played through its environment (as the math ones).

    With the task's own tokenizer (``envs/cs_tokenizer.py``) the turns go to the environment as messages and
    the tokens are rendered by its template directly (:func:`_cs_rendered`: the adapter's rendering rules,
    without the time limit an untrusted template needs, whose timer thread per render made a 128-demo batch
    cost 1.2 s); ``tests/rollout/test_cs_tokenizer.py`` holds them token for token equal to
    :func:`~asyncrl.rollout.envs.base.replay` through the :class:`TurnAdapter`, the path every other
    tokenizer takes."""
    from asyncrl.rollout.envs.adapter import TurnAdapter
    from asyncrl.rollout.envs.cs_tokenizer import NAME
    from asyncrl.rollout.envs.customer_service import (
        COPY_SHARE,
        DEMO_MIX,
        CustomerService,
        Scenario,
        ScenarioSamples,
    )
    from asyncrl.rollout.envs.customer_service import agent_turns as cs_turns

    copy_share = COPY_SHARE if mix is None else 0.0  # copy demonstrations come with the warm start's own mix only
    mix = dict(DEMO_MIX if mix is None else mix)
    kinds, weights = list(mix), list(mix.values())
    samples, out = ScenarioSamples(), []
    for i in range(n):
        sample = samples.train(0, i, rng)
        copy = copy_share > 0 and rng.random() < copy_share
        turns = cs_turns(Scenario.from_sample(sample), "good" if copy else rng.choices(kinds, weights)[0], rng)
        if tokenizer.name == NAME:
            demo = _cs_rendered(CustomerService(max_tool_calls), sample, turns, tokenizer)
        else:
            env = TurnAdapter("customer-service", CustomerService(max_tool_calls), sample, tokenizer)
            ep = replay(env, env.reset(), [t + tokenizer.eos_token for t in turns])  # every turn ends at end-of-turn
            if not ep.done:
                raise RuntimeError(f"customer-service demo did not end: {tokenizer.decode(ep.tokens)!r} ({ep.reason})")
            demo = (ep.tokens, ep.loss_mask)
        out.append(first_turn(demo) if copy else demo)
    return out


def first_turn(demo: Demo) -> Demo:
    """``demo`` cut after its first agent turn: for the customer-service task a *copy demonstration*, the prompt
    and the lookup call whose user id is copied from the request (``customer_service.COPY_SHARE``)."""
    tokens, mask = demo
    start = mask.index(True)
    end = next((i for i in range(start, len(mask)) if not mask[i]), len(mask))
    return tokens[:end], mask[:end]


def _cs_rendered(env: "CustomerService", sample: dict[str, Any], turns: Sequence[str], tokenizer: Tokenizer) -> Demo:
    """One demonstration: ``turns`` through ``env.step`` as messages, the tokens rendered by the tokenizer's chat
    template as ``envs/render.py`` renders them (the prompt; after each turn the template's text between its
    end-of-turn token and the next generation prompt). Only the prompt goes through the template; the text after a
    turn is written as the task's ChatML template (``cs_tokenizer.CHAT_TEMPLATE``) writes it: the newline after the
    end-of-turn token, each observation message as ``<|im_start|>role``, newline, content, ``<|im_end|>``, newline,
    then the generation prompt. (Two renders of the growing conversation per turn made a batch of 64 cost ~0.3 s,
    80 % of it in the template; ``tests/rollout/test_cs_tokenizer.py`` holds the tokens equal to the adapter's.)"""
    from asyncrl.rollout.envs.interface import AssistantMessage
    from asyncrl.rollout.envs.toolcalls import parse_hermes

    hf: Any = getattr(tokenizer, "hf")  # noqa: B009 -- an HFTokenizer (the task's own: NAME)
    eos = tokenizer.eos_token
    reset = env.reset(sample)
    tools = [dict(t) for t in reset.tools or ()]
    msgs: list[dict[str, Any]] = [dict(m) for m in reset.messages]

    def render(messages: list[dict[str, Any]], gen: bool) -> str:
        return str(hf.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False))

    tokens = tokenizer.encode(render(msgs, True))
    mask = [False] * len(tokens)
    for k, text in enumerate(turns):
        ids = tokenizer.encode(text + eos)
        tokens += ids
        mask += [True] * len(ids)
        content, calls, bad = parse_hermes(text)
        msg = AssistantMessage(text, content, calls, bad, eos, eos=True)
        turn = env.step(msg)
        if turn.done:
            if k != len(turns) - 1:
                raise RuntimeError(f"customer-service demo ended at turn {k} of {list(turns)}")
            return tokens, mask
        after = "".join(f"<|im_start|>{m['role']}\n{m['content']}{eos}\n" for m in turn.observation)
        obs = tokenizer.encode("\n" + after + "<|im_start|>assistant\n")  # CHAT_TEMPLATE's text after a turn
        tokens += obs
        mask += [False] * len(obs)
    raise RuntimeError(f"customer-service demo did not end: {list(turns)}")


def loss_weights(task_name: str, batch: "DemoBatch", tokenizer: Tokenizer) -> torch.Tensor | None:
    """The warm start's per-token loss weights ``[B, T]`` (float, 0 off ``batch.loss_mask``), or None for plain
    imitation. The customer-service task weighs the agent's digit tokens, the ids it copies, by
    ``customer_service.DIGIT_WEIGHT`` (a digit is a token of its own in the task's BPE and in Llama's and Qwen's)."""
    if task_name != "customer-service":
        return None
    from asyncrl.rollout.envs.customer_service import DIGIT_WEIGHT

    digits = [ids[0] for ids in (tokenizer.encode(d) for d in "0123456789") if len(ids) == 1]
    is_digit = torch.isin(batch.tokens, torch.tensor(digits, dtype=batch.tokens.dtype))
    return batch.loss_mask.float() * torch.where(is_digit, DIGIT_WEIGHT, 1.0)


@dataclass(frozen=True)
class DemoBatch:
    """Right-padded supervised batch. ``loss_mask[b, t]`` True = predict ``tokens[b, t]`` from ``< t``."""

    tokens: torch.Tensor  # [B, T] int64, pad_id after each sequence
    loss_mask: torch.Tensor  # [B, T] bool, False on prompt, environment and pad tokens
    attention_mask: torch.Tensor  # [B, T] int64, 1 on real tokens


def pad_batch(demos: Sequence[Demo], pad_id: int = TOKENIZER.pad_id) -> DemoBatch:
    """Right-pad ``demos`` into one batch (``T`` = longest demo)."""
    if not demos:
        raise ValueError("pad_batch: no demonstrations given")
    T = max(len(t) for t, _ in demos)
    B = len(demos)
    tokens = torch.full((B, T), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.bool)
    attn = torch.zeros((B, T), dtype=torch.long)
    for b, (t, m) in enumerate(demos):
        if len(t) != len(m):
            raise ValueError(f"pad_batch: demo {b} has {len(t)} tokens but {len(m)} loss_mask entries")
        tokens[b, : len(t)] = torch.tensor(t, dtype=torch.long)
        loss_mask[b, : len(m)] = torch.tensor(m, dtype=torch.bool)
        attn[b, : len(t)] = 1
    return DemoBatch(tokens, loss_mask, attn)
