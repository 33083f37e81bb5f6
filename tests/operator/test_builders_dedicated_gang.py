"""Pure builders for dedicated scorers with their own layout (``oldLogits.dedicated.tensorParallel``): each scorer
pod holds the scorer's GPUs, says the scorer's layout in its env (not the actor's), advertises ``oldlogits-<i>``
for a gang's ranks, and the PodGroup counts every pod."""

from typing import Any

import pytest

from asyncrl.api import constants as C
from tests.operator.test_builders_gang import build, child, container, env_of, ray_resources

DEDICATED = {"correction": {"reference": "exact"}, "model": {"preset": "tiny-llama"}}


def _job(dedicated: dict[str, Any], **actor: Any) -> dict[str, Any]:
    return {**DEDICATED, "oldLogits": {"strategy": "dedicated", "dedicated": {"replicas": 2, **dedicated}},
            "actor": actor}


def test_a_tp2_scorer_pod_holds_its_gpus_its_layout_and_its_gang_resource() -> None:
    # actor: 2 pods x 4 GPUs at TP 1 (DP 8); scorers: TP 2 on 2 GPUs each
    d = build(**_job({"tensorParallel": 2, "gpusPerReplica": 2}, replicas=2, gpusPerReplica=4),
              scheduling={"gangScheduler": "volcano"})
    for i in (0, 1):
        name = f"j-oldlogit-{i}"
        assert "--num-gpus=2" in container(d, name)["command"]
        assert ray_resources(d, name) == {C.RESOURCE_OLD_LOGITS: 1, C.old_logits_pod_resource(i): 2}
        env = env_of(d, name)
        assert (env["ASYNCRL_TENSOR_PARALLEL"], env["ASYNCRL_WORLD_SIZE"], env["ASYNCRL_DATA_PARALLEL"]) == \
            ("2", "2", "1")
    actor_env = env_of(d, "j-actor-0")
    assert (actor_env["ASYNCRL_TENSOR_PARALLEL"], actor_env["ASYNCRL_WORLD_SIZE"]) == ("1", "8")
    spec = child(d, "PodGroup")["spec"]
    assert spec["minMember"] == len(d.pods) == 1 + 2 + 2 + 2  # driver, 2 rollout, 2 actor and 2 scorer pods
    assert spec["minResources"]["nvidia.com/gpu"] == str(2 * 1 + 2 * 4 + 2 * 2)  # rollout 2, actor 8, scorers 4


def test_by_default_a_scorer_takes_one_gpu_per_rank_not_the_actors_pod_size() -> None:
    d = build(**_job({}, replicas=1, gpusPerReplica=2))  # actor TP 1: a one-process scorer on 1 GPU, none idle
    assert "--num-gpus=1" in container(d, "j-oldlogit-0")["command"]
    assert ray_resources(d, "j-oldlogit-0") == {C.RESOURCE_OLD_LOGITS: 1}
    assert env_of(d, "j-oldlogit-0")["ASYNCRL_TENSOR_PARALLEL"] == "1"


@pytest.mark.parametrize(("dedicated", "actor", "needle"), [
    ({"tensorParallel": 3, "gpusPerReplica": 4}, {}, "must divide the scorer's GPUs per pod"),
    ({"tensorParallel": 2, "gpusPerReplica": 3}, {}, "(got tensorParallel 2 with 3 GPUs per scorer pod)"),
    ({"tensorParallel": 8, "gpusPerReplica": 8}, {}, "numKeyValueHeads 2 is not divisible by tensorParallel 8: "
                                                    "set spec.oldLogits.dedicated.tensorParallel"),
])
def test_layouts_that_cannot_work_are_refused_with_the_field_and_the_fix(dedicated, actor, needle) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="oldLogits.dedicated.tensorParallel") as err:
        build(**_job(dedicated, **actor))
    assert needle in str(err.value)
