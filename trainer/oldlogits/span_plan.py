"""Which forwards score a batch's (row, version) pairs, each cut at its version's last token (``score_exact``).

A row that spans two versions needs the prefix of its later tokens under the later version AND the prefix of its
earlier tokens under the earlier one: the rollout engine re-prefills its cache after every weight swap
(``rollout/hf_engine.py``), so a token's behaviour log-prob is its own version's over the whole prefix, and no
position's hidden state can be shared between versions. What a forward need not compute is everything after
the version's last token in the row: causal attention never lets a later position change an earlier one. The
pair ``(row, older version)`` of a row switched at half its length needs half the row.

A padded forward costs its rows times its length, so pairs cut to different lengths run in a few forwards, each
over the pairs of similar length (sorted by length, split where it saves more than ``overhead`` token positions
per extra forward: a forward's fixed cost, default one padded row). :func:`plan` finds the cheapest such split
exactly (a dynamic programme over the sorted lengths).
"""

from collections import Counter
from collections.abc import Sequence

import torch
from torch import Tensor


def needed_lengths(sel: Tensor) -> Tensor:
    """``[r]`` long: per row of ``sel`` ``[r, T]`` (bool), one past its last True column (0 for a row with none)."""
    if sel.shape[1] == 0:
        return torch.zeros(sel.shape[0], dtype=torch.long, device=sel.device)
    return (sel.long() * torch.arange(1, sel.shape[1] + 1, device=sel.device)).amax(dim=1)


def plan(lengths: Sequence[int], overhead: int) -> list[tuple[list[int], int]]:
    """Group items of ``lengths`` into forwards ``(indices, length)`` that minimise
    ``sum(len(indices) * length) + overhead * (number of forwards)``; ``length`` is the group's longest.

    Items of length 0 are left out (nothing to score). Groups are contiguous in length order, which is
    optimal: swapping a longer item into a shorter group never lowers the cost. Items of one length share a
    group, so the programme runs over the distinct lengths ``D`` (at most the batch's ``T``), one vector
    step each: ``O(D^2)`` work in ``D`` tensor operations."""
    order = sorted((n for n in range(len(lengths)) if lengths[n] > 0), key=lambda n: lengths[n])
    if not order:
        return []
    per_length = Counter(int(lengths[n]) for n in order)
    distinct = sorted(per_length)
    count = torch.tensor([0] + [per_length[u] for u in distinct], dtype=torch.float64)
    before = count.cumsum(0)  # before[j]: items of the j shortest lengths
    best = torch.zeros(len(distinct) + 1, dtype=torch.float64)  # best[j]: cheapest cost of those items
    cut = [0] * (len(distinct) + 1)
    for j in range(1, len(distinct) + 1):
        # a last group of lengths i..j-1 (all padded to distinct[j-1]) after the cheapest plan of the first i
        cost = best[:j] + (before[j] - before[:j]) * distinct[j - 1] + overhead
        i = int(torch.argmin(cost))
        best[j], cut[j] = cost[i], i
    groups = []
    j = len(distinct)
    while j > 0:
        i = cut[j]
        lo, hi = distinct[i], distinct[j - 1]
        groups.append(([n for n in order if lo <= lengths[n] <= hi], hi))
        j = i
    return groups[::-1]
