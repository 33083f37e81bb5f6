"""The customer-service task's byte-level BPE (rollout/envs/cs_tokenizer.py): built the same in every process,
fast, its pieces, its ChatML template through the HF path, a saved folder AutoTokenizer loads with the same ids
and prompts, and demonstrations rendered directly equal to the adapter's replay token for token."""

import hashlib
import random
import subprocess
import sys

from asyncrl.rollout.envs import cs_tokenizer as cst
from asyncrl.rollout.envs.adapter import TurnAdapter
from asyncrl.rollout.envs.base import replay
from asyncrl.rollout.envs.customer_service import (
    DEMO_KINDS,
    PRODUCTS,
    STATUSES,
    SYSTEM,
    TOOLS,
    CustomerService,
    Scenario,
    ScenarioSamples,
    agent_turns,
    call_text,
)
from asyncrl.rollout.envs.demos import _cs_rendered
from asyncrl.rollout.envs.render import render_prompt
from asyncrl.rollout.tokenizer import HFTokenizer

T = cst.cs_tokenizer()
_DIGEST = "import hashlib; from asyncrl.rollout.envs.cs_tokenizer import cs_tokenizer as c; " \
          "print(hashlib.sha1(c().hf.backend_tokenizer.to_str().encode()).hexdigest())"


def _pieces(text: str) -> list[str]:
    return [T.decode([i]) for i in T.encode(text)]


def test_it_is_built_the_same_in_another_process_and_once() -> None:
    here = hashlib.sha1(T.hf.backend_tokenizer.to_str().encode()).hexdigest()
    other = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.strip()
    assert other == here  # the trainer's merges do not depend on the process's hash seeds
    fresh = cst.cs_tokenizer.__wrapped__()  # a fresh build gives the same merges (its cost: bench, not here)
    assert hashlib.sha1(fresh.hf.backend_tokenizer.to_str().encode()).hexdigest() == here
    built = cst.cs_tokenizer.cache_info().misses
    for _ in range(3):  # once a process: later calls return the cached one and build nothing
        assert cst.cs_tokenizer() is T
    assert cst.cs_tokenizer.cache_info().misses == built
    assert T.name == cst.NAME and isinstance(T, HFTokenizer)


def test_the_tasks_words_ids_and_json_pieces_are_single_tokens() -> None:
    assert 256 < T.vocab_size <= cst.VOCAB_SIZE
    for word in (*PRODUCTS, *STATUSES, "cancel", "refund", "orders"):
        assert _pieces(" " + word) == [" " + word], word
    # an id is its letter and one token per digit, the same pieces wherever it appears (v2: digits split)
    assert _pieces(call_text("cancel", order="o318")) == [
        "<tool_call>", '{"', "name", '":"', "cancel", '","', "arguments", '":{"', "order", '":"', "o", "3", "1", "8",
        '"}}', "</tool_call>"]
    assert _pieces("o318 lamp placed;o702 mug delivered") == [
        "o", "3", "1", "8", " lamp", " placed", ";", "o", "7", "0", "2", " mug", " delivered"]
    assert _pieces("u42: cancel lamp")[:3] == ["u", "4", "2"]
    assert T.eos_token == "<|im_end|>" and T.decode([T.eos_id]) == "<|im_end|>" and T.stop_ids == (T.eos_id,)
    assert T.pad_id != T.eos_id
    for text in ("u7: refund sofa", "caf\u00e9 \u2603", 'x<y {"a": "b"}\n\t'):  # any text encodes (bytes)
        assert T.decode(T.encode(text)) == text
    # the tool tags are added tokens, not special: skip_special keeps them, drops the ChatML markers
    assert T.decode(T.encode("<|im_start|>a<tool_call>b<|im_end|>"), skip_special=True) == "a<tool_call>b"


def test_the_template_puts_the_system_prompt_and_tools_in_the_prompt() -> None:
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "u3: cancel lamp"}]
    text = T.decode(render_prompt(T, msgs, TOOLS))
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}\nTools:\norders(user): ")
    assert text.endswith("<|im_start|>user\nu3: cancel lamp<|im_end|>\n<|im_start|>assistant\n")
    assert len(render_prompt(T, msgs, TOOLS)) < 90  # measured 78-81 over the held-out tasks
    no_tools = T.decode(render_prompt(T, [{"role": "user", "content": "hi"}]))
    assert no_tools == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_saved_folder_loads_with_autotokenizer_and_renders_the_same_prompts(tmp_path) -> None:
    from transformers import AutoTokenizer

    T.hf.save_pretrained(str(tmp_path))
    back = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True, trust_remote_code=False)
    loaded = HFTokenizer.from_folder(tmp_path)
    s = Scenario.from_sample(ScenarioSamples().heldout(1, seed=0)[0])
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": s.request}]
    assert render_prompt(loaded, msgs, TOOLS) == render_prompt(T, msgs, TOOLS)
    assert back.apply_chat_template(msgs, tools=list(TOOLS), tokenize=False, add_generation_prompt=True) == \
        T.hf.apply_chat_template(msgs, tools=list(TOOLS), tokenize=False, add_generation_prompt=True)
    text = call_text("orders", user=s.user) + "<|im_end|>"
    assert back.encode(text, add_special_tokens=False) == T.encode(text) and loaded.eos_id == T.eos_id


def test_rendered_demonstrations_equal_the_adapters_replay_token_for_token() -> None:
    rng, samples = random.Random(1), ScenarioSamples()
    for i in range(60):
        sample = samples.train(0, i, rng)
        turns = agent_turns(Scenario.from_sample(sample), DEMO_KINDS[i % len(DEMO_KINDS)], random.Random(i))
        turns = ["which order?", *turns] if i % 7 == 0 else turns  # the scripted user's reply, a user turn
        ad = TurnAdapter("customer-service", CustomerService(4), sample, T)
        ep = replay(ad, ad.reset(), [t + T.eos_token for t in turns])
        assert ep.done and (ep.tokens, ep.loss_mask) == _cs_rendered(CustomerService(4), sample, turns, T), i
