"""The audit of a data-parallel actor: each DP rank audits its share of the chosen rows and the parts merge
into what one process reports (``trainer/oldlogits/audit.py``, ``merge_parts``)."""

import math

import pytest
import torch

from asyncrl.api.correction import CorrectionSpec
from asyncrl.trainer.oldlogits.audit import audit_parts, merge_parts
from tests.support.audit_stats import audit_stats


def test_the_parts_of_data_parallel_ranks_merge_into_the_one_process_audit() -> None:
    # Each DP rank audits its share of the chosen rows; counts add, the distances cover every difference.
    g = torch.Generator().manual_seed(5)
    B, T = 6, 7
    mu, theta, ref, old = (torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3 - 1.0 for _ in range(4))
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    loss_mask = torch.rand(B, T, generator=g) > 0.3
    spec = CorrectionSpec()
    whole = audit_stats(theta, ref, old, mu, adv, loss_mask, spec)
    shares = [torch.tensor([0, 3, 4]), torch.tensor([1, 2, 5])]
    parts = [audit_parts(theta[r], ref[r], old[r], mu[r], adv[r], loss_mask[r], spec) for r in shares]
    merged = merge_parts(parts, rows=B, rows_unscorable=0)
    assert (merged.tokens, merged.mask_disagree_tokens, merged.clip_disagree_tokens) == (
        whole.tokens, whole.mask_disagree_tokens, whole.clip_disagree_tokens)
    assert merged.abs_diff_mean == pytest.approx(whole.abs_diff_mean, abs=1e-15)
    assert merged.abs_diff_p99 == whole.abs_diff_p99  # a percentile of the same values, whatever their order
    assert math.isnan(merge_parts([], rows=0, rows_unscorable=0).abs_diff_p99)
