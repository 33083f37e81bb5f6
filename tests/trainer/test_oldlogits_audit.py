"""The live audit of a cheap reference against exact ``pi_old`` (``correction.audit``)."""

import dataclasses
import math

import pytest
import torch

from asyncrl.api.correction import CorrectionSpec
from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.driver.run.step_report import ActorStep, step_line
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.oldlogits.audit import audit_rows
from tests.support.audit_stats import audit_stats
from tests.support.bruteforce import brute_force_logp_old
from tests.support.step_reports import step_report

LN3 = math.log(3.0)


def test_audit_stats_match_a_hand_computation() -> None:
    # Default correction: mask bounds [0.5, 2], veto 1e-4, clip eps 0.2 / 0.2, no dual clip.
    spec = CorrectionSpec()
    nan = float("nan")
    mu = torch.full((2, 4), -1.0)
    loss_mask = torch.tensor([[False, True, True, True], [False, True, True, False]])
    adv = torch.tensor([[1.0] * 4, [-1.0] * 4])
    # Tokens A B C (row 0, A > 0) and D E (row 1, A < 0); (1, 3) is not trained and holds junk.
    f64 = torch.float64  # the audit computes in float64: the hand values hold to 1e-12
    old = torch.tensor([[0.0, -1.0, -1.0, -1.0], [0.0, -2.0, -1.2, nan]], dtype=f64)
    ref = torch.tensor([[0.0, -1.0, -1.0 + LN3, -1.1], [0.0, -1.5, -0.9, 5.0]], dtype=f64)
    theta = torch.tensor([[0.0, -1.0, -1.0, -0.85], [0.0, -2.0, -1.2, 0.0]], dtype=f64)
    got = audit_stats(theta, ref, old, mu, adv, loss_mask, spec)
    # |ref - old| over A..E: 0, ln 3, 0.1, 0.5, 0.3.
    assert got.tokens == 5 and got.rows == 2
    assert got.abs_diff_mean == pytest.approx((LN3 + 0.9) / 5, abs=1e-12)
    # p99 by linear interpolation over the sorted 0, 0.1, 0.3, 0.5, ln 3: position 0.99 * 4 = 3.96.
    assert got.abs_diff_p99 == pytest.approx(0.5 + 0.96 * (LN3 - 0.5), abs=1e-12)
    # Mask (r_d = pi / mu in [0.5, 2]): B ref 3 (out) vs old 1 (in); D ref e^-0.5 = 0.61 (in) vs old
    # e^-1 = 0.37 (out); A, C, E agree (C: e^-0.1 vs 1; E: e^0.1 vs e^-0.2).
    assert got.mask_disagree_tokens == 2
    # Clip (r_s = theta / pi, A > 0 stops above 1.2, A < 0 below 0.8): C ref e^0.25 = 1.28 stops,
    # old e^0.15 = 1.16 does not; D ref e^-0.5 = 0.61 stops, old 1 does not; E ref e^-0.3 = 0.74
    # stops, old 1 does not; A both 1; B ref 1/3 with A > 0 is not clipped, old 1.
    assert got.clip_disagree_tokens == 3
    flat = got.record()
    assert flat["audit_mask_disagree"] == 2 / 5 and flat["audit_clip_disagree"] == 3 / 5
    assert flat["audit_tokens"] == 5.0 and flat["audit_abs_diff_p99"] == got.abs_diff_p99
    with pytest.raises(ValueError, match="shape mismatch with loss_mask \\(2, 4\\).*logp_old \\(2, 3\\)"):
        audit_stats(theta, ref, old[:, :3], mu, adv, loss_mask, spec)


def test_audit_rows_are_a_deterministic_fraction_of_the_trained_rows() -> None:
    mask = torch.ones(8, 5, dtype=torch.bool)
    mask[3] = False  # a row with nothing trained is never chosen
    a = audit_rows(mask, 0.25, seed=7, version=4)
    assert a.numel() == 2 and 3 not in a.tolist()  # ceil(0.25 * 7)
    assert torch.equal(a, audit_rows(mask, 0.25, seed=7, version=4))
    picks = {tuple(audit_rows(mask, 0.25, seed=7, version=v).tolist()) for v in range(6)}
    assert len(picks) > 1  # the version moves the choice
    assert audit_rows(mask, 1.0, seed=0, version=0).tolist() == [0, 1, 2, 4, 5, 6, 7]


VOCAB, B, T, PROMPT = 40, 6, 12, 4


def test_actor_audits_every_nth_step_against_brute_force() -> None:
    compat.init_megatron(seed=0, device="cpu")
    spec = AsyncRLJobSpec.model_validate({
        "correction": {"reference": "current", "audit": {"everyNSteps": 2, "fraction": 0.5}},
        "async": {"maxStaleness": 1},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "train": {"learningRate": 1e-2, "seed": 5},
    })
    actor = MegatronActor.from_spec(spec, VOCAB, num_threads=torch.get_num_threads())
    g = torch.Generator().manual_seed(0)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    adv = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T) * loss_mask
    weights = {}
    metrics = []
    for v in range(2):
        weights[v] = actor.hf_state_dict()
        versions = torch.where(loss_mask, v, -1)
        if v == 1:
            versions[:, PROMPT:PROMPT + 4] = torch.where(loss_mask[:, PROMPT:PROMPT + 4], 0, -1)  # partials 0 -> 1
        tokens = torch.randint(0, VOCAB, (B, T), generator=g)
        theta = actor.logprobs(tokens) * loss_mask  # current: logp_ref = logp_theta of this step
        batch = TrainBatch(tokens, loss_mask, theta + 0.05 * loss_mask, versions, adv, torch.where(loss_mask, 0, -1))
        metrics.append(actor.train_step(batch, live_versions={v, v + 1}))
    assert metrics[0].audit is None and metrics[0].audit_seconds == 0.0  # step 0 makes version 1: not audited
    # The audit keeps the snapshots a cheap reference does not need: v1 and v2 after step 1.
    assert actor.auditor is not None and actor.auditor.store.versions == [1, 2]
    assert metrics[1].snapshot_resident_versions == 2
    assert metrics[1].audit is not None
    got = metrics[1].audit.record()
    rows = audit_rows(loss_mask, 0.5, seed=5, version=1)
    assert got["audit_rows"] == 3.0 and got["audit_tokens"] == float(loss_mask[rows].sum())
    old = brute_force_logp_old(actor.settings.arch, weights, tokens[rows], versions[rows], loss_mask[rows])
    want = audit_stats(theta[rows], theta[rows], old, batch.logp_mu[rows], adv[rows], loss_mask[rows],
                       actor.settings.correction).record()
    assert want["audit_abs_diff_mean"] > 1e-3  # the version-0 tokens really differ from current
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    line = step_line(step_report(2, actor=ActorStep(metrics[1], publish_seconds=0.01)))  # the metrics.jsonl line
    assert line["audit_abs_diff_p99"] == got["audit_abs_diff_p99"] and line["snapshot_resident_versions"] == 2
    unaudited = step_line(step_report(2, actor=ActorStep(dataclasses.replace(metrics[1], audit=None))))
    assert unaudited.keys().isdisjoint({"audit_tokens"})
