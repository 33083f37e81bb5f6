"""Invariants of the lock-step loop over random batch shapes, prompt lengths, turn patterns and caps."""

import random
from collections.abc import Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.api.model_arch import LlamaArch
from asyncrl.rollout.episode import Episode
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.hf_model import build_model, load_hf_state_dict
from asyncrl.rollout.trajectory import NO_VERSION, TrajectoryStatus

Weights = Callable[[int], dict[str, torch.Tensor]]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.integers(1, 9),
    every=st.integers(1, 5),
    turns=st.integers(0, 3),
    cap=st.integers(1, 20),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    seed=st.integers(0, 10_000),
)
def test_loop_invariants(
    arch: LlamaArch,
    weights: Weights,
    script_env: type,
    batch: int,
    every: int,
    turns: int,
    cap: int,
    temperature: float,
    seed: int,
) -> None:
    eng = HFEngine(arch, dtype="float32", seed=seed)
    eng.load_weights(weights(0), version=7)
    rng = random.Random(seed)
    eps = [Episode.start(f"t{i}", "g", script_env(every=every, turns=turns), rng) for i in range(batch)]
    eng.generate(eps, max_new_tokens=cap, temperature=temperature)
    ref = build_model(arch)
    load_hf_state_dict(ref, weights(0))
    for e in eps:
        t = e.to_trajectory()  # validates that the per-token lists are aligned
        n_new = len(t.tokens) - t.prompt_len
        assert e.done and 1 <= n_new <= cap
        assert (t.status is TrajectoryStatus.TRUNCATED) == (n_new == cap and not t.success)
        for i in range(t.prompt_len, len(t.tokens)):
            if t.loss_mask[i]:
                assert t.versions[i] == 7 and t.turn_ids[i] >= 0
            else:
                assert (t.versions[i], t.logp_mu[i], t.turn_ids[i]) == (NO_VERSION, 0.0, -1)
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([t.tokens])).logits[0, :-1].float()
        lp = (
            torch.log_softmax(logits / temperature, -1)
            .gather(1, torch.tensor(t.tokens[1:])[:, None])
            .squeeze(1)
        )
        m = torch.tensor(t.loss_mask[1:])
        assert (torch.tensor(t.logp_mu[1:])[m] - lp[m]).abs().max() < 2e-5
