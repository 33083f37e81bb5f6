"""Bad model folders: each gives one clear error naming the file and the fix, before Ray starts
(``asyncrl validate`` for what config.json alone shows, ``asyncrl run``/``driver`` for the rest)."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import ArchitectureError, arch_from_hf_config, folder_problems, resolve_arch
from asyncrl.rollout.tokenizer import tokenizer_for
from asyncrl.trainer.cli import main
from asyncrl.trainer.megatron.convert import hf_to_megatron
from asyncrl.trainer.megatron.hf_folder import HFFolder
from asyncrl.trainer.megatron.hf_folder import folder_problems as weight_problems
from tests.support.hf_models import folder_arch, tiny_folder


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_folder(tmp_path_factory.mktemp("good"), "qwen3", max_shard_size="60KB")


def _copy(good: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "model"))


def _edit_config(folder: Path, **fields: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text()) | fields
    (folder / "config.json").write_text(json.dumps(cfg))


def _job_file(tmp_path: Path, model: dict[str, Any]) -> Path:
    from asyncrl.api.validation import quickstart_doc

    doc = quickstart_doc()
    doc["spec"]["model"] = model
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_good_folder_has_no_problems_and_resolves_from_config_json(good: Path) -> None:
    assert weight_problems(str(good)) == [] and folder_problems(ModelSpec(weights=str(good))) == []
    arch = resolve_arch(ModelSpec(weights=str(good)), vocab_size=1)
    assert arch == folder_arch(good) and (arch.family, arch.head_dim, arch.vocab_size) == ("qwen3", 32, 266)
    assert arch_from_hf_config(arch.to_hf_config()) == arch  # the family table round-trips


def test_missing_shard_names_the_index_and_the_shard(good: Path, tmp_path: Path) -> None:
    folder = _copy(good, tmp_path)
    shard = sorted(set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values()))[1]
    (folder / shard).unlink()
    (problem,) = weight_problems(str(folder))
    assert f"model.safetensors.index.json names shard(s) ['{shard}']" in problem
    assert "copy the missing shard" in problem


def test_shape_mismatch_names_the_tensor_its_file_and_the_fix(good: Path, tmp_path: Path) -> None:
    folder = _copy(good, tmp_path)
    _edit_config(folder, intermediate_size=96)
    (problem,) = weight_problems(str(folder))
    assert "config.json and the safetensors files disagree (Qwen3ForCausalLM)" in problem
    assert "model.layers.0.mlp.gate_proj.weight [128, 64] in model-0000" in problem
    assert "(config.json implies [96, 64])" in problem and "re-save the folder with save_pretrained" in problem
    with pytest.raises(ValueError, match=r"gate_proj.weight: got \[128, 64\], expected \[96, 64\]"):
        hf_to_megatron(HFFolder(folder), arch_from_hf_config(json.loads((folder / "config.json").read_text())))


def test_config_and_weights_disagree_on_the_layer_count(good: Path, tmp_path: Path) -> None:
    folder = _copy(good, tmp_path)
    _edit_config(folder, num_hidden_layers=3)
    (problem,) = weight_problems(str(folder))
    assert "missing ['model.layers.2." in problem and "(11)" in problem  # 11 tensors per qwen3 layer


def test_unsupported_architecture_is_refused_by_validate_run_and_driver(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _copy(good, tmp_path)
    _edit_config(folder, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ArchitectureError) as err:
        resolve_arch(ModelSpec(weights=str(folder)), 1)
    assert "GPT2LMHeadModel is not supported; supported architectures: LlamaForCausalLM, " in str(err.value)
    job = _job_file(tmp_path, {"weights": str(folder), "rolloutDtype": "float32"})
    assert main(["validate", str(job)]) == 1
    assert main(["run", str(job), "--steps", "1"]) == 2  # before Ray starts
    assert main(["driver", "--spec", str(job)]) == 2
    err_text = capsys.readouterr().err
    assert err_text.count("GPT2LMHeadModel is not supported") == 3
    assert "Qwen3MoeForCausalLM" in err_text and f"{folder}/config.json" in err_text


def test_no_tokenizer_is_refused_with_the_fix(good: Path, tmp_path: Path) -> None:
    folder = _copy(good, tmp_path)
    (folder / "tokenizer.json").unlink()
    (problem,) = weight_problems(str(folder))
    assert "no tokenizer.json" in problem and "save_pretrained(folder)" in problem
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        tokenizer_for(ModelSpec(weights=str(folder)))


def test_size_overrides_and_a_foreign_preset_are_refused_for_a_folder(good: Path) -> None:
    problems = folder_problems(ModelSpec(weights=str(good), preset="tiny-llama", hidden_size=128))
    assert problems[0].startswith("spec.model.hiddenSize: the architecture comes from ")
    assert "remove hiddenSize" in problems[0]
    assert problems[1].startswith("spec.model.preset: 'tiny-llama' differs from the architecture")
    assert "leave spec.model.preset out" in problems[1]


def test_unsupported_config_features_are_listed_together() -> None:
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 10, "hidden_act": "gelu",
           "attention_bias": True, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}
    with pytest.raises(ArchitectureError) as err:
        arch_from_hf_config(cfg)
    assert len(err.value.problems) == 3
    assert "hidden_act 'gelu'" in str(err.value) and "attention_bias" in str(err.value) and "'yarn'" in str(err.value)
