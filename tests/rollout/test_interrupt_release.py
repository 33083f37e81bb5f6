"""interrupt() at a token boundary, resuming interrupted episodes, release()/acquire()."""

import random
from collections.abc import Callable

import pytest
import torch

from asyncrl.api.model_arch import LlamaArch
from asyncrl.rollout.engine import EngineReleasedError, RolloutEngine
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.trajectory import TrajectoryStatus

Weights = Callable[[int], dict[str, torch.Tensor]]


def test_hf_engine_implements_the_protocol(arch: LlamaArch) -> None:
    assert isinstance(HFEngine(arch), RolloutEngine)


def test_interrupt_returns_in_flight_snapshots_and_episodes_resume(
    arch: LlamaArch, weights: Weights, script_env: type, generate_in_background
) -> None:
    eng = HFEngine(arch, dtype="float32", seed=0)
    eng.load_weights(weights(0), version=0)
    assert eng.interrupt() == []  # idle: nothing in flight
    th, eps = generate_in_background(eng, started_after=3, until_interrupt=True)
    snaps = eng.interrupt(timeout_s=10)
    th.join(10)
    assert not th.is_alive()
    assert len(snaps) == 4 and eng.counters.interrupts == 1
    for snap, e in zip(snaps, eps, strict=True):
        assert snap.status is TrajectoryStatus.INTERRUPTED and snap.traj_id == e.traj_id
        assert not e.done and snap.tokens == e.tokens  # the snapshot is exactly what was generated
        assert sum(snap.loss_mask) >= 3
    # resume under a new version: the prefix keeps its tokens, versions and mu
    eng.update_weights(weights(1), version=1)
    eng.generate(eps, max_new_tokens=40)
    for snap, e in zip(snaps, eps, strict=True):
        t = e.to_trajectory()
        assert e.done and t.tokens[: len(snap.tokens)] == snap.tokens
        assert (
            t.versions[: len(snap.tokens)] == snap.versions and t.logp_mu[: len(snap.tokens)] == snap.logp_mu
        )
        assert set(t.versions[len(snap.tokens) :]) <= {-1, 1}


def _tokens(eng: HFEngine, env_cls: type) -> list[tuple[list[int], list[float]]]:
    eps = [Episode.start(f"t{i}", "g", env_cls(), random.Random(i)) for i in range(6)]
    eng.generate(eps, max_new_tokens=16, seed=5)
    return [(e.tokens, e.logp_mu) for e in eps]


@pytest.mark.parametrize("fp32_head", [False, True])
def test_release_acquire_generates_identically(
    arch: LlamaArch, weights: Weights, script_env: type, fp32_head: bool
) -> None:
    eng = HFEngine(arch, dtype="bfloat16", seed=0, fp32_head=fp32_head)
    eng.load_weights(weights(0), version=4)
    before = _tokens(eng, script_env)
    eng.release()
    assert eng.released
    with pytest.raises(EngineReleasedError, match="acquire"):
        _tokens(eng, script_env)
    eng.acquire()
    assert _tokens(eng, script_env) == before and eng.version == 4


def test_update_while_released_applies_on_acquire(
    arch: LlamaArch, weights: Weights, script_env: type
) -> None:
    ref = HFEngine(arch, dtype="float32", seed=0)
    ref.load_weights(weights(1), version=1)
    eng = HFEngine(arch, dtype="float32", seed=0)
    eng.load_weights(weights(0), version=0)
    eng.release()
    eng.update_weights(weights(1), version=1)
    assert eng.version == 1
    eng.acquire()
    assert _tokens(eng, script_env) == _tokens(ref, script_env)


def test_errors_name_the_fix(arch: LlamaArch, weights: Weights, script_env: type) -> None:
    eng = HFEngine(arch)
    with pytest.raises(RuntimeError, match="load_weights"):
        _tokens(eng, script_env)
    bad = dict(weights(0))
    bad.pop("model.norm.weight")
    bad["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(
        ValueError, match=r"missing \['model.norm.weight'\].*up_proj.weight: got shape \(3, 3\)"
    ):
        eng.load_weights(bad, version=0)


def test_hold_keeps_the_old_version_from_sampling_until_resume(
    arch: LlamaArch, weights: Weights, script_env: type
) -> None:
    eng = HFEngine(arch, dtype="float32", seed=0)
    eng.load_weights(weights(0), version=0)
    assert eng.interrupt(hold=True) == [] and eng.held  # idle: nothing in flight, but held
    eps = [Episode.start(f"t{i}", "g", script_env(), random.Random(i)) for i in range(3)]
    prompts = [list(e.tokens) for e in eps]
    # A generate arriving while held samples nothing and returns at once, its episodes resumable (a
    # caller waiting for it -- the driver before an interrupt-sync window -- is never blocked).
    assert eng.generate(eps, max_new_tokens=12) == eps
    assert [e.tokens for e in eps] == prompts and not any(e.done for e in eps)
    eng.update_weights(weights(1), version=1)  # the engine is not generating: applied now
    eng.resume()
    eng.generate(eps, max_new_tokens=12)
    assert not eng.held and all(e.done for e in eps)
    assert all(set(e.to_trajectory().sampled_versions) == {1} for e in eps)
