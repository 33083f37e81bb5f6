"""Teach a tiny random model a scripted conversation, so that a real agent harness can be driven through it.

A randomly initialised model never writes a tool call, so a test of a multi-turn tool-use harness needs a model that
plays a script: turn 0 after the harness's first prompt, turn 1 after the tool's answer, and so on. The prompts are
the harness's own (its messages as the endpoint rendered them), so they are read, not guessed: :func:`teach_script`
plays the episode, reads from the trajectory the ids before the first turn that is not yet the script's (everything
the endpoint rendered and forced up to there), trains the model with real torch Adam on that exact sequence followed
by the scripted turn, loads the weights into the worker and plays again, until the whole script replays.

Sampling at a low temperature (``TaskSpec(temperature=0.05)``) then replays it: the training stops only when every
scripted token is the argmax by a logit margin (:data:`MARGIN`), so another token has a chance of about
``exp(-MARGIN / temperature)`` per step.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import Trajectory

MARGIN = 2.0  # logit gap of every scripted token over the runner-up before the training stops


def sampled_runs(t: Trajectory) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of ``loss_mask`` True after the prompt: one per sampled assistant turn."""
    runs: list[tuple[int, int]] = []
    start: int | None = None
    for i in range(t.prompt_len, len(t.tokens) + 1):
        m = i < len(t.tokens) and t.loss_mask[i]
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def fit(model: Any, ids: Sequence[int], trained: Sequence[bool], *, lr: float = 3e-3, max_steps: int = 1500) -> int:
    """Train ``model`` (an HF causal LM) to predict ``ids[i]`` after ``ids[:i]`` wherever ``trained[i]``, until each
    such token leads its runner-up by :data:`MARGIN` logits; the steps taken. Raises when it does not get there."""
    x = torch.tensor([list(ids)])
    pos = torch.tensor([i for i, m in enumerate(trained) if m])
    if len(pos) == 0 or int(pos[0]) == 0:
        raise ValueError("fit: nothing to train, or a trained token with no context before it")
    y = x[0, pos]
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    model.train()
    try:
        for step in range(max_steps):
            hidden = model.get_decoder()(input_ids=x[:, :-1]).last_hidden_state[0, pos - 1]
            logits = model.get_output_embeddings()(hidden).float()  # only where a token is trained: a real
            # vocabulary (49k ids) over a whole chat-template prompt would cost far more
            gold = logits.gather(1, y[:, None])[:, 0]
            rival = logits.scatter(1, y[:, None], float("-inf")).max(dim=1).values
            if bool(((gold - rival) >= MARGIN).all()):
                return step
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        model.eval()
    raise RuntimeError(f"fit: the script is not learnt after {max_steps} steps (loss {float(loss):.3f})")


@dataclass
class Taught:
    """What :func:`teach_script` leaves: the model's weights, the last (fully scripted) trajectory and the effort."""

    state_dict: dict[str, torch.Tensor]
    trajectory: Trajectory
    rounds: int  # episodes played
    steps: int  # optimizer steps over all rounds
    seconds: float


def teach_script(worker: Any, script: Sequence[str], play: Callable[[], Trajectory], *, seed: int = 0,
                 max_rounds: int | None = None) -> Taught:
    """Train a fresh ``build_model(worker.arch)`` until ``play()`` (one episode through ``worker``) samples exactly
    ``script``: turn ``k`` is ``worker.tokenizer.encode(script[k])`` then the end-of-turn token.

    Every round loads the weights into ``worker`` (version 0), plays, and finds the first sampled turn that is not the
    script's: the ids before it are that turn's prompt as the harness and the endpoint built it (the earlier turns
    are already the script's). The model is trained on those ids followed by the scripted turn, the loss on every
    sampled position (the earlier turns, which it must keep) and on the new turn; the rest (prompt, tool results,
    whatever the harness rendered) is context only.
    """
    tok = worker.tokenizer
    targets = [tok.encode(turn) + [tok.eos_id] for turn in script]
    model = build_model(worker.arch, seed=seed)
    t0, steps = time.perf_counter(), 0
    for rounds in range(1, (max_rounds or len(script) + 2) + 1):
        worker.load_weights(model.state_dict(), version=0)
        t = play()
        runs = sampled_runs(t)
        wrong = next((k for k, (a, b) in enumerate(runs) if k >= len(targets) or t.tokens[a:b] != targets[k]),
                     len(runs))
        if wrong == len(runs) == len(targets):
            sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return Taught(sd, t, rounds, steps, time.perf_counter() - t0)
        if wrong >= len(targets):
            raise RuntimeError(f"teach_script: the episode went on past the script's {len(targets)} turns: {t.info}")
        if wrong == len(runs):
            raise RuntimeError(f"teach_script: the episode ended before turn {wrong} (every turn so far scripted): "
                               f"{t.info}")
        start = runs[wrong][0]
        ids = list(t.tokens[:start]) + targets[wrong]
        trained = list(t.loss_mask[:start]) + [True] * len(targets[wrong])
        steps += fit(model, ids, trained)
    raise RuntimeError(f"teach_script: the script does not replay after {rounds} rounds (last: {t.info})")


__all__ = ["MARGIN", "Taught", "fit", "sampled_runs", "teach_script"]
