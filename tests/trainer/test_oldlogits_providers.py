"""The old-logit providers against a small real torch language model (not the megatron actor).

:class:`TinyScorer` implements :class:`asyncrl.trainer.oldlogits.Scorer` with a plain
``nn.Module``: the providers work through that protocol alone, so nothing here reaches into an
actor. The snapshot provider is checked against brute force: a fresh model loaded with each
version's weights scores every token (fp32, exact equality of the selected values).
"""

import dataclasses
from collections.abc import Mapping

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from asyncrl.api.correction import EwmaSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.oldlogits import (
    CurrentProvider,
    EwmaProvider,
    MissingSnapshotError,
    SnapshotProvider,
    make_provider,
)

VOCAB, B, T = 11, 4, 7


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)

    def forward(self, tokens: Tensor) -> Tensor:  # [b, T] -> [b, T] log-prob of each token (0 at t = 0)
        logits = self.out(torch.tanh(self.emb(tokens)))  # [b, T, V]
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
        return torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)


class TinyScorer:
    """A real model, versioned: ``step()`` changes its weights and bumps the version."""

    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.model = TinyLM()
        self.version = 0

    def named_weights(self) -> Mapping[str, Tensor]:
        return dict(self.model.named_parameters())

    def logprobs(self, tokens: Tensor, *, routes: Tensor | None = None) -> Tensor:
        with torch.no_grad():
            return self.model(tokens)

    def logprobs_under(self, weights: Mapping[str, Tensor], tokens: Tensor, routes: Tensor | None = None) -> Tensor:
        with torch.no_grad():
            return functional_call(self.model, dict(weights), (tokens,))

    def step(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        self.version += 1


def _batch(versions: Tensor, seed: int = 1) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = versions >= 0
    return TrainBatch(tokens, loss_mask, torch.zeros(B, T), versions, torch.ones(B, T),
                      torch.where(loss_mask, 0, -1))


def test_snapshot_matches_brute_force_reload_per_version() -> None:
    scorer, provider = TinyScorer(), SnapshotProvider(capacity=3)
    saved = {}
    for v in range(3):  # the driver's order: a batch at version v, then the update to v + 1
        saved[v] = {n: p.detach().clone() for n, p in scorer.named_weights().items()}
        provider.score(_batch(torch.full((B, T), v)), scorer)
        scorer.step(seed=v)
    # Rows span one, two and three versions (partial trajectories), position 0 is the prompt.
    versions = torch.tensor([[-1, 0, 0, 1, 1, 2, 2],
                             [-1, 1, 1, 1, 2, 2, 2],
                             [-1, 2, 2, 2, 2, 2, -1],
                             [-1, 0, 1, 2, 0, 1, 2]])
    batch = _batch(versions)
    assert scorer.version == 3 and provider.store.versions == [0, 1, 2]
    # Scoring at version 3 records v3 first, which evicts v0 from a 3-version store.
    with pytest.raises(MissingSnapshotError, match="no weight snapshot of version 0; kept: \\[1, 2, 3\\]"):
        provider.score(batch, scorer)
    provider = SnapshotProvider(capacity=4)
    for v, weights in saved.items():
        provider.store.record(v, weights)
    got = provider.logp_ref(batch, torch.zeros(B, T), scorer.version, provider.score(batch, scorer))
    expected = torch.zeros(B, T, dtype=torch.float32)
    for v, weights in saved.items():
        fresh = TinyLM()
        fresh.load_state_dict(weights)  # brute force: a new model per version
        with torch.no_grad():
            expected = torch.where(batch.loss_mask & (versions == v), fresh(batch.tokens).float(), expected)
    assert torch.equal(got, expected)


def test_snapshot_state_round_trip() -> None:
    scorer, provider = TinyScorer(), SnapshotProvider(capacity=2)
    for v in range(3):
        provider.score(_batch(torch.full((B, T), v)), scorer)
        scorer.step(seed=10 + v)
    smaller = SnapshotProvider(capacity=1)  # a resume with a smaller maxVersions keeps the newest
    smaller.load_state_dict(provider.state_dict())
    assert provider.store.versions == [1, 2] and smaller.store.versions == [2]
    for name, value in provider.store.get(2).items():
        assert torch.equal(smaller.store.get(2)[name], value)


def test_ewma_provider_owns_theta_prox_and_checkpoints_it() -> None:
    scorer = TinyScorer()
    provider = EwmaProvider(EwmaSpec(), max_staleness=2)  # beta = 2 / (2 + 2) = 0.5
    assert provider.state_dict() == {"ewma": None}  # nothing before the first step
    batch = _batch(torch.full((B, T), 0))
    theta0 = {n: p.detach().clone() for n, p in scorer.named_weights().items()}
    # theta_prox starts as the live weights: the first reference is the live forward.
    assert torch.equal(provider.score(batch, scorer), scorer.logprobs(batch.tokens))
    scorer.step(seed=3)
    assert provider.observe_update(batch, scorer, keep_ratio=1.0) == ""
    # Bias-corrected: weights 0.5 and 1 -> theta_prox = theta0 / 3 + 2 theta1 / 3.
    assert provider.controller is not None
    for name, p1 in scorer.named_weights().items():
        torch.testing.assert_close(provider.controller.params[name], theta0[name] / 3 + 2 * p1.detach() / 3,
                                   rtol=1e-6, atol=1e-7)
    restored = EwmaProvider(EwmaSpec(), max_staleness=2)
    restored.load_state_dict(provider.state_dict())
    assert torch.equal(restored.score(batch, scorer), provider.score(batch, scorer))


def test_forward_references_need_their_forward_and_current_is_the_detached_theta() -> None:
    batch = _batch(torch.full((B, T), 0))
    theta = torch.randn(B, T, requires_grad=True)
    ref = CurrentProvider().logp_ref(batch, theta, 0, None)
    assert torch.equal(ref, theta) and not ref.requires_grad
    for provider in (EwmaProvider(EwmaSpec(), max_staleness=1), SnapshotProvider(capacity=2)):
        with pytest.raises(ValueError, match="call score\\(\\) before logp_ref\\(\\)"):
            provider.logp_ref(batch, theta, 0, None)
    mu = batch.logp_mu - 0.5 * batch.loss_mask  # behavior: logp_ref is logp_mu itself, not theta
    behavior = make_provider("behavior").logp_ref(dataclasses.replace(batch, logp_mu=mu), theta, 0, None)
    assert torch.equal(behavior, mu)


def test_snapshot_records_the_new_version_at_the_update_and_retains_the_live_set() -> None:
    from asyncrl.trainer.oldlogits.protocol import VersionRetention, retain_versions

    scorer, provider = TinyScorer(), SnapshotProvider(capacity=4)
    batch = _batch(torch.full((B, T), 0))
    provider.score(batch, scorer)
    for v in range(3):
        scorer.step(seed=20 + v)
        provider.observe_update(batch, scorer, keep_ratio=1.0)  # rollout gets v + 1 now: kept now
    assert provider.store.versions == [0, 1, 2, 3]
    assert isinstance(provider, VersionRetention)
    retain_versions(provider, {1, 3})
    assert provider.store.versions == [1, 3] and provider.resident().versions == 2
    ewma = EwmaProvider(EwmaSpec(), max_staleness=2)
    assert not isinstance(ewma, VersionRetention)
    retain_versions(ewma, {1})  # a provider without weight versions: nothing to release
    got = provider.score(_batch(torch.tensor([[-1, 1, 1, 3, 3, 3, 3]] * B)), scorer)
    assert got is not None and bool((got[:, 1:] != 0).all())
