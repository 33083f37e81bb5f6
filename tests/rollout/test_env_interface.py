"""The turn-level interface through the token-level machinery: loss_mask, forced observations, version
stamps across an interrupt and a weight update, the chat-template path, the customer-service task."""

import random
import threading
from pathlib import Path

import pytest

from asyncrl.api.job import AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import replay
from asyncrl.rollout.envs.charset import TEXT_TOKENIZER
from asyncrl.rollout.envs.customer_service import (
    DEMO_KINDS,
    CustomerService,
    Scenario,
    ScenarioSamples,
    agent_turns,
)
from asyncrl.rollout.envs.interface import AssistantMessage, Reset, Turn
from asyncrl.rollout.envs.split import is_heldout
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import NO_VERSION, Trajectory, TrajectoryStatus
from asyncrl.rollout.worker import RolloutWorker

PLUGINS = str(Path(__file__).parent / "plugins")
MODEL = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
T = TEXT_TOKENIZER


def _segments(t: Trajectory) -> list[tuple[bool, str]]:
    """The trajectory after its prompt as runs of (trained?, text)."""
    out: list[tuple[bool, str]] = []
    for tok, m in zip(t.tokens[t.prompt_len:], t.loss_mask[t.prompt_len:], strict=True):
        piece = T.decode([tok])
        if out and out[-1][0] == m:
            out[-1] = (m, out[-1][1] + piece)
        else:
            out.append((m, piece))
    return out


def test_loss_mask_is_exactly_the_assistant_tokens_across_an_interrupt_and_a_weight_update() -> None:
    # each step takes >= 80 ms (an async service call); from the second step on, the service answers only once the
    # test lets it (hold): the swap and the interrupt surely find every episode in flight, after a first turn at v0
    stepped, hold = threading.Event(), threading.Event()
    spec = TaskSpec(environment="toy_envs:AsyncRelay", python_path=[PLUGINS],
                    args={"turns": 6, "sleep_s": 0.08, "stepped": stepped, "hold": hold}, group_size=2,
                    max_new_tokens=200)
    w = RolloutWorker(spec, MODEL, AsyncSpec(partial_rollout=True))
    w.load_weights(build_model(w.arch, seed=0).state_dict(), version=0)
    v1 = build_model(w.arch, seed=1).state_dict()
    out: list[Trajectory] = []
    th = threading.Thread(target=lambda: out.extend(w.generate(4)))
    th.start()
    assert stepped.wait(60)  # a turn in: episodes hold forced observations, the others wait for an answer
    w.update_weights(v1, version=1)  # swapped at a token boundary
    snaps = w.interrupt(timeout_s=30)
    hold.set()  # the pending answers come; the resumed episodes go on at v1
    th.join(30)
    assert snaps and all(s.status is TrajectoryStatus.INTERRUPTED for s in snaps)
    rest = w.generate(0)  # resume the suspended episodes (their pending env answers included)
    trajs = out + rest
    assert sorted(t.traj_id for t in trajs) == sorted(f"w0-g{g}-s{j}" for g in range(4) for j in range(2))
    assert any(t.is_partial for t in trajs)  # some episodes span versions 0 and 1
    for t in [*trajs, *snaps]:
        assert all(not m for m in t.loss_mask[: t.prompt_len])
        for i, m in enumerate(t.loss_mask):
            if m:  # an assistant token: stamped with the version that sampled it
                assert t.versions[i] in (0, 1) and t.logp_mu[i] <= 0.0 and t.turn_ids[i] >= 0
            else:  # prompt or observation: forced, never trained on
                assert t.versions[i] == NO_VERSION and t.logp_mu[i] == 0.0 and t.turn_ids[i] == -1
    for t in trajs:
        assert t.status is TrajectoryStatus.FINISHED and t.info["turns"] == 6
        segs = _segments(t)
        # agent, <res>1</res>, agent, <res>2</res>, ..., agent: the observations are exactly what the
        # environment answered, in order, and every agent run is trained
        assert [s for m, s in segs if not m] == [f"<res>{k}</res>" for k in range(1, 6)]
        assert [m for m, _ in segs] == [True, False] * 5 + [True]
        assert sorted(set(t.turn_ids) - {-1}) == list(range(6))


def test_math_tasks_take_the_same_adapter_path() -> None:
    from asyncrl.rollout.envs.registry import get_task

    env = get_task("calculator").make_env()
    assert isinstance(env, TurnAdapter)  # MathToolEnv is a TurnAdapter over MathTurn
    prompt = env.reset(random.Random(3))
    ep = replay(env, prompt, [f"<calc>{env.problem.question}</calc>", f"<ans>{env.problem.answer}</ans>"])
    assert ep.success and T.decode([]) == ""


class Echo:
    """A two-turn chat: the user asks, the assistant answers, the user says 'again', then it is scored."""

    def reset(self, sample: dict) -> Reset:
        self.n = 0
        return Reset([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}],
                     tools=[{"type": "function", "function": {"name": "wave", "parameters": {"type": "object"}}}])

    def step(self, msg: AssistantMessage) -> Turn:
        self.n += 1
        if self.n == 1:
            return Turn([{"role": "user", "content": "again"}])
        return Turn(done=True, reward=1.0, success=True)


@pytest.mark.slow
def test_chat_template_path_with_smollm2_tokenizer() -> None:
    from transformers import AutoTokenizer

    from asyncrl.rollout.smollm import smollm2_gguf
    from asyncrl.rollout.tokenizer import HFTokenizer

    path = smollm2_gguf()
    tok = HFTokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), "smollm2")
    env = TurnAdapter("echo", Echo(), {}, tok)
    prompt = tok.decode(env.reset())
    # SmolLM2-135M's template ignores tools: the schemas go into its system message (Hermes form)
    assert prompt.startswith("<|im_start|>system\nBe brief.\n\n# Tools") and '"name":"wave"' in prompt
    assert prompt.endswith("<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")
    ep = replay(env, env.reset(), ["Hi!<|im_end|>", 'x<tool_call>{"name": "wave", "arguments": {}}</tool_call><|im_end|>'])
    assert ep.done and ep.reward == 1.0
    forced = "".join(tok.decode([i]) for i, m in zip(ep.tokens[ep.prompt_len:], ep.loss_mask[ep.prompt_len:],
                                                     strict=True) if not m)
    # after the end-of-turn token: exactly the template's text up to the next assistant header
    assert forced == "\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    full = tok.decode(ep.tokens)
    assert full.startswith(prompt) and full.endswith("</tool_call><|im_end|>")


# ---- the customer-service task ---------------------------------------------------------------------
# Through a tokenizer without a chat template (the text alphabet): the request alone is the prompt and each
# answer is forced as plain text after the end-of-turn token (the task's own tokenizer and template:
# tests/rollout/test_customer_service.py).
def _play(sample: dict, turns: list[str]) -> tuple[CustomerService, object]:
    env = CustomerService()
    ad = TurnAdapter("customer-service", env, sample, T)
    ep = replay(ad, ad.reset(), [t + T.eos_token for t in turns])
    return env, ep


def test_customer_service_reward_is_the_database_state() -> None:
    s = Scenario("u3", (("o31", "lamp", "placed"), ("o47", "mug", "delivered"), ("o52", "pen", "placed")),
                 "cancel", "lamp")
    env, ep = _play(s.to_sample(), agent_turns(s, "good", random.Random(0)))
    assert ep.success and env.db["o31"][2] == "cancelled" and env.db["o47"][2] == "delivered"
    text = T.decode(ep.tokens)
    assert text.startswith("<bos>u3: cancel lamp<tool_call>")
    assert "</tool_call><eos>o31 lamp placed;o47 mug delivered;o52 pen placed<tool_call>" in text
    assert text.endswith('"order":"o31"}}</tool_call><eos>okdone<eos>')
    # the decoy (o52, placed too) cancelled -> the database misses the goal; a refund of a placed order is refused
    for kind in ("wrong_order", "wrong_tool", "miscopy"):
        env, ep = _play(s.to_sample(), agent_turns(s, kind, random.Random(1)))
        assert not ep.success and ep.reward == 0.0, kind
    # a malformed call is an observation the environment scores (an error answer), never an exception
    env, ep = _play(s.to_sample(), ['<tool_call>{"name": "orders"', ""])
    assert "<eos>error: malformed call<eos>" in T.decode(ep.tokens)
    assert ep.done and not ep.success and env.calls == 1


def test_customer_service_samples_split_and_demos_mix() -> None:
    samples = ScenarioSamples()
    rng = random.Random(0)
    train = [Scenario.from_sample(samples.train(0, i, rng)) for i in range(300)]
    held = [Scenario.from_sample(x) for x in samples.heldout(50, seed=7)]
    assert held == [Scenario.from_sample(x) for x in samples.heldout(50, seed=7)]  # fixed
    key = lambda s: f"cs:{s.request}:" + ";".join(" ".join(o) for o in s.orders)  # noqa: E731
    assert not any(is_heldout(key(s)) for s in train) and all(is_heldout(key(s)) for s in held)
    assert {key(s) for s in train}.isdisjoint({key(s) for s in held})
    wins = {k: sum(_play(s.to_sample(), agent_turns(s, k, rng))[1].success for s in train[:40]) for k in DEMO_KINDS}
    assert wins["good"] == 40 and wins["wrong_order"] == wins["wrong_tool"] == wins["miscopy"] == 0
