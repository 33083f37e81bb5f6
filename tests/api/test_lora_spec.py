"""``spec.model.lora``: defaults, and every refusal names its field, the bad value and the fix."""

import pytest

from asyncrl.api import SpecError, validate_job
from asyncrl.api.lora import TARGET_MODULES, LoraSpec


def _job(**spec: dict) -> dict:
    base = {"model": {"preset": "tiny-llama", "lora": {}}}
    for k, v in spec.items():
        base[k] = {**base.get(k, {}), **v}
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "t"}, "spec": base}


def _problems(doc: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_job(doc)
    return {p.path: p.message for p in info.value.problems}


def test_defaults_target_every_attention_and_mlp_projection() -> None:
    lora = validate_job(_job()).spec.model.lora
    assert lora is not None
    assert (lora.rank, lora.alpha, lora.dropout) == (8, 16.0, 0.0)
    assert lora.target_modules == list(TARGET_MODULES)
    assert lora.scale == 2.0  # 16 / 8


def test_lora_is_off_by_default() -> None:
    doc = _job()
    del doc["spec"]["model"]["lora"]
    assert validate_job(doc).spec.model.lora is None


@pytest.mark.parametrize(("lora", "path", "needle"), [
    ({"rank": 0}, "spec.model.lora.rank", "greater than or equal to 1"),
    ({"rank": 2048}, "spec.model.lora.rank", "less than or equal to 1024"),
    ({"alpha": 0}, "spec.model.lora.alpha", "greater than 0"),
    ({"dropout": 1.0}, "spec.model.lora.dropout", "less than 1"),
    ({"targetModules": ["q_proj", "k_proj", "v_proj", "lm_head"]}, "spec.model.lora.targetModules", "lm_head"),
    ({"targetModules": ["q_proj"]}, "spec.model.lora.targetModules", "fused group"),
    ({"targetModules": ["gate_proj", "down_proj"]}, "spec.model.lora.targetModules", "fused group"),
    ({"targetModules": []}, "spec.model.lora.targetModules", "at least 1"),
    ({"bias": "all"}, "spec.model.lora.bias", "valid fields here: rank, alpha"),
])
def test_bad_fields_are_named(lora: dict, path: str, needle: str) -> None:
    problems = _problems(_job(model={"lora": lora}))
    assert path in problems, problems
    assert needle in problems[path]


def test_rank_above_the_models_width_is_refused() -> None:
    # tiny-llama: hidden 128 = 4 heads x 32 = its smallest adapted width (ffn 256); rank 129 is no low-rank
    # adapter, rank 128 is the largest accepted
    problems = _problems(_job(model={"lora": {"rank": 129}}))
    msg = problems["spec.model.lora.rank"]
    assert "129" in msg and "rank <= 128" in msg and "lower model.lora.rank" in msg
    validate_job(_job(model={"lora": {"rank": 128}}))


@pytest.mark.parametrize(("spec", "path", "reason"), [
    ({"rollout": {"engine": "vllm"}, "model": {"rolloutDtype": "float32"}}, "spec.rollout.engine", "vLLM engine"),
    ({"model": {"lora": {"dropout": 0.1}}, "actor": {"gpusPerReplica": 2, "megatron": {"tensorParallel": 2}}},
     "spec.model.lora.dropout",
     "dropout mask"),
])
def test_combinations_it_cannot_serve_are_refused_with_the_reason(spec: dict, path: str, reason: str) -> None:
    problems = _problems(_job(**spec))
    assert path in problems, problems
    assert reason in problems[path] and "model.lora" in problems[path]


def test_every_exact_strategy_and_ewma_are_served() -> None:
    validate_job(_job(correction={"reference": "exact"}, oldLogits={"strategy": "snapshot"}))
    validate_job(_job(correction={"reference": "exact"}, oldLogits={"strategy": "dedicated"}))
    validate_job(_job(correction={"reference": "exact"}, oldLogits={"strategy": "interruptSync"}))
    validate_job(_job(correction={"reference": "ewma"}))


def test_scale_is_alpha_over_rank() -> None:
    assert LoraSpec(rank=4, alpha=2.0).scale == 0.5
