"""``spec.correction.routingReplay``: the default, and every combination validation refuses (with the reason)."""

from pathlib import Path

import pytest

from asyncrl.api import SpecError, validate_job
from asyncrl.api.correction import RoutingReplay
from tests.support.hf_models import tiny_folder


def _job(spec: dict) -> dict:
    return {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "t"}, "spec": spec}


def _spec(folder: Path, replay: str, *, reference: str = "current", engine: str = "transformers") -> dict:
    return {"model": {"weights": str(folder), "rolloutDtype": "float32"},
            "correction": {"reference": reference, "routingReplay": replay},
            "rollout": {"engine": engine}}


def _problems(spec: dict) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        validate_job(_job(spec))
    return {p.path: p.message for p in info.value.problems}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("replay_models")
    return {"moe": tiny_folder(root, "qwen3_moe"), "dense": tiny_folder(root, "qwen3")}


def test_default_is_none_and_moe_takes_every_mode(folders: dict[str, Path]) -> None:
    assert validate_job(_job({})).spec.correction.routing_replay is RoutingReplay.NONE
    for replay in ("none", "rollout", "oldLogits"):
        job = validate_job(_job(_spec(folders["moe"], replay)))
        assert job.spec.correction.routing_replay.value == replay


def test_dense_model_is_refused_with_the_reason(folders: dict[str, Path]) -> None:
    for replay in ("rollout", "oldLogits"):
        msg = _problems(_spec(folders["dense"], replay))["spec.correction.routingReplay"]
        assert "dense model has no router" in msg and "Qwen3ForCausalLM" in msg and replay in msg
    validate_job(_job(_spec(folders["dense"], "none")))  # none is fine on a dense model


def test_vllm_takes_every_mode(folders: dict[str, Path]) -> None:
    # R3: the vllm engine records routes too (tests/rollout/test_vllm_routes.py); R2 records in the actor
    for replay in ("rollout", "oldLogits"):
        validate_job(_job(_spec(folders["moe"], replay, engine="vllm")))


@pytest.mark.parametrize("reference", ["behavior", "linear", "loglinear", "exact"])
def test_r2_needs_one_old_logit_forward(folders: dict[str, Path], reference: str) -> None:
    spec = _spec(folders["moe"], "oldLogits", reference=reference)
    if reference == "exact":
        spec["oldLogits"] = {"strategy": "snapshot"}
    msg = _problems(spec)["spec.correction.routingReplay"]
    assert "current or ewma" in msg and repr(reference) in msg
    spec["correction"]["routingReplay"] = "rollout"  # R3 replays the rollout's routes, whatever the reference
    validate_job(_job(spec))


def test_a_folder_not_readable_here_waits_for_job_start(tmp_path: Path) -> None:
    # the example's folder is made on the machine that runs it: not a dense preset in the meantime
    validate_job(_job(_spec(tmp_path / "not-made-yet", "rollout")))
    msg = _problems({"correction": {"reference": "current", "routingReplay": "rollout"}})  # the default preset
    assert "LlamaForCausalLM" in msg["spec.correction.routingReplay"]


def test_unknown_mode_lists_the_valid_ones(folders: dict[str, Path]) -> None:
    msg = _problems(_spec(folders["moe"], "R3"))["spec.correction.routingReplay"]
    assert "rollout" in msg and "oldLogits" in msg
