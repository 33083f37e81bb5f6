"""The recentre history as bf16 residuals of the EWMA (trainer/correction/ewma_history.py).

The rebuilt target is checked against an independent float64 reference: the token-weighted sum of the weights
the test fed in, and a float64 EWMA for the residuals ``e_u = theta_u - theta_prox_{u-1}`` that size the stated
tolerance ``2^-8 sum_u |e_u|`` (bf16's unit roundoff; each residual's coefficient is at most 1) plus fp32.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.trainer.correction import EwmaController
from asyncrl.trainer.correction.ewma_history import RESIDUAL_UNIT_ROUNDOFF, ResidualHistory
from asyncrl.trainer.correction.ewma_reset import next_batch_versions


def _walk(n: int, step: float, seed: int) -> list[dict[str, torch.Tensor]]:
    """``n`` versions of a weight that moves like Adam's: about ``step`` per element per version."""
    g = torch.Generator().manual_seed(seed)
    w = 0.05 * torch.randn(4, 8, generator=g)
    out = []
    for _ in range(n):
        out.append({"w": w.clone(), "n": torch.tensor([len(out)])})
        w = w + step * torch.sign(torch.randn(4, 8, generator=g)) * (0.5 + torch.rand(4, 8, generator=g))
    return out


@settings(max_examples=40, deadline=None)
@given(window=st.integers(1, 5), decay=st.floats(0.0, 0.95), extra=st.integers(0, 6),
       step=st.sampled_from([1e-5, 1e-4, 1e-3, 1e-2]), seed=st.integers(0, 10_000),
       counts=st.lists(st.integers(0, 40), min_size=6, max_size=6))
def test_recentre_target_matches_a_float64_reference_within_the_stated_tolerance(
        window: int, decay: float, extra: int, step: float, seed: int, counts: list[int]) -> None:
    t = window + 2 + extra  # versions 1..t-1: W + 1 observations build the level; the reset fires at t
    ws = _walk(t + 1, step, seed)
    ctl = EwmaController(decay=decay, max_staleness=window, rule="recentre", consecutive_steps=1, margin=0.1)
    ctl.init(ws[0], version=0)
    for v in range(1, t):
        assert not ctl.update(ws[v], 0.9, version=v, token_versions={v - 1: 1}).reset
    # tokens sampled by versions t-1-W .. t-1 (the staleness window); the next batch is one version younger
    tokens = {t - 1 - i: c for i, c in enumerate(counts[: window + 1])}
    assert ctl.update(ws[t], 0.1, version=t, token_versions=tokens).reset
    shifted = next_batch_versions(tokens, t)
    if not shifted:  # no token: nothing to average, the fallback is the current weights
        assert torch.equal(ctl.params["w"], ws[t]["w"])
        return
    # Independent reference in float64: the weights fed in, and the EWMA e_u that size the tolerance.
    total = sum(shifted.values())
    expect = sum(c * ws[v]["w"].double() for v, c in shifted.items()) / total
    prox, n, bound = ws[0]["w"].double(), 1.0, torch.zeros(4, 8, dtype=torch.float64)
    for u in range(1, t):
        n_new = decay * n + 1.0
        e = ws[u]["w"].double() - prox
        if u >= t - window:
            bound += e.abs()
        prox, n = prox + e / n_new, n_new
    scale = max(float(w["w"].abs().max()) for w in ws)
    tol = RESIDUAL_UNIT_ROUNDOFF * bound + (4 * t + 16) * 2.0 ** -24 * scale
    diff = (ctl.params["w"].double() - expect).abs()
    assert bool((diff <= tol).all()), f"max excess {float((diff - tol).max()):.3g}"
    assert torch.equal(ctl.params["n"], ws[t]["n"])  # integer buffers follow the live weights


def test_residuals_cost_w_bf16_copies_and_a_start_costs_nothing() -> None:
    ws = _walk(8, 1e-3, 0)
    ctl = EwmaController(decay="auto", max_staleness=3, rule="recentre", consecutive_steps=10)
    ctl.init(ws[0], version=0)
    assert ctl.history is not None and ctl.history.nbytes() == 0 and ctl.history.held(1) == {0, 1}
    for v in range(1, 8):
        ctl.update(ws[v], 0.9, version=v)
    # W = 3 residuals of 32 floating elements in bf16 (2 bytes): 3 * 32 * 2 = 192 bytes, versions 5, 6, 7
    assert sorted(ctl.history.entries) == [5, 6, 7] and ctl.history.nbytes() == 192
    assert ctl.history.held(8) == {5, 6, 7, 8}  # version 4 (= 8 - W - 1) can no longer be in a batch


def test_a_reset_to_the_weights_starts_the_history_and_a_recentre_reset_clears_it() -> None:
    ws = _walk(6, 1e-3, 1)
    ctl = EwmaController(decay=0.5, max_staleness=2, rule="recentre", consecutive_steps=1)
    ctl.init(ws[0], version=0)
    for v in (1, 2, 3):
        ctl.update(ws[v], 0.9, version=v)
    assert ctl.update(ws[4], 0.1, version=4).reset  # no token_versions: the paper's target, theta_4
    assert ctl.history is not None and ctl.history.held(5) == {4, 5}
    torch.testing.assert_close(ctl.params["w"], ws[4]["w"], rtol=0, atol=0)
    ctl.reset(ws[5])  # manual: between versions, so no version's weights: cleared
    assert ctl.history.entries == {} and ctl.history.held(5) == {5}
    ctl.update(ws[5], 0.9, version=5)
    assert ctl.history.held(6) == {5, 6}  # recorded again from the next version on
    # a recentre reset clears it (the cooldown keeps the next reset W + k versions away)
    ctl2 = EwmaController(decay=0.5, max_staleness=2, rule="recentre", consecutive_steps=1)
    ctl2.init(ws[0], version=0)
    for v in (1, 2, 3):
        ctl2.update(ws[v], 0.9, version=v, token_versions={v - 1: 1})
    assert ctl2.update(ws[4], 0.1, version=4, token_versions={2: 1, 3: 1}).reset
    assert ctl2.history is not None and ctl2.history.entries == {}


def test_resume_rebuilds_the_same_target_bit_for_bit() -> None:
    ws = _walk(9, 1e-3, 2)
    a = EwmaController(decay="auto", max_staleness=3, rule="recentre", consecutive_steps=1)
    a.init(ws[0], version=0)
    for v in range(1, 7):
        a.update(ws[v], 0.9, version=v, token_versions={v - 1: 2})
    b = EwmaController(decay="auto", max_staleness=3, rule="recentre", consecutive_steps=1)
    b.load_state_dict(a.state_dict())
    ra, rb = (c.update(ws[7], 0.1, version=7, token_versions={4: 3, 5: 1, 6: 2}) for c in (a, b))
    assert ra.reset and ra == rb and torch.equal(a.params["w"], b.params["w"])


def test_a_checkpoint_from_before_the_residuals_loads_with_an_empty_history() -> None:
    ws = _walk(3, 1e-3, 3)
    a = EwmaController(decay=0.5, max_staleness=2, rule="recentre")
    a.init(ws[0], version=0)
    a.update(ws[1], 0.9, version=1)
    old = a.state_dict()
    del old["residuals"], old["version"]
    old["history"] = {0: ws[0], 1: ws[1]}  # the fp32 copies the first implementation kept
    b = EwmaController(decay=0.5, max_staleness=2, rule="recentre")
    b.load_state_dict(old)
    assert b.history is not None and b.history.entries == {} and b.history.held(2) == {2}
    torch.testing.assert_close(b.params["w"], a.params["w"], rtol=0, atol=0)


def test_other_rules_keep_no_history() -> None:
    ctl = EwmaController(decay=0.5, max_staleness=3, rule="paper")
    ctl.init(_walk(1, 0, 0)[0], version=0)
    assert ctl.history is None and ctl.state_dict()["residuals"] is None


def test_history_rejects_a_negative_window() -> None:
    with pytest.raises(ValueError, match="window"):
        ResidualHistory(-1)
    assert math.isclose(RESIDUAL_UNIT_ROUNDOFF, 1 / 256)


@pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py
def test_the_actor_checkpoints_the_residuals_and_resumes_them(tmp_path) -> None:
    # The default rule (recentre) through the megatron actor's own save/load: bf16 tensors under int versions.
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.trainer.actor.batch import TrainBatch
    from asyncrl.trainer.actor.megatron_actor import MegatronActor

    spec = AsyncRLJobSpec.model_validate({
        "correction": {"reference": "ewma"}, "async": {"maxStaleness": 2},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
        "task": {"temperature": 1.0}, "train": {"learningRate": 1e-2, "seed": 3}})
    assert spec.correction.ewma.reset.rule == "recentre"

    def batch(actor: MegatronActor, seed: int, version: int) -> TrainBatch:
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randint(0, 40, (4, 10), generator=g)
        mask = torch.zeros(4, 10, dtype=torch.bool)
        mask[:, 3:] = True
        logp_mu = (actor.logprobs(tokens) + 0.05 * torch.randn(4, 10, generator=g)) * mask
        versions = torch.where(mask, torch.full((4, 10), version), torch.full((4, 10), -1))
        adv = torch.tensor([1.0, -1.0, 1.0, -1.0])[:, None].expand(4, 10).contiguous()
        turns = torch.where(mask, torch.zeros(4, 10, dtype=torch.long), torch.full((4, 10), -1))
        return TrainBatch(tokens, mask, logp_mu, versions, adv, turns)

    actor = MegatronActor.from_spec(spec, 40, num_threads=torch.get_num_threads())
    for v in range(3):
        actor.train_step(batch(actor, v, v))
    history = actor.old_logits.controller.history
    assert history is not None and sorted(history.entries) == [2, 3]  # the last W = 2 versions
    actor.save_checkpoint(str(tmp_path / "ckpt"))
    fresh = MegatronActor.from_spec(spec, 40, num_threads=torch.get_num_threads())
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    restored = fresh.old_logits.controller.history
    assert restored is not None and sorted(restored.entries) == [2, 3]
    for v, entry in history.entries.items():
        assert entry.residual is not None and restored.entries[v].total == entry.total
        for name, e in entry.residual.items():
            assert e.dtype == torch.bfloat16 and torch.equal(restored.entries[v].residual[name], e), (v, name)


def test_with_the_reset_off_no_history_is_kept() -> None:
    ctl = EwmaController(decay=0.5, max_staleness=3, rule="recentre", reset_enabled=False)
    ctl.init(_walk(1, 0, 0)[0], version=0)
    assert ctl.history is None
