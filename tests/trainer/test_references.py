"""Closed-form reference policies in log space (behavior, linear, loglinear) and the one provider registry."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.api.correction import ReferencePolicy
from asyncrl.api.old_logits import OldLogitsSpec, OldLogitStrategy
from asyncrl.trainer.oldlogits import PROVIDERS, ProviderSettings, make_provider, reference_logp, version_gaps


def _inputs(gaps: list[list[int]], actor: int = 7) -> dict[str, object]:
    torch.manual_seed(0)
    shape = (len(gaps), len(gaps[0]))
    return {
        "logp_mu": -torch.rand(shape, dtype=torch.float64) * 3,
        "logp_theta": -torch.rand(shape, dtype=torch.float64) * 3,
        "versions": actor - torch.tensor(gaps),
        "actor_version": actor,
    }


def test_registry_covers_every_runnable_reference_and_lists_keys() -> None:
    # One provider per reference; exact is keyed by its strategy, every strategy has one.
    assert list(PROVIDERS) == ["behavior", "current", "linear", "loglinear", "ewma", "snapshot", "dedicated",
                               "interruptSync"]
    for reference in ReferencePolicy:
        old = OldLogitsSpec(strategy=OldLogitStrategy.SNAPSHOT) if reference is ReferencePolicy.EXACT else OldLogitsSpec()
        assert make_provider(reference, ProviderSettings(old_logits=old)).reference is reference
    for strategy in OldLogitStrategy:
        provider = make_provider("exact", ProviderSettings(old_logits=OldLogitsSpec(strategy=strategy)))
        assert provider.reference is ReferencePolicy.EXACT
    with pytest.raises(ValueError, match="correction.reference 'prox' has no old-logit provider; valid: behavior, "
                                         "current, linear, loglinear, ewma, snapshot, dedicated, interruptSync"):
        reference_logp("prox", logp_mu=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="oldLogits.strategy is not set"):
        make_provider("exact")


def test_behavior_is_mu_and_forward_references_have_no_closed_form() -> None:
    mu = torch.randn(2, 3, requires_grad=True)
    assert torch.equal(reference_logp("behavior", logp_mu=mu), mu) and not reference_logp("behavior", logp_mu=mu).requires_grad
    for kind in ("current", "ewma"):
        with pytest.raises(ValueError, match="computed by a forward pass of the actor.*closed-form references: "
                                             "behavior, linear, loglinear"):
            reference_logp(kind, logp_mu=mu)


def test_loglinear_by_hand() -> None:
    # gap 2 -> alpha = 1/3: log pi_ref = (1/3)(-1.2) + (2/3)(-0.3) = -0.4 - 0.2 = -0.6.
    # gap 0 -> log mu exactly; version -1 (environment token) -> log mu.
    mu = torch.tensor([[-1.2, -1.2, -1.2]], dtype=torch.float64)
    theta = torch.tensor([[-0.3, -0.3, -0.3]], dtype=torch.float64)
    out = reference_logp("loglinear", logp_mu=mu, logp_theta=theta, versions=torch.tensor([[5, 7, -1]]), actor_version=7)
    assert math.isclose(float(out[0, 0]), -0.6, rel_tol=1e-15)
    assert out[0, 1] == mu[0, 1] and out[0, 2] == mu[0, 2]


def test_linear_by_hand() -> None:
    # gap 1 -> alpha = 1/2: pi_ref = (e^-1 + e^-2) / 2 = (0.367879 + 0.135335) / 2 = 0.251607,
    # log = -1.379885.
    mu = torch.tensor([[-1.0]], dtype=torch.float64)
    theta = torch.tensor([[-2.0]], dtype=torch.float64)
    out = reference_logp("linear", logp_mu=mu, logp_theta=theta, versions=torch.tensor([[3]]), actor_version=4)
    assert math.isclose(float(out), math.log((math.exp(-1) + math.exp(-2)) / 2), rel_tol=1e-15)


@settings(max_examples=40, deadline=None)
@given(gaps=st.lists(st.lists(st.integers(0, 6), min_size=5, max_size=5), min_size=1, max_size=3))
def test_interpolations_match_their_formulas(gaps: list[list[int]]) -> None:
    kw = _inputs(gaps)
    mu, theta = kw["logp_mu"], kw["logp_theta"]
    assert isinstance(mu, torch.Tensor) and isinstance(theta, torch.Tensor)
    ll = reference_logp("loglinear", **kw)  # type: ignore[arg-type]
    li = reference_logp("linear", **kw)  # type: ignore[arg-type]
    for b, row in enumerate(gaps):
        for t, n in enumerate(row):
            a = 1.0 / (n + 1)
            m, th = float(mu[b, t]), float(theta[b, t])
            assert math.isclose(float(ll[b, t]), a * m + (1 - a) * th, rel_tol=1e-13, abs_tol=1e-15)
            assert math.isclose(float(li[b, t]), math.log(a * math.exp(m) + (1 - a) * math.exp(th)), rel_tol=1e-13)
            if n == 0:
                assert float(ll[b, t]) == m and float(li[b, t]) == m


def test_linear_is_stable_for_very_negative_logprobs() -> None:
    # exp(-1000) underflows to 0 in float64; logaddexp keeps log((e^-1000 + e^-1001) / 2) finite:
    # = -1000 + log((1 + e^-1) / 2) = -1000 - 0.379885.
    out = reference_logp("linear", logp_mu=torch.tensor([[-1000.0]], dtype=torch.float64),
                         logp_theta=torch.tensor([[-1001.0]], dtype=torch.float64),
                         versions=torch.tensor([[0]]), actor_version=1)
    assert math.isclose(float(out), -1000.0 + math.log((1 + math.exp(-1)) / 2), rel_tol=1e-15)


def test_theta_is_detached_and_nan_at_gap_zero_does_not_leak() -> None:
    theta = torch.tensor([[-0.5, float("nan")]], requires_grad=True)
    mu = torch.tensor([[-1.0, -1.0]])
    out = reference_logp("loglinear", logp_mu=mu, logp_theta=theta, versions=torch.tensor([[2, 3]]), actor_version=3)
    assert not out.requires_grad and out[0, 1] == -1.0  # gap 0: mu, whatever theta holds


def test_version_gaps_masks_and_checks() -> None:
    versions = torch.tensor([[5, 6, -1, 2]])
    mask = torch.tensor([[True, True, False, False]])
    assert version_gaps(versions, 6, loss_mask=mask).tolist() == [[1, 0, -1, -1]]
    assert version_gaps(versions, 6).tolist() == [[1, 0, -1, 4]]
    with pytest.raises(ValueError, match=r"span \[0, 4\].*\[0, 2\]"):
        version_gaps(versions, 6, max_staleness=2)
    assert version_gaps(versions, 6, loss_mask=mask, max_staleness=2).tolist() == [[1, 0, -1, -1]]
    with pytest.raises(ValueError, match="newer than the actor"):
        version_gaps(torch.tensor([[7]]), 6)
    with pytest.raises(ValueError, match="need logp_mu, logp_theta, versions and actor_version"):
        reference_logp("linear", logp_mu=torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"logp_mu \(1, 2\), logp_theta \(1, 3\)"):
        reference_logp("linear", logp_mu=torch.zeros(1, 2), logp_theta=torch.zeros(1, 3),
                       versions=torch.zeros(1, 2, dtype=torch.long), actor_version=0)
