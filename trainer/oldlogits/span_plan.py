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
    optimal: swapping a longer item into a shorter group never lowers the cost."""
    order = sorted((n for n in range(len(lengths)) if lengths[n] > 0), key=lambda n: lengths[n])
    m = len(order)
    if m == 0:
        return []
    best = [0] * (m + 1)  # best[j]: the cheapest cost of the first j items in order
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        top = int(lengths[order[j - 1]])  # the longest of order[i:j] (sorted)
        best[j], cut[j] = min((best[i] + (j - i) * top + overhead, i) for i in range(j))
    groups = []
    j = m
    while j > 0:
        i = cut[j]
        groups.append(([order[k] for k in range(i, j)], int(lengths[order[j - 1]])))
        j = i
    return groups[::-1]
