"""Actor layouts: what ``asyncrl validate`` accepts and what it refuses with the numbers and the fix."""

import pytest
from pydantic import ValidationError

from asyncrl.api.job import AsyncRLJobSpec
from asyncrl.api.model_arch import PRESETS, parallel_problems
from asyncrl.api.pods import ActorSpec

BASE = {"rollout": {"replicas": 1, "gpusPerReplica": 0}}


def _spec(actor: dict, model: dict | None = None) -> AsyncRLJobSpec:
    return AsyncRLJobSpec.model_validate({**BASE, "actor": actor, "model": model or {}})


@pytest.mark.parametrize(("actor", "world", "dp"), [
    ({"replicas": 2, "gpusPerReplica": 0}, 2, 2),
    ({"replicas": 2, "gpusPerReplica": 0, "megatron": {"tensorParallel": 2}}, 2, 1),
    ({"replicas": 4, "gpusPerReplica": 0, "megatron": {"tensorParallel": 2}}, 4, 2),
    ({"replicas": 2, "gpusPerReplica": 8, "megatron": {"tensorParallel": 4}}, 16, 4),
    ({"replicas": 1, "gpusPerReplica": 8, "megatron": {"expertParallel": 4}}, 8, 8),
])
def test_layouts_that_work(actor: dict, world: int, dp: int) -> None:
    spec = ActorSpec.model_validate(actor)  # the layout alone (the model's split is checked below)
    assert (spec.world_size, spec.data_parallel) == (world, dp)


def test_every_layout_problem_at_once_with_the_numbers() -> None:
    with pytest.raises(ValidationError) as info:
        ActorSpec.model_validate({"replicas": 3, "gpusPerReplica": 0,
                                  "megatron": {"tensorParallel": 2, "pipelineParallel": 2, "expertParallel": 2}})
    text = str(info.value)
    assert "token_logprobs" in text and "(got 2)" in text  # PP: the reason
    assert "expert gradients" in text and "gpusPerReplica 0" in text  # EP on CPU: the reason
    assert "= 4 with 3 x 1 = 3 ranks" in text  # TP x EP over the ranks: the numbers


def test_the_model_must_split_over_tensor_parallel() -> None:
    # smollm2-135m: 9 heads, 3 KV heads, vocab 49152: TP=2 splits neither head count.
    with pytest.raises(ValidationError) as info:
        _spec({"replicas": 2, "gpusPerReplica": 2, "megatron": {"tensorParallel": 2}}, {"preset": "smollm2-135m"})
    text = str(info.value)
    assert "numAttentionHeads 9 is not divisible by tensorParallel 2" in text
    assert "numKeyValueHeads 3 is not divisible by tensorParallel 2" in text
    assert "vocabSize" not in text.split("tensorParallel to a common divisor")[0]
    _spec({"replicas": 3, "gpusPerReplica": 0, "megatron": {"tensorParallel": 3}}, {"preset": "smollm2-135m"})


def test_parallel_problems_covers_vocab_layers_and_experts() -> None:
    arch = PRESETS["tiny-llama"]
    from dataclasses import replace

    odd = replace(arch, vocab_size=257, num_layers=3)
    problems = parallel_problems(odd, 2, pp=2, ep=2)
    assert any("vocabSize 257" in p for p in problems)
    assert any("numLayers 3" in p for p in problems)
    assert any("numExperts 0" in p for p in problems)
    assert parallel_problems(replace(arch, vocab_size=256), 2) == []
