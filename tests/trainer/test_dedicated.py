"""The dedicated old-logit model: scores of partial trajectories spanning 2 and 3 versions equal the
brute force (a fresh model per version, ``tests/support/bruteforce.py``), in process and through Ray."""

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.trajectory import Trajectory
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.oldlogits.dedicated import DedicatedScorer
from asyncrl.trainer.oldlogits.dedicated_fleet import DedicatedFleet
from asyncrl.trainer.oldlogits.dedicated_plan import Advance, DedicatedPlan, Push, ScoreRequest
from asyncrl.trainer.oldlogits.segment_scorer import ScorerSettings
from tests.support.bruteforce import brute_force_logp_old

VOCAB = 40
SPEC = AsyncRLJobSpec.model_validate(
    {
        "correction": {"reference": "exact"},
        "oldLogits": {"strategy": "dedicated"},
        "model": {"preset": "tiny-llama", "hiddenSize": 32, "numLayers": 2, "ffnHiddenSize": 64},
        "task": {"temperature": 0.8},
        "train": {"learningRate": 1e-2, "seed": 4},
    }
)
Weights = dict[str, torch.Tensor]


pytestmark = pytest.mark.usefixtures("megatron_on_cpu")  # tests/trainer/conftest.py


@pytest.fixture(scope="module")
def versions() -> dict[int, Weights]:
    """HF weights of versions 0..3: the actor's, then seeded steps away from it (distinct policies)."""
    actor = MegatronActor.from_spec(SPEC, VOCAB, num_threads=torch.get_num_threads())
    # Tied embeddings: leave out lm_head.weight (the embedding itself), as safetensors files do.
    w0 = {k: v for k, v in actor.hf_state_dict().items() if k != "lm_head.weight"}
    out, g = {0: w0}, torch.Generator().manual_seed(9)
    for v in (1, 2, 3):
        out[v] = {k: t + 0.05 * torch.randn(t.shape, generator=g) for k, t in out[v - 1].items()}
    return out


def _settings() -> ScorerSettings:
    return ScorerSettings.from_spec(SPEC, VOCAB, device="cpu", token_budget=64)


def _traj(tid: str, versions: list[int], seed: int) -> Trajectory:
    """A prompt, then sampled tokens of ``versions`` with a tool-result token after the second one."""
    rng = random.Random(seed)
    tokens, mask, vers = [rng.randrange(VOCAB) for _ in range(3)], [False] * 3, [-1] * 3
    for i, v in enumerate(versions):
        if i == 2:
            tokens.append(rng.randrange(VOCAB))
            mask.append(False)
            vers.append(-1)
        tokens.append(rng.randrange(VOCAB))
        mask.append(True)
        vers.append(v)
    n = len(tokens)
    return Trajectory(traj_id=tid, group_id=tid, task="t", tokens=tokens, prompt_len=3, loss_mask=mask,
                      versions=vers, logp_mu=[0.0] * n, turn_ids=[0 if m else -1 for m in mask])


def _schedule(plan: DedicatedPlan, step: Callable[[], None], publish: Callable[[int], None],
              returned: Callable[[str, list[Trajectory]], None]) -> list[Trajectory]:
    """Call a admitted at 0 returns late (two partial rollouts spanning 2 and 3 versions, one of 0 only);
    call b admitted at 1 returns tokens of 1 and 2. The actor reaches version 3 meanwhile."""
    step()
    plan.admitted("a", 0)
    publish(1)
    plan.admitted("b", 1)
    publish(2)
    b = [_traj("b0", [1, 1, 2, 2, 2], 1), _traj("b1", [2, 2], 2)]
    returned("b", b)
    publish(3)
    a = [_traj("a0", [0, 0, 1, 1], 3), _traj("a1", [0, 1, 1, 2, 2, 2], 4), _traj("a2", [0, 0, 0], 5)]
    assert plan.resident == 0  # call a (admitted at 0) holds the scorers at 0
    returned("a", a)
    return a + b


def _check_against_brute_force(trajs: list[Trajectory], versions: dict[int, Weights]) -> None:
    T = max(len(t.tokens) for t in trajs)

    def pad(rows: list[list[Any]], fill: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([r + [fill] * (T - len(r)) for r in rows], dtype=dtype)

    tokens = pad([t.tokens for t in trajs], 0, torch.long)
    vers = pad([t.versions for t in trajs], -1, torch.long)
    mask = pad([t.loss_mask for t in trajs], False, torch.bool)
    got = pad([t.logp_old or [] for t in trajs], float("nan"), torch.float32)
    want = brute_force_logp_old(SPEC_ARCH, versions, tokens, vers, mask, temperature=0.8)
    assert not torch.isnan(got[mask]).any(), "a sampled token was never scored"
    diff = (got[mask] - want[mask]).abs().max()
    assert diff <= 1e-6, diff
    # The scores are the tokens' own versions', not any neighbour's: version 0 vs 1 differ a lot more.
    wrong = brute_force_logp_old(SPEC_ARCH, {v: versions[min(v + 1, 3)] for v in versions}, tokens, vers, mask,
                                 temperature=0.8)
    assert (got[mask] - wrong[mask]).abs().max() > 1e-3


SPEC_ARCH = ScorerSettings.from_spec(SPEC, VOCAB).arch


def test_in_process_scores_equal_the_brute_force(versions: dict[int, Weights]) -> None:
    plan = DedicatedPlan(replicas=2, max_lag_versions=1, start_version=0)
    scorers = [DedicatedScorer(_settings()) for _ in range(2)]
    answers: list[tuple[int, Any]] = []

    def step() -> None:
        for action in plan.next_actions():
            s = scorers[action.replica]
            if isinstance(action, Push):  # lazy: fetched when advanced to
                s.push_version(lambda v=action.version: versions[v], action.version)
            elif isinstance(action, Advance):
                s.advance_to(action.version)
            else:
                assert isinstance(action, ScoreRequest)
                answers.append((action.request_id, s.score(action.payload(), action.version)))

    def publish(v: int) -> None:
        plan.published(v)
        step()

    def returned(call: str, trajs: list[Trajectory]) -> None:
        assert plan.returned(call, trajs) == []
        step()

    trajs = _schedule(plan, step, publish, returned)
    for _ in range(20):  # the driver at the gate: deliver answers, dispatch, until the batch may train
        gate = plan.gate(trajs, actor_version=3)
        if not gate.wait:
            break
        while answers:
            plan.scored(*answers.pop(0))
        step()
    assert not gate.wait and gate.lag <= 1, gate.reason
    _check_against_brute_force(trajs, versions)
    states = [s.state() for s in scorers]
    assert sum(s.scored_tokens for s in states) == sum(sum(t.loss_mask) for t in trajs)  # each once
    assert {s.resident_version for s in states} == {plan.resident} and plan.resident >= 2
    assert all(s.queued_host_bytes == 0 for s in states)  # lazy weights cost nothing until advanced to


def test_scorer_refuses_versions_it_cannot_hold(versions: dict[int, Weights]) -> None:
    s = DedicatedScorer(_settings())
    s.push_version({k: v.numpy() for k, v in versions[0].items()}, 0)
    s.push_version({k: v.numpy() for k, v in versions[1].items()}, 1)
    state = s.state()
    assert state.queued_versions == (0, 1) and state.resident_version == -1
    assert state.queued_host_bytes == 2 * sum(v.numel() * 4 for v in versions[0].values())
    with pytest.raises(KeyError, match=r"version 2 was never pushed; queued versions \[0, 1\], resident -1"):
        s.advance_to(2)
    s.advance_to(1)  # skips 0, which is dropped
    assert s.state().queued_versions == () and s.resident_version == 1
    with pytest.raises(ValueError, match="version 0 is not newer than the resident version 1"):
        s.push_version({}, 0)
    with pytest.raises(ValueError, match="asked for version 0 but version 1 is resident"):
        s.score([([1, 2, 3], [1, 2])], 0)
    with pytest.raises(ValueError, match="one-element list around an ObjectRef, got a list of 2"):
        s.push_version([1, 2], 5)


@pytest.mark.slow  # 22 s on a loaded 2-core machine: two scorer processes start, one is killed and replaced
def test_through_ray_with_a_scorer_killed_mid_run(ray_session: None, versions: dict[int, Weights]) -> None:
    """The lead's wiring: ray.remote(DedicatedScorer), weights as ObjectRefs pushed lazily, one scorer
    killed for real while it holds work: it is replaced and bootstrapped, nothing is lost."""
    import ray

    remote = ray.remote(DedicatedScorer)

    def spawn(_: int) -> Any:
        return remote.options(num_cpus=0.5, max_restarts=0).remote(
            ScorerSettings.from_spec(SPEC, VOCAB, device="cpu"), num_threads=1
        )

    plan = DedicatedPlan(replicas=2, max_lag_versions=1, start_version=0)
    refs = {v: ray.put({k: t.numpy() for k, t in w.items()}) for v, w in versions.items()}
    fleet = DedicatedFleet(plan, [spawn(0), spawn(1)], spawn)
    fleet.weights[0] = refs[0]

    def publish(v: int) -> None:
        fleet.publish(v, refs[v])

    def returned(call: str, trajs: list[Trajectory]) -> None:
        assert plan.returned(call, trajs) == []
        fleet.dispatch()

    trajs = _schedule(plan, fleet.dispatch, publish, returned)
    ray.kill(fleet.handles[1], no_restart=True)  # its queued and running calls die with it
    gate = plan.gate(trajs, actor_version=3)
    while gate.wait:
        done, _ = ray.wait(fleet.refs(), num_returns=1, timeout=60)
        assert done, f"no scorer answered within 60 s; {plan.state()}"
        fleet.collect(done[0])
        gate = plan.gate(trajs, actor_version=3)
    assert fleet.replaced == 1 and plan.state().requeued_tokens_total > 0  # it died holding work
    _check_against_brute_force(trajs, versions)
    assert set(fleet.weights) == set(range(plan.resident, 4))  # older references dropped
    states = ray.get([h.state.remote() for h in fleet.handles])
    assert all(s.resident_version == plan.resident for s in states)


def test_weights_as_numpy_or_torch_score_the_same(versions: dict[int, Weights]) -> None:
    a, b = DedicatedScorer(_settings()), DedicatedScorer(_settings())
    a.push_version(versions[2], 2)
    b.push_version({k: np.ascontiguousarray(v.numpy()) for k, v in versions[2].items()}, 2)
    a.advance_to(2)
    b.advance_to(2)
    t = _traj("x", [2, 2, 2], 7)
    assert a.score([t], 2) == b.score([t], 2)
