"""SegmentScorer: the training-side model outside the actor gives the actor's numbers, scores only the
tokens of its resident version, frees and rebuilds, and lives beside the transformers engine."""

import math
import random

import numpy as np
import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec, AsyncSpec
from asyncrl.api.model import ModelSpec
from asyncrl.api.task import TaskSpec
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.rollout.worker import RolloutWorker
from asyncrl.trainer.actor.megatron_actor import ActorSettings, MegatronActor
from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings, SegmentScorer

VOCAB = 40
SPEC = AsyncRLJobSpec.model_validate(
    {
        "correction": {"reference": "behavior"},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64},
        "task": {"temperature": 0.7},
        "train": {"learningRate": 1e-2, "seed": 3},
    }
)


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


@pytest.fixture(scope="module")
def actor() -> MegatronActor:
    return MegatronActor.from_spec(SPEC, VOCAB, num_threads=torch.get_num_threads())


def _scorer(token_budget: int = 16384) -> SegmentScorer:
    return SegmentScorer(ScorerSettings.from_spec(SPEC, VOCAB, token_budget=token_budget, device="cpu"))


def _traj(tid: str, versions: list[int], seed: int) -> Trajectory:
    rng = random.Random(seed)
    n = 3 + len(versions)
    return Trajectory(
        traj_id=tid, group_id=tid, task="t", tokens=[rng.randrange(VOCAB) for _ in range(n)], prompt_len=3,
        loss_mask=[False] * 3 + [True] * len(versions), versions=[-1] * 3 + versions,
        logp_mu=[0.0] * n, turn_ids=[-1] * 3 + [0] * len(versions),
    )


def test_settings_are_the_actor_s() -> None:
    mine, actors = ScorerSettings.from_spec(SPEC, VOCAB), ActorSettings.from_spec(SPEC, VOCAB)
    assert (mine.arch, mine.temperature, mine.seed) == (actors.arch, actors.temperature, actors.seed)


def test_scores_equal_the_actor_s_logprobs_on_the_same_weights(actor: MegatronActor) -> None:
    weights = {k: v.numpy() for k, v in actor.hf_state_dict().items()}  # what rollout receives
    scorer = _scorer()
    scorer.load(weights, version=0)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (5, 24), generator=g)
    # The same [B, T] input: bit for bit (same model code, weights, temperature 0.7).
    assert torch.equal(scorer.logprobs(tokens), actor.logprobs(tokens))
    expected = actor.logprobs(tokens)
    # Segments of different lengths, packed two ways (one forward; one per segment under a 24-token
    # budget): a GEMM may reduce in another order for another shape, so the bound is fp32 rounding.
    segments = [(tokens[i].tolist(), list(range(3, 24 - 3 * i))) for i in range(5)]
    for budget, forwards in ((16384, 1), (24, 5)):
        packed = _scorer(budget)
        packed.load(weights, version=0)
        values = packed.score_segments(segments)
        assert packed.forwards == forwards
        for i, (_, positions) in enumerate(segments):
            got = torch.tensor(values[i])
            want = expected[i, positions]
            assert torch.allclose(got, want, rtol=0.0, atol=2e-6), (budget, i, (got - want).abs().max())


def test_score_takes_the_unscored_tokens_of_the_resident_version_only(actor: MegatronActor) -> None:
    scorer = _scorer()
    scorer.load(actor.hf_state_dict(), version=3)
    a, b = _traj("a", [3, 3, 4, 4], seed=1), _traj("b", [4, 4], seed=2)
    a.set_logp_old([4], [-9.0])  # already scored elsewhere: not again
    out = scorer.score([a, b], version=3)
    assert [p for p, _ in out] == [[3], []]
    want = actor.logprobs(torch.tensor([a.tokens]))[0, 3]
    assert out[0][1] == [pytest.approx(float(want), abs=2e-6)] and out[1][1] == []
    with pytest.raises(ValueError, match="asked to score version 4 but version 3 is resident"):
        scorer.score([b], version=4)
    with pytest.raises(ValueError, match=r"segment 0: positions \[0, 9\] outside 1..6"):
        scorer.score_segments([(a.tokens, [0, 9])])


def test_free_drops_the_model_and_load_rebuilds_it(actor: MegatronActor) -> None:
    scorer = _scorer()
    with pytest.raises(RuntimeError, match="no weights are resident; call load"):
        scorer.score_segments([([1, 2, 3], [1])])
    scorer.load(actor.hf_state_dict(), version=0)
    first = scorer.score_segments([([1, 2, 3, 4], [1, 2, 3])])
    assert scorer.built and scorer.build_seconds > 0 and scorer.load_seconds > 0
    scorer.free()
    assert not scorer.built and scorer.version == -1
    with pytest.raises(RuntimeError, match="no weights are resident"):
        scorer.score_segments([([1, 2, 3], [1])])
    scorer.load(actor.hf_state_dict(), version=1)
    assert scorer.builds == 2 and scorer.version == 1
    assert scorer.score_segments([([1, 2, 3, 4], [1, 2, 3])]) == first


def test_beside_the_transformers_engine_in_one_process() -> None:
    """What a rollout worker's host does during interrupt-sync: generate, build the scorer, score the
    episodes' tokens, generate again. The scorer leaves the process's random stream and the engine
    alone, and its log-probs are the fp32 engine's up to kernel rounding."""
    task = TaskSpec(name="calculator", group_size=2, max_new_tokens=12, temperature=0.7)
    model = ModelSpec(hidden_size=64, ffn_hidden_size=128, rollout_dtype="float32")
    lm = build_model(_worker(task, model).arch, seed=7)
    with torch.no_grad():
        lm.model.embed_tokens.weight.mul_(8.0)  # sharper than N(0, 0.02) (tied: the head too)
    hf = {k: v.clone() for k, v in lm.state_dict().items()}
    before = _worker(task, model, hf).generate(2)
    rng_state = torch.get_rng_state()
    scorer = SegmentScorer(ScorerSettings(arch=_worker(task, model).arch, temperature=0.7, device="cpu"))
    scorer.load({k: v.numpy() for k, v in hf.items()}, version=0)
    assert torch.equal(torch.get_rng_state(), rng_state)  # megatron's seeding did not leak out
    worst = 0.0
    for t, (positions, values) in zip(before, scorer.score(before, version=0), strict=True):
        assert positions == [i for i, m in enumerate(t.loss_mask) if m] and positions
        worst = max(worst, max(abs(v - t.logp_mu[p]) for p, v in zip(positions, values, strict=True)))
    print(f"max |megatron - transformers| {worst:.2e}")
    assert worst < 1e-5, worst  # transformers vs megatron, both fp32: other kernels, same model (2.4e-7 seen)
    after = _worker(task, model, hf).generate(2)
    assert [t.tokens for t in after] == [t.tokens for t in before]  # the engine is unaffected
    assert all(math.isfinite(x) for t in after for x in t.logp_mu)


def _worker(task: TaskSpec, model: ModelSpec, weights: dict | None = None) -> RolloutWorker:
    w = RolloutWorker(task, model, AsyncSpec(), worker_index=0, seed=11)
    if weights is not None:
        w.load_weights(weights, version=0)
    return w


def test_weights_of_any_float_dtype_load_as_fp32(actor: MegatronActor) -> None:
    hf = actor.hf_state_dict()
    scorer = _scorer()
    scorer.load({k: v.numpy().astype(np.float64) for k, v in hf.items()}, version=0)
    ref = _scorer()
    ref.load(hf, version=0)
    seg = [([5, 6, 7, 8, 9], [1, 2, 3, 4])]
    assert scorer.score_segments(seg) == ref.score_segments(seg)
