"""The vLLM backend's pure parts (default suite, no vLLM needed): engineArgs, the weight layout it sends,
the refusals of known bad combinations, and finding the vLLM interpreter."""

from dataclasses import replace
from pathlib import Path

import pytest

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_arch import LlamaArch, resolve_arch
from asyncrl.rollout import vllm_process
from asyncrl.rollout.hf_model import build_model
from asyncrl.rollout.tokenizer import TOKENIZER
from asyncrl.rollout.vllm_engine import config_problems, engine_options, hf_config, hf_weight_shapes
from asyncrl.rollout.vllm_process import VLLMUnavailableError, vllm_python

CPU_HELLO = {"platform": "cpu", "cpu_head_sizes": [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]}


@pytest.mark.parametrize("tied", [True, False])
def test_weight_layout_is_the_transformers_models(tied: bool) -> None:
    arch = resolve_arch(ModelSpec(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                                  tie_embeddings=tied), TOKENIZER.vocab_size)
    model = {k: tuple(v.shape) for k, v in build_model(arch).state_dict().items()}
    if tied:
        del model["lm_head.weight"]  # the embedding (sent a second time as an untied head, see UNTIED_HEAD)
    assert hf_weight_shapes(arch) == model
    cfg = hf_config(arch, "float32")
    assert cfg["tie_word_embeddings"] is False and cfg["head_dim"] == 64 and cfg["architectures"] == ["LlamaForCausalLM"]


def test_engine_args_defaults_and_every_problem_at_once() -> None:
    assert engine_options({}) == {"enforceEager": True, "maxNumSeqs": 128, "kvCacheMemoryBytes": 0,
                                  "enablePrefixCaching": True, "cpuThreads": 1}
    assert engine_options({"maxNumSeqs": 8})["maxNumSeqs"] == 8
    with pytest.raises(ValueError) as err:
        engine_options({"fp32Head": True, "maxNumSeqs": -1, "enforceEager": "yes"})
    msg = str(err.value)
    assert "unknown 'fp32Head'" in msg and "maxNumSeqs: -1 is not a non-negative int" in msg
    assert "enforceEager: 'yes' is not a bool" in msg and "kvCacheMemoryBytes (int, default 0)" in msg


def test_known_bad_combinations_name_the_fields() -> None:
    arch: LlamaArch = resolve_arch(ModelSpec(hidden_size=128, num_attention_heads=2), TOKENIZER.vocab_size)
    assert config_problems(arch, "float32", CPU_HELLO) == []
    assert config_problems(arch, "bfloat16", {"platform": "cuda", "cpu_head_sizes": []}) == []  # GPU: fine
    (bf16,) = config_problems(arch, "bfloat16", CPU_HELLO)
    assert "spec.model.rolloutDtype 'bfloat16'" in bf16 and "spec.model.rolloutDtype: float32" in bf16
    (head,) = config_problems(replace(arch, num_attention_heads=8), "float32", CPU_HELLO)  # head_dim 16
    assert "head_dim 16 (spec.model.hiddenSize 128 / numAttentionHeads 8)" in head and "hiddenSize 512" in head


def test_missing_vllm_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ASYNCRL_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(VLLMUnavailableError, match=r"no-python.*make vllm-env \(or bash .ci/build-vllm-env.sh\)"):
        vllm_python()
    monkeypatch.delenv("ASYNCRL_VLLM_PYTHON")
    stale = tmp_path / "vllm-python.path"
    stale.write_text(str(tmp_path / "removed" / "python") + "\n")
    monkeypatch.setattr(vllm_process, "PATH_FILE", stale)
    with pytest.raises(VLLMUnavailableError, match=r"removed/python.*a cache was removed.*make vllm-env"):
        vllm_python()
    monkeypatch.setattr(vllm_process, "PATH_FILE", tmp_path / "absent.path")
    monkeypatch.setattr(vllm_process.importlib.util, "find_spec", lambda name: None)  # this env has no vllm
    with pytest.raises(VLLMUnavailableError, match="not installed here; run make vllm-env"):
        vllm_python()


def test_the_api_checks_the_engine_args_the_engine_takes() -> None:
    from asyncrl.api import pods
    from asyncrl.api.job import AsyncRLJobSpec
    from asyncrl.api.validation import SpecError, validate_job
    from asyncrl.rollout.vllm_engine import VLLM_ENGINE_ARGS

    # api/ may not import the rollout package: its copy of the table must stay the engine's
    assert pods.VLLM_ENGINE_ARGS == {k: typ for k, (typ, _, _) in VLLM_ENGINE_ARGS.items()}
    spec = AsyncRLJobSpec.model_validate({"rollout": {"engine": "vllm", "engineArgs": {"maxNumSeqs": 8}}})
    assert spec.rollout.engine == "vllm"
    job = {"apiVersion": "asyncrl.io/v1alpha1", "kind": "AsyncRLJob", "metadata": {"name": "v"},
           "spec": {"rollout": {"engine": "vllm", "engineArgs": {"maxNumSeqs": -1, "fp32Head": True}}}}
    with pytest.raises(SpecError, match=r"spec.rollout.engineArgs.*vllm engine takes enforceEager \(bool\)"):
        validate_job(job)


def test_the_spec_names_exactly_the_engines_that_have_a_backend() -> None:
    # api/ may not import the rollout package: its list of engine names must stay the registry's
    from asyncrl.api import pods
    from asyncrl.rollout.engine_registry import ENGINES

    assert pods.ENGINES == ENGINES
