"""What one training step of the customer-service warm-start test costs, before and after (issue 39's slow test).

``tests/rollout/test_customer_service_warmstart.py`` trains a transformers stand-in of the warm start (tiny-llama,
batches of 64 demonstrations). Its step was: draw a batch of demonstrations (``demos._cs_rendered``: the prompt,
then two chat-template renders of the growing conversation after every turn), then forward, backward and AdamW on
torch's default threads (every core). Now the text after a turn is written directly (one render per demonstration)
and the test trains on one thread. This script times both steps side by side, in alternating blocks in one run, so
that both see the same load, and prints seconds per step and their ratio.

    nice -n 10 .venv/bin/python bench/cs_warmstart_test_cost.py --blocks 3 --steps 5
"""

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs import demos
from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.tokenizer import Tokenizer

T = cs_tokenizer()


def rendered_before(env: Any, sample: dict[str, Any], turns: Sequence[str], tokenizer: Tokenizer) -> demos.Demo:
    """The previous ``demos._cs_rendered``: after every turn, the text between the end-of-turn token and the next
    generation prompt cut from two template renders of the whole conversation (the same tokens; slower)."""
    from asyncrl.rollout.envs.interface import AssistantMessage
    from asyncrl.rollout.envs.toolcalls import parse_hermes

    hf: Any = getattr(tokenizer, "hf")  # noqa: B009
    eos = tokenizer.eos_token
    reset = env.reset(sample)
    tools = [dict(t) for t in reset.tools or ()]
    msgs: list[dict[str, Any]] = [dict(m) for m in reset.messages]

    def render(messages: list[dict[str, Any]], gen: bool) -> str:
        return str(hf.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False))

    tokens = tokenizer.encode(render(msgs, True))
    mask = [False] * len(tokens)
    for text in turns:
        ids = tokenizer.encode(text + eos)
        tokens += ids
        mask += [True] * len(ids)
        content, calls, bad = parse_hermes(text)
        msg = AssistantMessage(text, content, calls, bad, eos, eos=True)
        turn = env.step(msg)
        if turn.done:
            return tokens, mask
        history = [*msgs, msg.to_message()]
        before, after = render(history, False), render([*history, *turn.observation], True)
        cut = before.rfind(eos)
        obs = tokenizer.encode(before[cut + len(eos) :] + after[len(before) :])
        tokens += obs
        mask += [False] * len(obs)
        msgs = [*history, *turn.observation]
    raise RuntimeError(f"customer-service demo did not end: {list(turns)}")


def block(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, batch: int, rng: random.Random) -> float:
    """Seconds per step of ``steps`` steps: a batch of demonstrations drawn, forward, backward, AdamW."""
    t0 = time.perf_counter()
    for _ in range(steps):
        b = demos.pad_batch(demos.demonstrations("customer-service", batch, rng, tokenizer=T), pad_id=T.pad_id)
        logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), b.tokens[:, 1:], reduction="none")
        weights = demos.loss_weights("customer-service", b, T)
        assert weights is not None
        w = weights[:, 1:]
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", type=int, default=3, help="alternating blocks per arm")
    p.add_argument("--steps", type=int, default=5, help="steps per block")
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    default_threads, after = torch.get_num_threads(), demos._cs_rendered
    arch = resolve_arch(ModelSpec(preset="tiny-llama"), T.vocab_size, 256)
    model = build_model(arch, seed=0).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rng = random.Random(0)
    arms = {"before": (rendered_before, default_threads), "after": (after, 1)}
    seconds: dict[str, list[float]] = {k: [] for k in arms}
    for _ in range(a.blocks):
        for name, (render, threads) in arms.items():
            demos._cs_rendered = render  # type: ignore[assignment]
            torch.set_num_threads(threads)
            seconds[name].append(block(model, opt, a.steps, a.batch, rng))
    demos._cs_rendered = after
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    for name, (_, threads) in arms.items():
        print(f"{name}: {threads} thread(s), {statistics.median(seconds[name]):.3f} s per step of {a.batch} "
              f"(blocks: {', '.join(f'{s:.3f}' for s in seconds[name])})")
    ratio = statistics.median(seconds["before"]) / statistics.median(seconds["after"])
    print(f"before / after: {ratio:.2f}x (load average {' '.join(load)})")


if __name__ == "__main__":
    main()
