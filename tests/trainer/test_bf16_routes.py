"""Every correction route with a bf16 actor (``spec.actor.megatron.precision: bf16``, the GPU default; on the CPU
shim here: bf16 params, fp32 main params in megatron's optimizer), each against its exactness promise:

- ``snapshot`` (memory and disk): a stored version is the bf16 parameters as the actor held them, and its
  ``pi_old`` is the bf16 model's own log-probs of that version, bit for bit on the same batch;
- ``ewma``: ``theta_prox`` stays fp32, but its forward runs in the actor's dtype (the tensors rounded to bf16, as
  loading them into the model would): at version 0, where ``theta_prox`` is the live weights, the reference is
  the actor's own log-probs bit for bit;
- ``dedicated`` / ``interruptSync``: the scorer computes in the actor's precision (``ScorerSettings.bf16``, from
  ``spec.actor.megatron.precision``; ``auto``: bf16 when the actor pods have GPUs), so on the published weights of
  a version it gives the actor's log-probs bit for bit on the same ``[B, T]`` input, and within bf16 batching
  noise for packed segments (measured; an fp32 scorer is ~10x further off);
- the audit of ``current`` against exact ``pi_old`` on a batch of the actor's own version: distance 0.

One process, real megatron-core on the CPU shim, 2-3 steps per route; training applies and stays finite. The
snapshot and scorer cases (~8 s each on loaded cores) are slow; the DP=2 comparison is test_parallel_bf16.py.
"""

from dataclasses import replace
from typing import Any

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
from asyncrl.trainer.oldlogits.precision import actor_bf16
from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings, SegmentScorer
from asyncrl.trainer.oldlogits.snapshot import score_exact
from tests.support.parallel_ranks import VOCAB, _batch, _route_batch, route_job

BF16_SEGMENT_TOL = 2e-2  # nats: another batching than the actor's in bf16 (measured 0 here on the CPU; a GPU GEMM may
# reduce in another order for another shape; an fp32 scorer of this bf16 actor is 2.7e-3 off)


def _spec(route: str, precision: str = "bf16") -> AsyncRLJobSpec:
    cfg = route_job(route)
    cfg["actor"] = {"megatron": {"precision": precision}}
    return AsyncRLJobSpec.model_validate(cfg)


def _actor(route: str, tmp_path: Any = None, **changes: Any) -> MegatronActor:
    spec = _spec(route)
    settings = ActorSettings.from_spec(spec, VOCAB, work_dir=None if tmp_path is None else str(tmp_path))
    actor = MegatronActor(replace(settings, device="cpu", **changes))
    assert {p.dtype for p in actor._params} == {torch.bfloat16}
    return actor


def _train(actor: MegatronActor, steps: int) -> tuple[Any, list[torch.Tensor]]:
    """``steps`` steps on the harness's batches (tokens of the last 3 versions); the log-probs of the base
    batch's tokens at every version 0..steps (the actor's own forward)."""
    base = _batch(actor)
    seen = [actor.logprobs(base.tokens)]
    for step in range(steps):
        m = actor.train_step(_route_batch(base, step))
        assert m.applied and torch.isfinite(torch.tensor([m.loss, m.grad_norm])).all(), m
        seen.append(actor.logprobs(base.tokens))
    return base, seen


@pytest.mark.slow  # ~8 s each on loaded cores
@pytest.mark.parametrize("route", ["snapshot", "snapshot-disk"])
def test_snapshot_versions_are_the_bf16_models_own(route: str, tmp_path: Any) -> None:
    actor = _actor(route, tmp_path)
    base, seen = _train(actor, 3)
    store = actor.old_logits.store  # type: ignore[attr-defined]
    assert store.versions == [1, 2, 3]  # W + 1 = 3 resident
    for v in store.versions:
        weights = store.get(v)
        assert {t.dtype for t in weights.values()} == {torch.bfloat16}  # as the actor holds them
        assert torch.equal(actor.logprobs_under(weights, base.tokens), seen[v]), v
    # pi_old of a batch spanning versions 1..3 row by row (each version's forward over its rows only)
    versions = torch.where(base.loss_mask, 1 + torch.arange(base.tokens.shape[0])[:, None] % 3, -1)
    got = score_exact(store, actor, base.tokens, versions, base.loss_mask)
    want = torch.zeros_like(got)
    for v in (1, 2, 3):
        want = torch.where(base.loss_mask & (versions == v), seen[v], want)
    print(f"{route}: row subsets vs the whole batch, max |dlogp| {float((got - want).abs().max()):.1e}")
    assert torch.allclose(got, want, rtol=0.0, atol=BF16_SEGMENT_TOL)
    actor.close()


def test_ewma_theta_prox_scores_in_the_actors_dtype() -> None:
    actor = _actor("ewma")
    base = _batch(actor)
    provider = actor.old_logits
    first = provider.score(base, actor)  # theta_prox starts as the live weights (kept in fp32)
    theta = provider.controller.params  # type: ignore[attr-defined]
    assert {t.dtype for t in theta.values()} == {torch.float32}
    assert torch.equal(first, actor.logprobs(base.tokens))  # the bf16 model's own numbers, not an fp32 forward
    _train(actor, 2)
    theta = provider.controller.params  # type: ignore[attr-defined]
    rounded = {n: t.to(torch.bfloat16) for n, t in theta.items()}
    assert any(not torch.equal(t, r.float()) for t, r in zip(theta.values(), rounded.values(), strict=True))
    assert torch.equal(provider.score(base, actor), actor.logprobs_under(rounded, base.tokens))


def test_scorer_precision_follows_the_actor() -> None:
    assert ScorerSettings.from_spec(_spec("dedicated", "bf16"), VOCAB).bf16
    assert not ScorerSettings.from_spec(_spec("dedicated", "fp32"), VOCAB).bf16
    auto = _spec("dedicated", "auto")  # the actor's device decides, not the scorer's
    local = torch.cuda.is_available()  # locally every process sees this machine's devices
    assert actor_bf16(auto) == local and ScorerSettings.from_spec(auto, VOCAB).bf16 == local
    for gpus in (0, 1):  # in a cluster: whether the actor pods have GPUs
        pods = auto.model_copy(update={"actor": auto.actor.model_copy(update={"gpus_per_replica": gpus})})
        assert actor_bf16(pods, "cluster") == (gpus > 0)
        assert actor_bf16(_spec("dedicated", "fp32"), "cluster") is False


@pytest.mark.slow  # ~8 s each on loaded cores
@pytest.mark.parametrize("route", ["dedicated", "interruptSync"])
def test_the_scorer_gives_the_bf16_actors_logprobs(route: str) -> None:
    from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer

    actor = _actor(route)
    base, _ = _train(actor, 2)
    hf = actor.hf_state_dict()  # what the actor publishes (fp32 on the wire for the exact strategies)
    settings = ScorerSettings.from_spec(_spec(route), VOCAB, device="cpu")
    if route == "dedicated":
        ded = DedicatedScorer(settings)
        ded.push_version(hf, 2)
        ded.advance_to(2)
        scorer = ded.scorer
    else:  # the rollout host's scorer (trainer/driver/hosts/rollout_host.py builds it from the worker's arch)
        scorer = SegmentScorer(ScorerSettings(actor.settings.arch, temperature=1.0, seed=3, device="cpu",
                                              bf16=actor_bf16(_spec(route))))
        scorer.load(hf, 2)
    want = actor.logprobs(base.tokens)
    assert torch.equal(scorer.logprobs(base.tokens), want)  # same [B, T]: bit for bit
    fp32 = SegmentScorer(replace(settings, bf16=False))
    fp32.load(hf, 2)
    segments = [(base.tokens[i].tolist(), base.loss_mask[i].nonzero().squeeze(1).tolist())
                for i in range(base.tokens.shape[0])]
    diffs = {}
    for name, s in (("bf16", SegmentScorer(replace(settings, token_budget=16))), ("fp32", fp32)):
        if not s.built:
            s.load(hf, 2)
        values = s.score_segments(segments)
        diffs[name] = max(float((torch.tensor(values[i]) - want[i, pos]).abs().max())
                          for i, (_, pos) in enumerate(segments))
    print(f"{route}: packed segments vs the bf16 actor, max |dlogp|: bf16 scorer {diffs['bf16']:.1e}, "
          f"fp32 scorer {diffs['fp32']:.1e}")
    assert diffs["bf16"] < BF16_SEGMENT_TOL
    assert diffs["bf16"] < diffs["fp32"]


def test_the_audit_of_current_is_exact_on_its_own_version() -> None:
    cfg = route_job("audit")
    cfg["correction"] = {"reference": "current", "audit": {"everyNSteps": 1, "fraction": 1.0}}
    cfg["actor"] = {"megatron": {"precision": "bf16"}}
    settings = ActorSettings.from_spec(AsyncRLJobSpec.model_validate(cfg), VOCAB)
    actor = MegatronActor(replace(settings, device="cpu"))
    base = _batch(actor)
    for step in range(2):
        versions = torch.where(base.loss_mask, step, -1)  # every token of the actor's own version
        m = actor.train_step(replace(base, versions=versions))
        assert m.applied and m.audit is not None
        rec = m.audit.record()
        assert rec["audit_tokens"] == int(base.loss_mask.sum())
        assert rec["audit_abs_diff_p99"] == 0.0 and rec["audit_mask_disagree_tokens"] == 0, rec
    actor.close()
