"""The token loop frame both backends share (rollout/generation_loop.py): TokenBatch's start and boundary,
unit by unit on an engine without a model, then through both engines.

The vLLM engine runs here over :class:`FakeEngineProcess`, a stand-in for its engine process that speaks
the same commands without vLLM (the real one is tests/rollout/test_vllm_engine.py, marked ``vllm``): what
is tested through it is the engine's own loop (requests, aborts, resubmits, version stamps), not vLLM.
"""

import concurrent.futures
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

import asyncrl.rollout.vllm_engine as vllm_engine
from asyncrl.api.model_arch import LlamaArch
from asyncrl.rollout.engine import RolloutError
from asyncrl.rollout.envs.interface import AssistantMessage
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.generation_loop import Boundary, BoundaryEngine, TokenBatch
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.rollout.trajectory import NO_VERSION, TrajectoryStatus
from asyncrl.rollout.vllm_engine import VLLMEngine

Weights = Callable[[int], dict[str, torch.Tensor]]
DIGITS = TOKENIZER.encode("0123456789")


# ---------------------------------------------------------------------------------------- a model-free engine
@dataclass
class _Counters:
    swaps_in_flight: int = 0
    updates_superseded: int = 0
    interrupts: int = 0


class _Engine(BoundaryEngine[int, None]):
    """Weights are the number of tensors given; ``_loop_rows`` hands the test its :class:`TokenBatch`."""

    def __init__(self, loop: Callable[["_Engine", TokenBatch[int, None]], None]) -> None:
        self.counters = _Counters()
        self._version = NO_VERSION
        self._released = False
        self._init_boundary()
        self.loop = loop
        self.log: list[str] = []

    def _copy(self, state_dict: Mapping[str, torch.Tensor]) -> int:
        return len(state_dict)

    def _apply(self, weights: int, version: int) -> None:
        self.log.append(f"apply v{version}")
        self._version = version

    def _begin(self, seed: int | None) -> None:
        return None

    def _loop_rows(self, episodes: list[Episode], max_new_tokens: int, temperature: float, partial_rollout: bool,
                   state: None) -> None:
        def before() -> None:
            self.log.append(f"before swap (v{self._version} loaded)")

        self.loop(self, TokenBatch.start(self, episodes, max_new_tokens, partial_rollout=partial_rollout,
                                         before_swap=before))


def _episodes(script_env: type, n: int) -> list[Episode]:
    return [Episode.start(f"t{i}", "g", script_env(), random.Random(i)) for i in range(n)]


def _run(loop: Callable[[_Engine, TokenBatch[int, None]], None], eps: Sequence[Episode], *,
         max_new_tokens: int = 40, partial_rollout: bool = True) -> _Engine:
    eng = _Engine(loop)
    eng.load_weights({}, version=0)
    eng.generate(eps, max_new_tokens=max_new_tokens, partial_rollout=partial_rollout)
    return eng


def test_start_drops_finished_episodes_and_truncates_those_at_the_budget(script_env: type) -> None:
    done, full, fresh = _episodes(script_env, 3)
    done.finish(TrajectoryStatus.FINISHED, 1.0, True, "done before")
    for _ in range(4):  # 4 new tokens = the budget below
        full.add_sampled(DIGITS[1], 0, -0.5)
    full.pending = (AssistantMessage("<ans>1</ans>", ""), concurrent.futures.Future())  # awaiting its env
    seen: list[list[Episode]] = []
    _run(lambda eng, batch: seen.append(list(batch.rows)), [done, full, fresh], max_new_tokens=4)
    assert seen == [[fresh]]
    assert (full.done, full.status, full.reason, full.pending) == (True, TrajectoryStatus.TRUNCATED,
                                                                   "maxNewTokens reached", None)
    assert full.reward == script_env.truncated_reward == 0.0
    assert (done.status, done.reason) == (TrajectoryStatus.FINISHED, "done before")  # left as it was


def test_a_pending_update_swaps_at_the_boundary_after_before_swap(script_env: type) -> None:
    got: list[Boundary] = []

    def loop(eng: _Engine, batch: TokenBatch[int, None]) -> None:
        got.append(batch.boundary())
        eng.update_weights({"a": torch.zeros(1)}, version=1)  # generating: waits for the next boundary
        eng.update_weights({"a": torch.zeros(1)}, version=2)  # replaces it (superseded)
        assert eng.version == 0
        got.append(batch.boundary())
        got.append(batch.boundary())

    eng = _run(loop, _episodes(script_env, 2))
    assert got == [Boundary.SAMPLE, Boundary.SWAPPED, Boundary.SAMPLE]
    # before_swap runs while the old weights are still loaded (vLLM aborts its requests there), then v2 only
    assert eng.log == ["apply v0", "before swap (v0 loaded)", "apply v2"]
    assert (eng.version, eng.counters.swaps_in_flight, eng.counters.updates_superseded) == (2, 1, 1)


def test_without_partial_rollout_the_update_waits_for_the_end_of_the_batch(script_env: type) -> None:
    got: list[tuple[Boundary, int]] = []

    def loop(eng: _Engine, batch: TokenBatch[int, None]) -> None:
        eng.update_weights({}, version=1)
        got.append((batch.boundary(), eng.version))

    eng = _run(loop, _episodes(script_env, 2), partial_rollout=False)
    assert got == [(Boundary.SAMPLE, 0)]
    assert eng.version == 1 and eng.counters.swaps_in_flight == 0  # applied by generate() after the loop
    assert eng.log == ["apply v0", "apply v1"]


def test_a_swap_with_no_episode_in_flight_is_applied_not_counted_and_stops(script_env: type) -> None:
    got: list[Boundary] = []

    def loop(eng: _Engine, batch: TokenBatch[int, None]) -> None:
        eng.update_weights({}, version=1)
        batch.rows.clear()  # every episode ended at the last token
        got.append(batch.boundary())

    eng = _run(loop, _episodes(script_env, 2))
    assert got == [Boundary.STOP] and eng.version == 1 and eng.counters.swaps_in_flight == 0


def test_an_interrupt_stores_snapshots_of_the_rows_and_stops_after_a_due_swap(script_env: type) -> None:
    eps = _episodes(script_env, 3)
    eps[1].add_sampled(DIGITS[2], 0, -0.25)
    got: list[Boundary] = []

    def loop(eng: _Engine, batch: TokenBatch[int, None]) -> None:
        batch.rows.remove(eps[2])  # as if it had ended: not in flight, no snapshot
        eng.update_weights({}, version=1)
        eng._interrupt_req.set()  # what interrupt() asks (it then waits for generate to stop)
        got.append(batch.boundary())

    eng = _run(loop, eps)
    assert got == [Boundary.STOP]
    assert eng.version == 1 and eng.counters.swaps_in_flight == 1  # the swap is due first (2 rows in flight)
    assert eng.counters.interrupts == 1
    snaps = eng._snapshots
    assert [s.traj_id for s in snaps] == ["t0", "t1"]
    assert all(s.status is TrajectoryStatus.INTERRUPTED for s in snaps)
    assert snaps[1].tokens == eps[1].tokens and snaps[1].versions[-1] == 0 and snaps[1].logp_mu[-1] == -0.25
    assert not eps[0].done and not eps[1].done  # resumable


def test_failure_names_every_task_and_trajectory_in_flight(script_env: type) -> None:
    errors: list[RolloutError] = []
    _run(lambda eng, batch: errors.append(batch.failure("engine forward failed: boom")), _episodes(script_env, 3))
    (err,) = errors
    assert (err.task, err.traj_ids) == ("script", ("t0", "t1", "t2"))
    assert str(err) == "engine forward failed: boom [task script, trajectories t0, t1, t2]"


# ---------------------------------------------------------------------------------------- both engines
class FakeEngineProcess:
    """Stands in for vLLM's engine process (``rollout/vllm_server.py``'s commands), without vLLM.

    Each ``step`` gives every live request one token: a digit drawn from ``Random((seed, prefix length,
    weights))`` with log-prob ``-(1 + digit) / 10``, "weights" being the first value of the last tensor
    sent; a request finishes at its ``max_tokens``. ``log`` records every command in order.
    """

    hello: dict[str, Any] = {"platform": "cpu", "sleep_mode": False, "cpu_head_sizes": []}
    start_s = 0.0

    def __init__(self, python: str | None = None, *, env: dict[str, str] | None = None) -> None:
        self.log: list[str] = []
        self.live: dict[str, dict[str, Any]] = {}
        self.weights = 0.0

    def call(self, command: str, timeout_s: float = 600.0, **kw: Any) -> Any:
        self.log.append(command)
        if command == "build":
            return {"build_s": 0.0}
        if command == "abort_all":
            n, self.live = len(self.live), {}
            return n
        assert command == "step", command
        for rid in kw["aborts"]:
            self.live.pop(rid, None)
        for a in kw["adds"]:
            self.live[a["id"]] = {**a, "tokens": list(a["tokens"]), "made": 0}
        out = []
        for rid, r in list(self.live.items()):
            d = random.Random(f"{r['seed']}:{len(r['tokens'])}:{self.weights}").randrange(10)
            r["tokens"].append(DIGITS[d])
            r["made"] += 1
            if finished := r["made"] >= r["max_tokens"]:
                del self.live[rid]
            out.append((rid, [DIGITS[d]], [-(1 + d) / 10], finished))
        return out

    def send_weights(self, names: Sequence[str], arrays: Sequence[np.ndarray]) -> None:
        self.log.append("weights")
        self.weights = float(arrays[0].flat[0])

    def close(self) -> None:
        self.log.append("close")


@pytest.fixture
def make_engine(arch: LlamaArch, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], BoundaryEngine[Any, Any]]]:
    monkeypatch.setattr(vllm_engine, "EngineProcess", FakeEngineProcess)

    def make(kind: str) -> BoundaryEngine[Any, Any]:
        return HFEngine(arch, dtype="float32", seed=0) if kind == "hf" else VLLMEngine(arch, dtype="float32", seed=0)

    yield make


@pytest.fixture
def boundaries(monkeypatch: pytest.MonkeyPatch) -> list[Boundary]:
    """Every :meth:`TokenBatch.boundary` answer, in order (the method itself still runs)."""
    seen: list[Boundary] = []
    real = TokenBatch.boundary

    def spy(self: TokenBatch[Any, Any]) -> Boundary:
        seen.append(real(self))
        return seen[-1]

    monkeypatch.setattr(TokenBatch, "boundary", spy)
    return seen


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_both_engines_loop_over_the_shared_token_boundary(
    kind: str, make_engine: Callable[[str], Any], weights: Weights, script_env: type, boundaries: list[Boundary]
) -> None:
    eng = make_engine(kind)
    eng.load_weights(weights(0), version=0)
    fired: list[int] = []

    def hook(seen: int) -> None:
        if seen == 5 and not fired:
            fired.append(seen)
            eng.update_weights(weights(1), version=1)  # from inside generate(): due at the next boundary

    eps = [Episode.start(f"t{i}", "g", script_env(every=4, turns=2, on_step=hook if i == 0 else None),
                         random.Random(i)) for i in range(3)]
    eng.generate(eps, max_new_tokens=40)
    # one boundary before each forward (HF: prefills + decode steps) or vLLM step, and the last one stops
    forwards = eng.counters.prefills + eng.counters.decode_steps if kind == "hf" else eng.counters.steps
    assert len(boundaries) == forwards + 1 and boundaries[-1] is Boundary.STOP
    assert boundaries.count(Boundary.SWAPPED) == 1 == eng.counters.swaps_in_flight
    if kind == "vllm":  # every request is aborted right before the swap's weights go (then resubmitted)
        log = eng.proc.log
        swap = [i for i, c in enumerate(log) if c == "weights"][1]  # [0]: load_weights
        assert log[swap - 1 : swap + 2] == ["abort_all", "weights", "step"]
    for e in eps:  # ScriptEnv(every=4, turns=2): 9 agent tokens, all of them before or after the swap
        vs = e.to_trajectory().sampled_versions
        assert e.done and len(vs) == 9 and vs == sorted(vs) and set(vs) == {0, 1}


@pytest.mark.parametrize("kind", ["hf", "vllm"])
def test_a_swap_in_flight_equals_interrupt_update_resume_at_that_boundary(
    kind: str, make_engine: Callable[[str], Any], weights: Weights, script_env: type
) -> None:
    """Seeded: the update that lands at a token boundary mid-trajectory (partial rollout) gives exactly the
    tokens, log-probs and version stamps of an interrupt at that same boundary, then the update, then a
    resume: both recompute every prefix under the new weights and sample on from the same generator."""

    def run(in_flight: bool) -> tuple[BoundaryEngine[Any, Any], list[Episode]]:
        eng = make_engine(kind)
        eng.load_weights(weights(0), version=0)

        def hook(seen: int) -> None:
            if seen == 6:  # inside the step of episode 0's 6th agent token; the boundary follows
                if in_flight:
                    eng.update_weights(weights(1), version=1)
                else:
                    eng._interrupt_req.set()  # what interrupt() asks

        eps = [Episode.start(f"t{i}", "g", script_env(every=4, turns=3, on_step=hook if i == 0 else None),
                             random.Random(i)) for i in range(4)]
        eng.generate(eps, max_new_tokens=40)
        if not in_flight:
            assert not any(e.done for e in eps) and eng.counters.interrupts == 1
            eng.load_weights(weights(1), version=1)
            eng.generate(eps, max_new_tokens=40)
        return eng, eps

    (swapped, a), (resumed, b) = run(True), run(False)
    assert swapped.counters.swaps_in_flight == 1 and resumed.counters.swaps_in_flight == 0
    for x, y in zip(a, b, strict=True):
        assert x.done and y.done
        assert (x.tokens, x.versions, x.loss_mask, x.turn_ids) == (y.tokens, y.versions, y.loss_mask, y.turn_ids)
        assert x.logp_mu == y.logp_mu  # bitwise: the same forwards over the same prefixes
        assert set(x.to_trajectory().sampled_versions) == {0, 1}
