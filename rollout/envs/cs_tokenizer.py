"""The customer-service task's own tokenizer: a byte-level BPE trained on the task's text, with a ChatML template.

A model without its own tokenizer (the tiny presets) reads and writes the task through this one, as a real
model reads it through its own: the system prompt and the tool schemas are in the prompt (the chat template
renders them), the assistant ends each turn at ``<|im_end|>`` and a tool's answer is a ``tool`` turn.

- **The vocabulary** is learned, not picked: a byte-level BPE (the ``tokenizers`` library) trained on a corpus
  generated from fixed seeds: whole conversations of the task (system prompt, tools, requests, every kind of
  demonstration, the tools' answers and errors) rendered by the template below. Its pre-tokenizer is GPT-2's
  pattern with one change, every digit is a piece of its own (as in Llama's and Qwen's vocabularies), so an id
  is its letter and one token per digit (``o318``: ``o 3 1 8``): the same tokens wherever it appears, whatever
  id it is, so copying an id is copying digits (v1 kept ``u3``, ``o7`` as one piece each: with the 900 ids of
  v2, issue 39, BPE would cut each id into frequency-dependent pieces).
- **The template** (:data:`CHAT_TEMPLATE`) is ChatML: ``<|im_start|>role\\n...<|im_end|>\\n``; tools go into
  the system turn in a compact form (``orders(user): List a user's orders...``, one line each, not the JSON
  schema: a tiny model's context stays short); an assistant's tool calls are Hermes ``<tool_call>`` blocks
  (compact JSON); a tool's answer is a ``tool`` turn.
- **Specials**: ``<|endoftext|>`` (padding), ``<|im_start|>``, ``<|im_end|>`` (end of turn: the episode's
  ``eos_token``) are special tokens; ``<tool_call>`` and ``</tool_call>`` are added tokens (one id each, as in
  Qwen's vocabulary), kept by ``decode(skip_special=True)``.

:func:`cs_tokenizer` builds it (deterministic: the same ids in every process; ~0.3 s, once per process) as a
transformers ``PreTrainedTokenizerFast`` behind :class:`~asyncrl.rollout.tokenizer.HFTokenizer`, named
:data:`NAME`. ``hf.save_pretrained(folder)`` writes a folder ``AutoTokenizer.from_pretrained`` loads with the
same ids and the same template.
"""

import functools
import random
from typing import Any

from asyncrl.rollout.tokenizer import HFTokenizer

NAME = "asyncrl-cs-bpe-v2"  # changes whenever the corpus, the template or the trainer's settings change
VOCAB_SIZE = 512  # 256 bytes, the specials, and the merges (the task's words, ids and JSON pieces)
PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_TAGS = ("<tool_call>", "</tool_call>")
CORPUS_SEED, CORPUS_SCENARIOS = 20240, 100
# GPT-2's pre-tokenizer pattern, except that every digit is a piece of its own.
PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+"""

CHAT_TEMPLATE = (
    "{% set ns = namespace(sys='') %}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set ns.sys = messages[0]['content'] %}"
    "{% set messages = messages[1:] %}{% endif %}"
    "{% if ns.sys or tools %}<|im_start|>system\n{{ ns.sys }}"
    "{% if tools %}{{ '\n' if ns.sys else '' }}Tools:"
    "{% for t in tools %}{% set f = t['function'] if 'function' in t else t %}"
    "{{ '\\n' }}{{ f['name'] }}({{ f['parameters']['properties'] | join(', ') }}): {{ f['description'] }}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}{% for c in m['tool_calls'] %}"
    "{% set f = c['function'] if 'function' in c else c %}"
    "<tool_call>{\"name\":\"{{ f['name'] }}\",\"arguments\":"
    "{{ (f['arguments'] | tojson(separators=(',', ':'))) if f['arguments'] is mapping else f['arguments'] }}"
    "}</tool_call>"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _wrap(core: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=IM_END,
                                 additional_special_tokens=[IM_START], clean_up_tokenization_spaces=False,
                                 model_max_length=1 << 20)
    hf.chat_template = CHAT_TEMPLATE
    return hf


def _blank_core() -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in (PAD, IM_START, IM_END)])
    core.add_tokens([AddedToken(t, normalized=False, special=False) for t in TOOL_TAGS])
    return core


def corpus(renderer: Any) -> list[str]:
    """The training text: :data:`CORPUS_SCENARIOS` scenarios (seed :data:`CORPUS_SEED`), each played as
    every demonstration kind plus a question and a malformed call, rendered by ``renderer``'s template."""
    from asyncrl.rollout.envs.customer_service import DEMO_KINDS, FINAL, TOOLS, CustomerService, agent_turns
    from asyncrl.rollout.envs.customer_service import draw_scenario as draw
    from asyncrl.rollout.envs.interface import AssistantMessage
    from asyncrl.rollout.envs.toolcalls import parse_hermes

    rng = random.Random(CORPUS_SEED)
    out: list[str] = []
    for _ in range(CORPUS_SCENARIOS):
        s = draw(rng)
        for turns in [*(agent_turns(s, k, rng) for k in DEMO_KINDS), ["which order?", '<tool_call>{"name"', FINAL]]:
            env = CustomerService(max_tool_calls=8)
            reset = env.reset(s.to_sample())
            msgs: list[dict[str, Any]] = list(reset.messages)
            for text in turns:
                content, calls, bad = parse_hermes(text)
                msg = AssistantMessage(text, content, calls, bad)
                turn = env.step(msg)
                msgs.append(msg.to_message())
                if turn.done:
                    break
                msgs.extend(turn.observation)
            out.append(renderer.apply_chat_template(msgs, tools=list(TOOLS), tokenize=False))
    return out


@functools.lru_cache(maxsize=1)
def cs_tokenizer() -> HFTokenizer:
    """The task's tokenizer (built once per process; the same ids everywhere)."""
    from tokenizers import pre_tokenizers, trainers

    core = _blank_core()
    texts = corpus(_wrap(_blank_core()))  # the blank tokenizer only renders the template
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[PAD, IM_START, IM_END])
    core.train_from_iterator(texts, trainer=trainer)
    core.add_tokens([])  # the added tool tags keep their ids after training (appended after the merges)
    return HFTokenizer(_wrap(core), NAME)
