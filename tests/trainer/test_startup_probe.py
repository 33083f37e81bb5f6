"""The start-up discrepancy probe with real engines and a real actor: each cause provoked, then diagnosed.

The actor is the job's Megatron actor, the engines the transformers engine sampling held-out problems
(``RolloutWorker.evaluate``); nothing is faked except where asyncrl's engines cannot produce a cause at all
(top-p truncation, a prompt seen differently by the two sides): those rules are tested on hand-built
statistics below, and say so.
"""

import math

import pytest
import torch

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.rollout.envs.registry import get_task, max_sequence_length
from asyncrl.rollout.hf_engine import HFEngine
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.rollout.worker import RolloutWorker
from asyncrl.trainer.actor.megatron_actor import MegatronActor
from asyncrl.trainer.driver.loop import startup_probe as sp
from asyncrl.trainer.megatron import compat

SPEC = AsyncRLJobSpec.model_validate({
    "model": {"preset": "tiny-llama", "hiddenSize": 64, "numLayers": 1, "ffnHiddenSize": 128},
    "task": {"name": "calculator", "temperature": 1.0, "maxNewTokens": 24},
})
DEFAULTS = sp.Thresholds(SPEC.correction.startup_check.max_mean_abs_log_ratio,
                         SPEC.correction.startup_check.max_p99_abs_log_ratio)
ROLLOUTS = 8


@pytest.fixture(scope="module")
def actor() -> MegatronActor:
    compat.init_megatron(seed=0, device="cpu")
    ctx = max_sequence_length(SPEC.task.name, SPEC.task.max_new_tokens, TOKENIZER)
    actor = MegatronActor.from_spec(SPEC, TOKENIZER.vocab_size, max_sequence_length=ctx)
    # At init (std 0.02) attention scores are ~0: every query mixes its keys evenly, so a scrambled QKV
    # mapping changes little (measured: mean |log r_d| 0.02, inside the defaults). 10x larger QKV weights
    # make the pattern matter, as in a trained model (the scrambled mapping: 0.19, refused).
    with torch.no_grad():
        for name, p in actor._gpt.named_parameters():
            if "linear_qkv" in name:
                p.mul_(10.0)
    return actor


def _probe(actor: MegatronActor, *, dtype: str = "bfloat16", engine_temperature: float = 1.0,
           weights: dict[str, torch.Tensor] | None = None, limits: sp.Thresholds = DEFAULTS) -> sp.Verdict:
    """The engine samples (and reports logp_mu) at ``engine_temperature``; the actor scores at the task's."""
    engine = HFEngine(actor.settings.arch, dtype=dtype, seed=1, pad_id=TOKENIZER.pad_id)
    worker = RolloutWorker(SPEC.task, SPEC.model, SPEC.async_, engine=engine)
    worker.load_weights(weights if weights is not None else actor.hf_state_dict(), 0)
    trajs = worker.evaluate(get_task(SPEC.task.name).heldout_problems(ROLLOUTS, 0), version=0,
                            temperature=engine_temperature, seed=0)

    def score(tokens: torch.Tensor, t: float) -> torch.Tensor:
        return actor.logprobs(tokens, temperature=t)

    return sp.probe_engine(f"rollout-0 (transformers, {dtype})", dtype, 0, trajs, score, TOKENIZER.pad_id,
                           temperature=SPEC.task.temperature, limits=limits)


def test_matched_engines_pass_at_the_defaults(actor: MegatronActor) -> None:
    bf16, fp32 = _probe(actor, dtype="bfloat16"), _probe(actor, dtype="float32")
    print(f"\n{bf16.line()}\n{fp32.line()}")
    assert bf16.passed and bf16.cause == "dtype"
    assert 1e-4 < bf16.stats.mean_abs_log_ratio < DEFAULTS.max_mean_abs / 10  # measured 1.3e-3 (quickstart)
    assert fp32.passed and fp32.cause == "none" and fp32.stats.mean_abs_log_ratio < 1e-5
    assert bf16.stats.fitted_temperature is None  # only a refused engine is re-scored
    sp.check([bf16, fp32], DEFAULTS)  # raises nothing


def test_mismatched_temperature_refuses_to_start_and_names_it(actor: MegatronActor) -> None:
    verdict = _probe(actor, dtype="float32", engine_temperature=0.6)
    print(f"\n{verdict.line()}\n  {verdict.detail}")
    assert not verdict.passed and verdict.cause == "temperature"
    assert verdict.stats.fitted_temperature == 0.6 and verdict.stats.fitted_mean_abs < 1e-5
    with pytest.raises(sp.StartupCheckError) as err:
        sp.check([verdict], DEFAULTS)
    assert err.value.exit_code == 2
    message = str(err.value)
    assert "temperature mismatch" in message and "at temperature 0.6" in message and "REFUSED" in message
    assert "correction.startupCheck" in message


def test_a_bf16_engine_is_told_apart_from_fp32_by_the_noise_level(actor: MegatronActor) -> None:
    tight = sp.Thresholds(1e-5, 1e-4)  # below bf16 noise, above fp32 rounding
    bf16 = _probe(actor, dtype="bfloat16", limits=tight)
    assert not bf16.passed and bf16.cause == "dtype" and "rolloutDtype: float32" in bf16.detail
    assert bf16.stats.fitted_temperature == SPEC.task.temperature  # no other temperature explains bf16 noise
    assert _probe(actor, dtype="float32", limits=tight).passed


def test_a_wrong_qkv_mapping_is_named_family_mapping(actor: MegatronActor) -> None:
    # The converter's classic bug: megatron's grouped linear_qkv split as a plain [Q; K; V].
    arch, state = actor.settings.arch, actor._gpt.state_dict()
    nh, ng, hn = arch.num_attention_heads, arch.num_key_value_heads, arch.head_dim
    wrong = actor.hf_state_dict()
    for i in range(arch.num_layers):
        q, k, v = state[f"decoder.layers.{i}.self_attention.linear_qkv.weight"].split([nh * hn, ng * hn, ng * hn])
        wrong |= {f"model.layers.{i}.self_attn.{n}_proj.weight": w for n, w in zip("qkv", (q, k, v), strict=True)}
    verdict = _probe(actor, dtype="float32", weights=wrong)
    print(f"\n{verdict.line()}")
    assert not verdict.passed and verdict.cause == "family-mapping"


def _stats(**kw: float) -> sp.EngineDiscrepancy:
    base = {"engine": "e", "dtype": "float32", "version": 0, "trajectories": 8, "tokens": 100,
            "mean_log_ratio": 0.0, "mean_abs_log_ratio": 0.2, "p99_abs_log_ratio": 0.6, "max_abs_log_ratio": 1.0,
            "first_token_mean_abs": 0.2, "rest_mean_abs": 0.2, "negative_share": 0.5,
            "fitted_temperature": 1.0, "fitted_mean_abs": 0.2}
    return sp.EngineDiscrepancy(**(base | kw))  # type: ignore[arg-type]


def test_signatures_no_engine_here_can_produce_are_diagnosed_from_their_statistics() -> None:
    # Hand-built statistics (the transformers and vLLM engines never truncate nor re-render a prompt):
    # top-p: logp_mu >= logp_theta on 99% of the tokens
    assert sp.diagnose(_stats(negative_share=0.99, mean_log_ratio=-0.2), 1.0)[0] == "top-p"
    # chat template: the first sampled token 0.9 against 0.02 on the others (45x)
    assert sp.diagnose(_stats(first_token_mean_abs=0.9, rest_mean_abs=0.02), 1.0)[0] == "chat-template"
    # raw log-probs: the actor's log-probs at temperature 1 match logp_mu (job at 0.6)
    cause, detail = sp.diagnose(_stats(fitted_temperature=1.0, fitted_mean_abs=1e-3), 0.6)
    assert cause == "temperature" and "raw log-probs" in detail
    # a fit that is not 4x better is no temperature: 0.2 / 0.06 = 3.3x
    assert sp.diagnose(_stats(fitted_temperature=0.8, fitted_mean_abs=0.06), 1.0)[0] == "family-mapping"
    assert sp.diagnose(_stats(mean_abs_log_ratio=0.02, first_token_mean_abs=0.02, rest_mean_abs=0.02), 1.0)[0] \
        == "unknown"  # an fp32 engine with unexplained mid-sized noise


def test_discrepancy_statistics_by_hand() -> None:
    # Two rows; sampled tokens at positions 2.. ; log r_d = logp_theta - logp_mu
    logp_theta = torch.tensor([[0.0, 0.0, -1.0, -2.0], [0.0, 0.0, -0.5, 0.0]])
    logp_mu = torch.tensor([[0.0, 0.0, -1.5, -2.0], [0.0, 0.0, -0.3, 0.0]])
    mask = torch.tensor([[False, False, True, True], [False, False, True, False]])
    s = sp.engine_discrepancy("e", "float32", 3, logp_theta, logp_mu, mask)
    # d = [0.5, 0.0, -0.2]: mean 0.1, mean |d| 0.7/3; first tokens [0.5, -0.2] -> 0.35; rest [0.0]
    assert s.tokens == 3 and s.trajectories == 2 and s.version == 3
    assert math.isclose(s.mean_log_ratio, 0.1, abs_tol=1e-7)
    assert math.isclose(s.mean_abs_log_ratio, 0.7 / 3, abs_tol=1e-7)
    assert math.isclose(s.first_token_mean_abs, 0.35, abs_tol=1e-7) and s.rest_mean_abs == 0.0
    assert math.isclose(s.negative_share, 1 / 3) and math.isclose(s.max_abs_log_ratio, 0.5, abs_tol=1e-7)
    with pytest.raises(ValueError, match=r"must be one \[B, T\] shape"):
        sp.engine_discrepancy("e", "float32", 0, logp_theta, logp_mu[:, :3], mask)
