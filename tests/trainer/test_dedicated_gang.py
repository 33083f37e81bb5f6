"""A dedicated scorer as a tensor-parallel gang (``oldLogits.dedicated.tensorParallel: 2``): two real gloo ranks
(Ray actors, megatron's TP=2 state inside the gang) score what one process scores, and a gang that loses a rank
is replaced as a whole with its unanswered work re-queued."""

from typing import Any

import pytest
import torch

from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.megatron import compat
from asyncrl.trainer.megatron.parallel import Layout
from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer
from asyncrl.trainer.oldlogits.dedicated_fleet import DedicatedFleet
from asyncrl.trainer.oldlogits.dedicated_plan import DedicatedPlan
from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings
from tests.trainer.test_dedicated import SPEC, VOCAB, _check_against_brute_force, _schedule, _traj

pytestmark = pytest.mark.slow  # a local Ray and two-rank gangs: ~40 s on a loaded 2-core machine

Weights = dict[str, torch.Tensor]


@pytest.fixture(scope="module")
def versions() -> dict[int, Weights]:
    compat.init_megatron(seed=0, device="cpu")
    actor = MegatronActor.from_spec(SPEC, VOCAB, num_threads=torch.get_num_threads())
    w0 = {k: v for k, v in actor.hf_state_dict().items() if k != "lm_head.weight"}
    out, g = {0: w0}, torch.Generator().manual_seed(9)
    for v in (1, 2, 3):
        out[v] = {k: t + 0.05 * torch.randn(t.shape, generator=g) for k, t in out[v - 1].items()}
    out[-1] = {"actor_logp_probe": actor.logprobs(torch.tensor([[1, 5, 7, 2, 9, 3]]))}  # the actor's own, at v0
    return out


def _spawn_gang(replica: int) -> Any:
    import ray

    from asyncrl.trainer.driver.hosts.actor_group import start_gang

    cls: Any = ray.remote(DedicatedScorer)
    settings = ScorerSettings.from_spec(SPEC, VOCAB, device="cpu", token_budget=64)

    def start_rank(r: int, init_method: str) -> Any:
        return cls.options(num_cpus=0.5, max_concurrency=1).remote(
            settings, num_threads=1, layout=Layout(tp=2, rank=r, world=2, init_method=init_method))

    return start_gang(2, {}, start_rank, role=f"dedicated scorer {replica}", after="replaced by the fleet")


def test_a_tp2_gang_scores_what_one_process_and_the_actor_score(versions: dict[int, Weights], ray_session) -> None:
    import ray

    gang = _spawn_gang(0)
    one = DedicatedScorer(ScorerSettings.from_spec(SPEC, VOCAB, device="cpu", token_budget=64))
    try:
        segs = [([1, 5, 7, 2, 9, 3], [1, 2, 3, 4, 5]), ([4, 4, 8, 1], [2, 3]), ([0, 3, 6, 9, 12, 15, 18, 21], [7])]
        for v in (0, 2):
            ref = ray.put({k: t.numpy() for k, t in versions[v].items()})
            ray.get(gang.push_version.remote([ref], v))
            ray.get(gang.advance_to.remote(v))
            one.push_version(versions[v], v)
            one.advance_to(v)
            got, want = ray.get(gang.score.remote(segs, v)), one.score(segs, v)
            diff = max(abs(a - b) for g, w in zip(got, want, strict=True) for a, b in zip(g, w, strict=True))
            assert diff <= 1e-5, (v, diff)
            if v == 0:  # and the actor's own log-probs of version 0 (its forward, no batching difference)
                actor = versions[-1]["actor_logp_probe"][0, 1:].tolist()
                assert max(abs(a - b) for a, b in zip(got[0], actor, strict=True)) <= 1e-5
        state = ray.get(gang.state.remote())
        assert state.resident_version == 2 and state.advances == 2 and state.queued_host_bytes == 0
        assert state.ranks == 2
        # every rank holds only its slice: rank 1's first attention weight is half of the whole
        shapes = ray.get([r.__ray_call__.remote(lambda s: s.scorer._gpt.decoder.layers[0].self_attention
                                                 .linear_qkv.weight.shape[0]) for r in gang.ranks])
        assert shapes[0] == shapes[1] and 2 * shapes[0] == ray.get(
            gang.ranks[0].__ray_call__.remote(lambda s: s.scorer.settings.arch.hidden_size * 2))
    finally:
        gang.kill()


def test_a_gang_that_loses_a_rank_is_replaced_and_its_work_requeued(versions: dict[int, Weights],
                                                                    ray_session) -> None:
    import ray

    plan = DedicatedPlan(replicas=1, max_lag_versions=1, start_version=0)
    refs = {v: ray.put({k: t.numpy() for k, t in w.items()}) for v, w in versions.items() if v >= 0}
    fleet = DedicatedFleet(plan, [_spawn_gang(0)], _spawn_gang)
    fleet.weights[0] = refs[0]
    killed = False

    def publish(v: int) -> None:
        fleet.publish(v, refs[v])

    def hold_in_score(scorer: Any) -> None:  # runs inside rank 1 (__ray_call__): its next scoring never ends
        import threading

        def held(*_: Any, **__: Any) -> Any:
            threading.Event().wait(300)  # killed long before: the rank dies holding this call's work
            raise RuntimeError("the test's kill never came")

        scorer.scorer.score_segments = held

    def returned(call: str, trajs: list[Trajectory]) -> None:
        nonlocal killed
        assert plan.returned(call, trajs) == []
        if not killed:  # ordered before the scoring calls dispatch sends next (same caller, one call at a time)
            ray.get(fleet.handles[0].ranks[1].__ray_call__.remote(hold_in_score))
        fleet.dispatch()
        if not killed and fleet.refs():  # rank 1 dies while the gang holds scoring work
            ray.kill(fleet.handles[0].ranks[1], no_restart=True)
            killed = True

    try:
        trajs = _schedule(plan, fleet.dispatch, publish, returned)
        assert killed
        gate = plan.gate(trajs, actor_version=3)
        while gate.wait:
            done, _ = ray.wait(fleet.refs(), num_returns=1, timeout=120)
            assert done, f"no scorer answered within 120 s; {plan.state()}"
            fleet.collect(done[0])
            gate = plan.gate(trajs, actor_version=3)
        assert fleet.replaced == 1 and fleet.raised_replacements == 0  # counted once, as a death
        assert plan.state().requeued_tokens_total > 0  # it died holding work
        _check_against_brute_force(trajs, versions)
    finally:
        for h in fleet.handles:
            h.kill()


def test_a_gang_whose_rank_raises_is_replaced_counted_and_not_forever(versions: dict[int, Weights],
                                                                      ray_session) -> None:
    import ray

    def raise_in_score(scorer: Any) -> None:  # runs inside a rank (__ray_call__; nested: pickled by value)
        def boom(*_: Any, **__: Any) -> Any:
            raise RuntimeError("injected: this rank cannot score")

        scorer.scorer.score_segments = boom

    plan = DedicatedPlan(replicas=1, max_lag_versions=1, start_version=0)
    fleet = DedicatedFleet(plan, [_spawn_gang(0)], _spawn_gang)
    fleet.weights[0] = ray.put({k: t.numpy() for k, t in versions[0].items()})

    def score_once(call: str) -> None:
        """Bootstrap the gang (push, advance), make its rank 1 raise, then hand it one trajectory to score."""
        fleet.dispatch()
        while fleet.refs():
            fleet.collect(ray.wait(fleet.refs(), num_returns=1, timeout=120)[0][0])
        ray.get(fleet.handles[0].ranks[1].__ray_call__.remote(raise_in_score))
        plan.admitted(call, 0)
        assert plan.returned(call, [_traj(call, [0, 0, 0], 1)]) == []
        fleet.dispatch()
        (ref,) = fleet.refs()
        ray.wait([ref], timeout=120)
        fleet.collect(ref)

    try:
        score_once("a")
        assert fleet.replaced == 1 and fleet.raised_replacements == 1  # the gang failed as one, replaced
        assert fleet.handles[0].ranks[1] is not None and plan.state().requeued_tokens_total > 0
        fleet.MAX_RAISED_REPLACEMENTS = 1  # a gang that keeps raising is a bug: no endless restarts
        with pytest.raises(RuntimeError, match="failed by a raise again after 1 replacements"):
            score_once("b")
    finally:
        for h in fleet.handles:
            h.kill()
