"""The exact route cuts each (row, version) pair after that version's last token (trainer/oldlogits/span_plan.py):
the plan of forwards is the cheapest split (against brute force over every split), and ``score_exact`` with cut
pairs gives each token its own version's log-prob over the whole prefix, as one full-length forward per token's
version does (the independent reference), for the adapter bank (LoRA) and the per-version loop (full weights)."""

import itertools
import random

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.oldlogits import span_plan
from asyncrl.trainer.oldlogits.snapshot import WeightSnapshots, score_exact

pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py

VOCAB, B, T = 64, 6, 20


def _cost(groups: list[tuple[list[int], int]], overhead: int) -> int:
    return sum(len(idx) * n + overhead for idx, n in groups)


def _brute(lengths: list[int], overhead: int) -> int:
    """The cheapest cost over EVERY partition of the items into groups (not only contiguous ones)."""
    items = [n for n in range(len(lengths)) if lengths[n] > 0]
    best = None

    def parts(rest: list[int]) -> list[list[list[int]]]:
        if not rest:
            return [[]]
        head, tail = rest[0], rest[1:]
        out = []
        for k in range(len(tail) + 1):
            for pick in itertools.combinations(tail, k):
                left = [t for t in tail if t not in pick]
                out += [[[head, *pick], *p] for p in parts(left)]
        return out

    for p in parts(items):
        c = sum(len(g) * max(lengths[i] for i in g) + overhead for g in p)
        best = c if best is None else min(best, c)
    return best or 0


def test_the_plan_is_the_cheapest_split() -> None:
    rng = random.Random(0)
    for _ in range(60):
        lengths = [rng.choice([0, rng.randint(1, 40)]) for _ in range(rng.randint(0, 7))]
        overhead = rng.choice([0, 5, 20, 100])
        groups = span_plan.plan(lengths, overhead)
        flat = sorted(i for idx, _ in groups for i in idx)
        assert flat == [n for n in range(len(lengths)) if lengths[n] > 0]  # every item once, empty ones left out
        assert all(n == max(lengths[i] for i in idx) for idx, n in groups)  # a forward as long as its longest
        assert _cost(groups, overhead) == _brute(lengths, overhead), (lengths, overhead, groups)
    # by hand: 8 pairs cut at 64 and 8 at 128 (rows switched at half), one padded row's overhead: two forwards,
    # 8 * 64 + 8 * 128 + 2 * 128 = 1792 token positions against one forward's 16 * 128 + 128 = 2176
    assert [(len(i), n) for i, n in span_plan.plan([64] * 8 + [128] * 8, 128)] == [(8, 64), (8, 128)]
    assert [(len(i), n) for i, n in span_plan.plan([120] * 8 + [128] * 8, 128)] == [(16, 128)]
    sel = torch.tensor([[0, 1, 0, 1, 0], [0, 0, 0, 0, 0], [1, 0, 0, 0, 1]], dtype=torch.bool)
    assert span_plan.needed_lengths(sel).tolist() == [4, 0, 5]


def _actor(lora: bool) -> MegatronActor:
    model = {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64}
    if lora:
        model["lora"] = {"rank": 4, "alpha": 8.0}
    spec = {"correction": {"reference": "exact"}, "oldLogits": {"strategy": "snapshot"}, "async": {"maxStaleness": 2},
            "model": model, "train": {"learningRate": 1e-2, "seed": 5}}
    return MegatronActor.from_spec(AsyncRLJobSpec.model_validate(spec), VOCAB, num_threads=torch.get_num_threads())


def _versions(actor: MegatronActor) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [{n: torch.randn(p.shape, generator=g) * 0.1 for n, p in actor.named_weights().items()} for _ in range(3)]


@pytest.mark.parametrize("lora", [True, False])
@pytest.mark.parametrize("switch", [10, T - 1])  # at T - 1 the pairs are about as long: one forward, rows twice
def test_cut_pairs_score_each_token_under_its_version_over_the_whole_prefix(lora: bool, switch: int) -> None:
    actor = _actor(lora)
    versions = _versions(actor)
    store = WeightSnapshots(3)
    for v, w in enumerate(versions):
        store.record(v, w)
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, end in enumerate([T, 14, T, 9, 17, T]):  # right padding: rows of different lengths
        mask[i, 3:end] = True
    first = torch.tensor([0, 1, 2, 0, 1, 2])[:, None].expand(B, T)
    tok_v = torch.where(torch.arange(T) >= switch, (first + 1) % 3, first)
    tok_v[3] = 2  # a row of one version
    tok_v = torch.where(mask, tok_v, -1)
    got = score_exact(store, actor, tokens, tok_v, mask)
    # the reference: every row under every version, full length, one version per forward; pick each token's
    ref = torch.stack([actor.logprobs_under(w, tokens) for w in versions])  # [3, B, T]
    want = torch.where(mask, ref.gather(0, tok_v.clamp(min=0)[None])[0], 0.0)
    gap = float((got - want).abs().max())
    assert gap < 1e-5, gap
    assert bool((got[mask] != 0).all()) and bool((got[~mask] == 0).all())
