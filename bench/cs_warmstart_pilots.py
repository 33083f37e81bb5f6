"""Warm-start pilots for the customer-service task (issue 39): which recipe makes the warm start copy ids?

The transformers stand-in of the job's warm start (``tests/rollout/test_customer_service_warmstart.py``'s setup: a
preset's shape as a transformers model, the task's BPE, the demonstrations of ``rollout/envs/demos.py``, the
warm-start schedule of ``trainer/driver/hosts/warm_start.py``), with the levers a pilot may pull:

- ``--copy-frac``: a fraction of each batch are *copy demonstrations*: the prompt and the lookup call only (the
  demonstration cut after its first agent turn), so the user-id copy is a larger share of the loss;
- ``--curriculum``: the first fraction of the steps train on copy demonstrations only, then the mix;
- ``--digit-weight``: the loss weight of agent digit tokens (the copied ids) relative to the other agent tokens;
- ``--order-weight``: the loss weight of the digits after the first agent turn (the order id the action copies from
  the lookup's listing), when it differs from ``--digit-weight``;
- ``--first-digit-weight``: the loss weight of the action id's first digit alone, when it differs from
  ``--order-weight``: that digit is the demonstration's random choice among the fitting orders (about a nat of loss
  no policy removes), the next two follow it (a copy);
- ``--action-frac``: a fraction of each batch are *action copy demonstrations*: an ``any_fit`` demonstration (an
  order drawn among the fitting ones, as the mix's) cut after its action, so the order-id copy is a larger share of
  the loss without a better choice of order than the mix's;
- ``--drill``: the action copy demonstrations become *copy drills*: after the action, that many more copies of an
  id the listing showed (drawn at random), each written as the action writes its id (``":"o`` and 3 digits), the
  first digit untrained (a choice), the next two trained (the copy of the id that starts with it); no product, status
  or intent is in them, so they teach the copy and nothing of which order to choose;
- ``--drill-phase``: that many steps of copy drills alone first (the listing and the copies, no prompt, its own
  warm-up and decay; the record's ``drill_phase`` holds, every ``--probe`` steps, its batch's loss and the share of
  trained digits that were the argmax), then a fresh optimizer and the pilot's steps; ``--drill-lr``, the phase's
  peak rate (at 1e-3, or warmed up over 150 steps, the drills were learned by step 150-250; reaching 3e-3 by
  step 40, not in 400 steps);
- ``--tool-weight``: the loss weight of the action's tool name (``cancel``/``refund``: the request's intent);
- ``--lr`` (the schedule's peak), ``--steps``, ``--batch``, ``--preset``, ``--layers`` and ``--kv-heads`` (the
  preset's layer count and key-value heads overridden, as ``spec.model.numLayers`` / ``numKeyValueHeads`` do).

At the end (and at ``--probe`` steps) it measures, on held-out scenarios (``ScenarioSamples.heldout``), the
teacher-forced copy accuracy (argmax of the user id's digits in the lookup given the demonstration's prefix), the
order id's greedy copy (given a held-out demonstration up to the action's ``"order":"o``, the 3 digits decoded
greedily: ``order_listed``, an id the listing showed; ``order_fit``, one whose status fits the intent; and, teacher-
forced digit by digit, ``digit1_tf`` .. ``digit3_tf``: the argmax digit continues a fitting id) and, at the
end, sampled episodes (T = 1) through the engine: success and the behaviour flags of ``cs_behaviour``. One
JSON record per pilot in ``docs/results/data/customer_service/warmstart/`` (``docs/tasks.md``'s Warm start table is
generated from them by ``bench/doc_numbers.py``). The record is written at every probe too, marked ``stopped`` until
the pilot ends: a pilot stopped early (the cores are shared) keeps its probes.

    nice -n 10 .venv/bin/python bench/cs_warmstart_pilots.py --name base
    nice -n 10 .venv/bin/python bench/cs_warmstart_pilots.py --name drills300lr1e-3-copy30-dw5-ow15-act30 \
        --drill-phase 300 --drill-lr 1e-3 --copy-frac 0.3 --digit-weight 5 --order-weight 15 --action-frac 0.3
"""

import argparse
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import resolve_arch
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.cs_behaviour import rates, tally
from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer
from asyncrl.rollout.envs.customer_service import (
    DEMO_MIX,
    CustomerService,
    Scenario,
    ScenarioSamples,
    agent_turns,
)
from asyncrl.rollout.envs.demos import Demo, _cs_rendered, demonstrations, first_turn, pad_batch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model
from asyncrl.trainer.driver.hosts.warm_start import warm_start_lr

OUT = Path(__file__).resolve().parents[1] / "docs" / "results" / "data" / "customer_service" / "warmstart"
OUT = Path(os.environ.get("CS_PILOTS_OUT", OUT))  # a scratch folder for smoke runs
T = cs_tokenizer()
DIGITS = frozenset(T.encode("0123456789"))


def action_turn(demo: Demo) -> Demo:
    """``demo`` cut after its second agent turn (for the customer-service task: the action after the lookup)."""
    tokens, mask = demo
    starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
    if len(starts) < 2:
        return demo
    end = next((i for i in range(starts[1], len(mask)) if not mask[i]), len(mask))
    return tokens[:end], mask[:end]


def drill(demo: Demo, repeats: int, rng: random.Random) -> Demo:
    """An action demonstration (:func:`action_turn`) followed by ``repeats`` more copies of a listed id, each the
    action's own ``":"o`` and 3 digits: the first digit (a choice) not trained, the next two (the copy of the id that
    starts with it) trained. A *copy drill*: no product, status or intent in it, only the copy the action needs."""
    tokens, mask = action_turn(demo)
    ids = [o.split()[0][1:] for o in T.decode(tokens).split("<|im_start|>tool\n", 1)[1].split("<|im_end|>")[0].split(";")]
    first = next(i for i in range(len(tokens) - 1, -1, -1) if tokens[i] in DIGITS and tokens[i - 1] not in DIGITS)
    head = tokens[first - 2:first]  # '":"' 'o' before the action's id
    body_t, body_m = list(tokens), list(mask)
    for _ in range(repeats):
        digits = T.encode(rng.choice(ids))
        body_t += head + digits
        body_m += [False] * len(head) + [False] + [True] * (len(digits) - 1)
    return body_t, body_m


TOOL_TURN, END = T.encode("<|im_start|>tool\n"), T.encode("<|im_end|>")


def short_drill(demo: Demo, repeats: int, rng: random.Random) -> Demo:
    """:func:`drill` without the prompt, the lookup and the action: the listing alone, then ``repeats`` copies (16 in the phase unless ``--drill`` says)."""
    tokens, mask = drill(demo, repeats, rng)
    start = next(i for i in range(len(tokens)) if tokens[i:i + len(TOOL_TURN)] == TOOL_TURN) + len(TOOL_TURN)
    end = tokens.index(END[0], start)
    tail = len(action_turn(demo)[0])  # the copies after the action
    return tokens[start:end] + tokens[tail:], [False] * (end - start) + mask[tail:]


def batch(n: int, copy_frac: float, rng: random.Random, mix: dict[str, float], action_frac: float = 0.0,
          drill_repeats: int = 0) -> list[Demo]:
    k = sum(rng.random() < copy_frac for _ in range(n))
    j = sum(rng.random() < action_frac for _ in range(n - k)) if action_frac else 0  # the old stream when 0
    copies = [first_turn(d) for d in demonstrations("customer-service", k, rng, mix={"good": 1.0}, tokenizer=T)]
    acts = [action_turn(d) if not drill_repeats else drill(d, drill_repeats, rng)
            for d in demonstrations("customer-service", j, rng, mix={"any_fit": 1.0}, tokenizer=T)]
    return copies + acts + demonstrations("customer-service", n - k - j, rng, mix=mix, tokenizer=T)


def heldout_actions(n: int) -> list[tuple[list[int], Scenario]]:
    """Held-out ``good`` demonstrations cut just before the action's order digits (after ``"order":"o``)."""
    out = []
    for s in ScenarioSamples().heldout(n, seed=1):
        sc = Scenario.from_sample(s)
        tokens, mask = _cs_rendered(CustomerService(4), s, agent_turns(sc, "good", random.Random(0)), T)
        starts = [i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1])]
        first = next(i for i in range(starts[1], len(mask)) if mask[i] and tokens[i] in DIGITS)
        out.append((tokens[:first], sc))
    return out


@torch.no_grad()
def order_copy(model: torch.nn.Module, probes: list[tuple[list[int], Scenario]]) -> dict[str, float]:
    """Greedy 3-digit order ids after held-out prefixes: the share the listing showed, and that fit the intent."""
    model.eval()
    seqs = [list(t) for t, _ in probes]
    for _ in range(3):
        b = pad_batch([(t, [True] * len(t)) for t in seqs], pad_id=T.pad_id)
        logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits
        for r, t in enumerate(seqs):
            t.append(int(logits[r, len(t) - 1].argmax()))
    ids = ["o" + T.decode(t[-3:]) for t in seqs]
    listed = sum(i in {o for o, _, _ in sc.orders} for i, (_, sc) in zip(ids, probes, strict=True))
    fit = sum(i in sc.fitting for i, (_, sc) in zip(ids, probes, strict=True))
    # teacher-forced, digit by digit: given the target's first k digits, is the argmax next digit one that a fitting
    # id continuing those k digits has (k = 0: the first digit of a fitting id)? Where the copy fails, by digit.
    forced = [list(t) + T.encode(sc.target[1:]) for t, sc in probes]
    b = pad_batch([(t, [True] * len(t)) for t in forced], pad_id=T.pad_id)
    logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits
    model.train()
    digits = {}
    for k in range(3):
        ok = 0
        for r, (t, sc) in enumerate(probes):
            nxt = T.decode([int(logits[r, len(t) - 1 + k].argmax())])
            ok += any(f[1:1 + k] == sc.target[1:1 + k] and f[1 + k] == nxt for f in sc.fitting)
        digits[f"digit{k + 1}_tf"] = ok / len(probes)
    return {"order_listed": listed / len(probes), "order_fit": fit / len(probes), **digits}


def heldout_lookups(n: int) -> list[tuple[list[int], list[int]]]:
    """Held-out ``good`` demonstrations cut after the lookup, with the positions of the user id's digits there."""
    out = []
    for s in ScenarioSamples().heldout(n, seed=1):
        turns = agent_turns(Scenario.from_sample(s), "good", random.Random(0))
        tokens, mask = first_turn(_cs_rendered(CustomerService(4), s, turns, T))
        out.append((tokens, [i for i, m in enumerate(mask) if m and tokens[i] in DIGITS]))
    return out


@torch.no_grad()
def copy_accuracy(model: torch.nn.Module, probes: list[tuple[list[int], list[int]]]) -> float:
    """Fraction of held-out lookups whose user-id digits are all the argmax, teacher-forced."""
    model.eval()
    b = pad_batch([(t, [True] * len(t)) for t, _ in probes], pad_id=T.pad_id)
    logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits
    ok = sum(all(int(logits[r, i - 1].argmax()) == t[i] for i in pos) for r, (t, pos) in enumerate(probes))
    model.train()
    return ok / len(probes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--name", required=True)
    p.add_argument("--preset", default="tiny-llama")
    p.add_argument("--layers", type=int, default=None, help="override the preset's layer count (spec.model.numLayers)")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="override the preset's key-value heads (spec.model.numKeyValueHeads; tiny-llama shares 2 among 4)")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--copy-frac", type=float, default=0.0)
    p.add_argument("--curriculum", type=float, default=0.0, help="fraction of steps on copy demonstrations only")
    p.add_argument("--digit-weight", type=float, default=1.0)
    p.add_argument("--order-weight", type=float, default=None, help="weight of the action's digits (default: digit's)")
    p.add_argument("--first-digit-weight", type=float, default=None,
                   help="weight of the action id's first digit (the choice among fitting orders; default: order's)")
    p.add_argument("--action-frac", type=float, default=0.0, help="fraction of action copy demonstrations")
    p.add_argument("--drill", type=int, default=0, help="action demonstrations as copy drills of this many repeats")
    p.add_argument("--drill-phase", type=int, default=0, help="steps of copy drills alone (the listing and the "
                   "copies, no prompt) before the pilot's steps")
    p.add_argument("--drill-lr", type=float, default=None, help="the drill phase's peak (default: --lr)")
    p.add_argument("--tool-weight", type=float, default=None, help="weight of the action's tool name token")
    p.add_argument("--eval", type=int, default=64)
    p.add_argument("--probe", type=int, default=50, help="teacher-forced copy accuracy every this many steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    arch = resolve_arch(ModelSpec(preset=a.preset, num_layers=a.layers, num_key_value_heads=a.kv_heads), T.vocab_size, 256)
    model = build_model(arch, seed=a.seed).train()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng, probes, mix = random.Random(a.seed), heldout_lookups(64), dict(DEMO_MIX)
    actions = heldout_actions(64)
    order_w = a.digit_weight if a.order_weight is None else a.order_weight
    first_w = order_w if a.first_digit_weight is None else a.first_digit_weight
    digit = torch.zeros(T.vocab_size, dtype=torch.bool)
    digit[list(DIGITS)] = True
    tools = torch.zeros(T.vocab_size, dtype=torch.bool)
    tools[[t for name in ("cancel", "refund") for t in T.encode(name)]] = True
    curve: list[dict[str, float]] = []
    t0, losses, started = time.perf_counter(), [], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    phase: list[dict[str, float]] = []
    for step in range(a.drill_phase):  # copy drills alone first (their own schedule), then the pilot's steps
        for g in opt.param_groups:
            g["lr"] = warm_start_lr(step, a.drill_phase, peak=a.drill_lr or a.lr)
        demos = demonstrations("customer-service", a.batch, rng, mix={"any_fit": 1.0}, tokenizer=T)
        b = pad_batch([short_drill(d, a.drill or 16, rng) for d in demos], pad_id=T.pad_id)
        logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits[:, :-1]
        target, mask = b.tokens[:, 1:], b.loss_mask[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        hit = ((logits.argmax(-1) == target) & mask).sum() / mask.sum()
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % a.probe == 0 or step + 1 == a.drill_phase:
            phase.append({"step": step + 1, "loss": float(loss.detach()), "copied": float(hit),
                          "seconds": time.perf_counter() - t0})
            print(json.dumps({"drill_phase": phase[-1]}), flush=True)
            _write_partial(a, started, f"stopped at drill step {step + 1} of {a.drill_phase}, before the pilot's "
                           "steps (its drill probes kept)", curve, phase)
    if a.drill_phase:
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.0)  # a fresh start
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = warm_start_lr(step, a.steps, peak=a.lr)
        copy_frac = 1.0 if step < a.curriculum * a.steps else a.copy_frac
        b = pad_batch(batch(a.batch, copy_frac, rng, mix, a.action_frac, a.drill), pad_id=T.pad_id)
        logits = model(input_ids=b.tokens, attention_mask=b.attention_mask).logits[:, :-1]
        target = b.tokens[:, 1:]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        mask = b.loss_mask[:, 1:].float()
        turn = (b.loss_mask & ~torch.nn.functional.pad(b.loss_mask[:, :-1], (1, 0))).cumsum(1)[:, 1:]  # agent turn no.
        first = digit[target] & ~digit[b.tokens[:, :-1]]  # an id's first digit (the token before it is not one)
        order = torch.where(first, first_w, order_w)
        w = mask * torch.where(digit[target], torch.where(turn >= 2, order, a.digit_weight), 1.0)
        if a.tool_weight is not None:  # the action's tool (the request's intent, copied)
            w = torch.where(tools[target] & (turn >= 2) & b.loss_mask[:, 1:], a.tool_weight, w)
        loss = (nll * w).sum() / w.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(((nll * mask).sum() / mask.sum()).detach()))
        if step + 1 == 20:
            print(json.dumps({"step": 20, "seconds": time.perf_counter() - t0}), flush=True)  # the cost, early
        if (step + 1) % a.probe == 0 or step + 1 == a.steps:
            point = {"step": step + 1, "loss": sum(losses[-a.probe:]) / len(losses[-a.probe:]),
                     "copy_tf": copy_accuracy(model, probes), **order_copy(model, actions),
                     "seconds": time.perf_counter() - t0}
            curve.append(point)
            print(json.dumps(point), flush=True)
            _write_partial(a, started, f"stopped at step {step + 1} of {a.steps} (its probes kept; no sampled "
                           "evaluation)", curve, phase)
    train_s = time.perf_counter() - t0
    engine = HFEngine(arch, dtype="float32", seed=0, pad_id=T.pad_id)
    engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()}, version=0)
    tasks = ScenarioSamples().heldout(a.eval, seed=0)
    eps = [Episode.start(str(i), "g", TurnAdapter("customer-service", CustomerService(4), s, T), random.Random(i))
           for i, s in enumerate(tasks)]
    engine.generate(eps, max_new_tokens=128, temperature=1.0, seed=0)
    seen = rates(tally(e.to_trajectory().info.get("behaviour") or {} for e in eps))
    record: dict[str, Any] = {
        "name": a.name, "started": started, "args": vars(a), "train_seconds": round(train_s, 1),
        "eval_episodes": a.eval, "success": sum(e.success for e in eps) / a.eval,
        "behaviour": seen, "curve": curve, "drill_phase": phase,
        "transcripts": [T.decode(e.tokens[83:])[:600] for e in eps[:2]],
    }
    print(json.dumps({k: record[k] for k in ("name", "train_seconds", "success", "behaviour")}), flush=True)
    _write(a.name, record)


def _write_partial(a: argparse.Namespace, started: str, stopped: str, curve: list[dict[str, float]],
                   phase: list[dict[str, float]]) -> None:
    """The record of a pilot still running, as a stopped one: its probes so far, no sampled evaluation (the final
    record replaces it)."""
    _write(a.name, {"name": a.name, "started": started, "args": vars(a), "train_seconds": None, "stopped": stopped,
                    "eval_episodes": 0, "success": None, "behaviour": None, "curve": curve, "drill_phase": phase,
                    "transcripts": []})


def _write(name: str, record: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
