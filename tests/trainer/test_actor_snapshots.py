"""Exact old logits by weight snapshots: each token scored under its own version's weights."""

import dataclasses

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.batch import TrainBatch
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.oldlogits import MissingSnapshotError, WeightSnapshots

VOCAB = 40
B, T, PROMPT = 6, 14, 4


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


def _actor(max_staleness: int = 2, max_versions: int = 0) -> MegatronActor:
    spec = AsyncRLJobSpec.model_validate(
        {
            "correction": {"reference": "exact"},
            "oldLogits": {"strategy": "snapshot", "snapshot": {"maxVersions": max_versions}},
            "async": {"maxStaleness": max_staleness},
            "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 1, "ffnHiddenSize": 64},
            "train": {"learningRate": 1e-2, "seed": 5},
        }
    )
    return MegatronActor.from_spec(spec, VOCAB, num_threads=torch.get_num_threads())


def _batch(seed: int, version: int, logp_mu: torch.Tensor | None = None) -> TrainBatch:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)
    loss_mask = torch.zeros(B, T, dtype=torch.bool)
    loss_mask[:, PROMPT:] = True
    versions = torch.where(loss_mask, torch.full((B, T), version), torch.full((B, T), -1))
    adv = torch.tensor([1.0, -1.0] * (B // 2))[:, None].expand(B, T).contiguous()
    seg = torch.where(loss_mask, 0, -1)
    mu = torch.zeros(B, T) if logp_mu is None else logp_mu
    return TrainBatch(tokens, loss_mask, mu * loss_mask, versions, adv, seg)


def _on_policy(actor: MegatronActor, seed: int, version: int) -> TrainBatch:
    """A batch whose mu is the actor's own current log-probs (so the mask keeps it and it trains)."""
    batch = _batch(seed, version)
    return dataclasses.replace(batch, logp_mu=actor.logprobs(batch.tokens) * batch.loss_mask)


class _Spy:
    def __init__(self, monkeypatch) -> None:
        import asyncrl.trainer.correction as correction

        self._real = correction.correction_loss
        self.refs: list[torch.Tensor] = []
        monkeypatch.setattr(correction, "correction_loss", self)

    def __call__(self, logp_theta, logp_ref, *args, **kwargs):
        self.refs.append(logp_ref.clone())
        return self._real(logp_theta, logp_ref, *args, **kwargs)


def test_multi_version_batch_gets_each_tokens_own_version(monkeypatch) -> None:
    actor = _actor()
    probe = _batch(seed=1, version=0)
    # Log-probs of the probe tokens under v0, v1 and v2, recorded as the actor moves on.
    by_version = {}
    for v, seed in enumerate((10, 11)):
        by_version[v] = actor.logprobs(probe.tokens)
        assert actor.train_step(_on_policy(actor, seed, v)).applied
    by_version[2] = actor.logprobs(probe.tokens)
    assert actor.version == 2
    assert not torch.equal(by_version[0], by_version[1])

    # One batch spanning three versions, partial trajectories included (row 0 has all three).
    versions = probe.versions.clone()
    versions[:, PROMPT : PROMPT + 3] = 0
    versions[:, PROMPT + 3 : PROMPT + 7] = 1
    versions[:, PROMPT + 7 :] = 2
    versions[3:, PROMPT:] = 1  # rows 3.. are single-version
    expected = torch.zeros(B, T)
    for v, logp in by_version.items():
        expected = torch.where(probe.loss_mask & (versions == v), logp, expected)
    # mu = the exact training-side old log-probs: a perfect engine, so r_d must be exactly 1.
    batch = dataclasses.replace(probe, versions=versions, logp_mu=expected.clone())
    weights_before = [p.detach().clone() for p in actor._params]
    spy = _Spy(monkeypatch)
    m = actor.train_step(batch)
    torch.testing.assert_close(spy.refs[-1], expected, rtol=0.0, atol=1e-6)
    assert m.reference == "exact" and m.correction.keep_ratio == 1.0
    assert abs(m.correction.rd_max - 1.0) < 1e-5 and abs(m.correction.rd_min - 1.0) < 1e-5
    # The swaps restored the live weights before the update: the step moved from v2's weights.
    assert actor.version == 3
    # No live set: the newest W + 1 = 3 stay; v3 was recorded at the update (rollout receives it now).
    assert actor.old_logits.store.versions == [1, 2, 3]
    assert any(not torch.equal(a, p) for a, p in zip(weights_before, actor._params, strict=True))


def test_a_version_older_than_the_kept_window_fails_loudly() -> None:
    actor = _actor(max_staleness=1)  # keeps W + 1 = 2 versions
    for v, seed in enumerate((20, 21, 22)):
        actor.train_step(_on_policy(actor, seed, v))
    with pytest.raises(MissingSnapshotError, match="no weight snapshot of version 0"):
        actor.train_step(_on_policy(actor, 23, 0))


def test_snapshot_store_evicts_oldest_and_counts_bytes() -> None:
    store = WeightSnapshots(capacity=2)
    w = {"a": torch.ones(3), "b": torch.zeros(2, 2)}
    for v in range(4):
        store.record(v, w)
    assert store.versions == [2, 3]
    assert store.nbytes == 2 * (3 + 4) * 4  # two versions x 7 fp32 values
    w["a"].add_(1.0)
    assert torch.equal(store.get(3)["a"], torch.ones(3))  # a copy, not a view of the live weights
    with pytest.raises(MissingSnapshotError, match="kept: \\[2, 3\\]"):
        store.get(1)


def test_snapshots_survive_a_checkpoint(tmp_path) -> None:
    actor = _actor(max_staleness=1)  # keeps W + 1 = 2 versions
    for v, seed in enumerate((30, 31)):
        actor.train_step(_on_policy(actor, seed, v))
    probe = _on_policy(actor, 32, 1)  # scored under v1 below, after the resume
    v1 = actor.old_logits.store.get(1)
    actor.save_checkpoint(str(tmp_path / "ckpt"))

    fresh = _actor(max_staleness=1)
    fresh.load_checkpoint(str(tmp_path / "ckpt"))
    assert fresh.version == 2 and fresh.old_logits.store.versions == [1, 2]  # v2 recorded at its update
    for name, value in v1.items():
        assert torch.equal(fresh.old_logits.store.get(1)[name], value), name
    assert fresh.train_step(probe).applied  # a resumed run still scores tokens of the version before it

    warm = _actor(max_staleness=1)
    warm.load_checkpoint(str(tmp_path / "ckpt"), old_logits=False)  # a warm start: the provider starts fresh
    assert warm.old_logits.store.versions == []


def _swap_in_place_logprobs(actor: MegatronActor, weights, tokens: torch.Tensor) -> torch.Tensor:
    """The scoring logprobs_under replaced: copy ``weights`` into the live model, forward, copy back."""
    with torch.no_grad():
        saved = {n: p.detach().clone() for n, p in actor.named_weights().items()}
        for n, p in actor.named_weights().items():
            p.copy_(weights[n])
        try:
            return actor.logprobs(tokens)
        finally:
            for n, p in actor.named_weights().items():
                p.copy_(saved[n])


def test_functional_scoring_is_bit_identical_to_the_swap_and_leaves_training_unchanged() -> None:
    a, b = _actor(), _actor()  # same seed: identical weights
    other = {n: p.detach() + 0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1))
             for n, p in a.named_weights().items()}
    tokens = _batch(seed=40, version=0).tokens
    live = {n: p.detach().clone() for n, p in a.named_weights().items()}
    got = a.logprobs_under(other, tokens)
    assert torch.equal(got, _swap_in_place_logprobs(b, other, tokens))  # bit for bit (fp32, CPU)
    assert not torch.equal(got, a.logprobs(tokens))
    for n, p in a.named_weights().items():
        assert torch.equal(p, live[n]), n  # nothing written into the live weights
    # Scoring while autograd holds the live parameters (between forward and backward) changes nothing:
    # a's gradient step equals b's, which scored nothing.
    batch = _on_policy(a, 41, 0)
    logp = a._logprobs(batch.tokens, 1.0)
    a.logprobs_under(other, tokens)
    (-(logp * batch.loss_mask).sum()).backward()
    grads = [p.main_grad.clone() if hasattr(p, "main_grad") else p.grad.clone() for p in a._params]
    a._optimizer.zero_grad()
    logp_b = b._logprobs(batch.tokens, 1.0)
    (-(logp_b * batch.loss_mask).sum()).backward()
    for g, p in zip(grads, b._params, strict=True):
        assert torch.equal(g, p.main_grad if hasattr(p, "main_grad") else p.grad)
    b._optimizer.zero_grad()
    ma, mb = a.train_step(batch), b.train_step(batch)
    assert ma.loss == mb.loss and ma.grad_norm == mb.grad_norm
    for pa, pb in zip(a._params, b._params, strict=True):
        assert torch.equal(pa, pb)


def _disk_actor(work_dir: str | None, max_staleness: int = 1) -> MegatronActor:
    from asyncrl.api.old_logits import OldLogitsSpec, SnapshotSpec

    base = _actor(max_staleness=max_staleness)
    base.close()
    old_logits = OldLogitsSpec.model_construct(
        strategy=base.settings.old_logits.strategy,
        snapshot=SnapshotSpec.model_construct(max_versions=0, device="disk"),
    )
    return MegatronActor(dataclasses.replace(base.settings, old_logits=old_logits, work_dir=work_dir))


def test_disk_snapshots_score_like_memory_and_clean_up(tmp_path) -> None:
    memory, disk = _actor(max_staleness=1), _disk_actor(str(tmp_path / "snapshots"))
    for v, seed in enumerate((50, 51)):
        batch = _on_policy(memory, seed, v)
        mm, md = memory.train_step(batch), disk.train_step(batch, live_versions={v, v + 1})
        assert mm.loss == md.loss  # same weights, same pi_old whether the snapshot sat in memory or a file
    files = sorted(p.name for p in (tmp_path / "snapshots").iterdir())
    assert files == ["v1.safetensors", "v2.safetensors"]  # v0 released: its file is gone
    assert md.snapshot_resident_versions == 2 and md.snapshot_resident_bytes == sum(
        p.stat().st_size for p in (tmp_path / "snapshots").iterdir())
    probe = _on_policy(memory, 52, 1)
    disk.save_checkpoint(str(tmp_path / "ckpt"))
    disk.train_step(_on_policy(disk, 53, 2), live_versions={3})  # releases v1, v2 after the checkpoint
    assert sorted(p.name for p in (tmp_path / "snapshots").iterdir()) == ["v3.safetensors"]

    resumed = _disk_actor(str(tmp_path / "snapshots"))
    resumed.load_checkpoint(str(tmp_path / "ckpt"))  # rebuilds v1 and v2 from the checkpoint's tensors
    assert resumed.old_logits.store.versions == [1, 2]
    assert resumed.train_step(probe).loss == memory.train_step(probe).loss
    resumed.close()
    disk.close()
    assert list((tmp_path / "snapshots").iterdir()) == []

    private = _disk_actor(None)  # no work_dir: a private temporary folder, removed on close
    private.train_step(_on_policy(private, 54, 0))
    folder = private.old_logits.store.path(1).parent
    assert folder.is_dir() and len(list(folder.iterdir())) == 2
    private.close()
    assert not folder.exists()
