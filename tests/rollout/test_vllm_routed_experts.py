"""vLLM's routed-experts output on its CPU build (``make test-vllm``): pins why the vLLM engine captures routes
for routing replay through vLLM's router hook (``RouteTap`` in rollout/vllm_server.py) instead of that output.

vLLM 0.32 can return, per request, the top-k experts of every MoE layer (``enable_return_routed_experts``,
``CompletionOutput.routed_experts``). Its CPU build cannot: only model runner V2 fills that output, V2 needs
Triton with a CPU backend, and the build's Triton (the NVIDIA/AMD wheel torch depends on) has none, so the
option is refused when the engine is built (with ``VLLM_USE_V2_MODEL_RUNNER=1``: 'Model Runner V2 requires
Triton'; forced past that check, V2's first step fails in a Triton kernel). The day a vLLM build accepts it,
this test fails and says what to do next.
"""

from pathlib import Path

import pytest

from asyncrl.rollout.vllm_engine import hf_config
from asyncrl.rollout.vllm_process import EngineProcess, VLLMProcessError
from tests.support.hf_models import folder_arch, tiny_folder

pytestmark = pytest.mark.vllm

# head_dim 64: vLLM's CPU attention kernel has no 16 or 32 (the suite's other MoE folder has the same shape)
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1,
         "head_dim": 64}


def test_cpu_build_refuses_routed_experts_output(tmp_path: Path) -> None:
    arch = folder_arch(tiny_folder(tmp_path, "qwen3_moe", **SHAPE))
    proc = EngineProcess(env={"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"})
    try:
        if proc.hello["platform"] != "cpu":
            pytest.skip(f"this pins vLLM's CPU build; the engine process runs on {proc.hello['platform']}")
        engine = {"enforce_eager": True, "max_num_seqs": 4, "enable_prefix_caching": True,
                  "kv_cache_memory_bytes": 16 << 20, "max_model_len": arch.max_sequence_length, "seed": 0,
                  "enable_return_routed_experts": True}
        try:
            proc.call("build", hf_config=hf_config(arch, "float32"), dtype="float32", engine=engine)
        except VLLMProcessError as exc:
            refusal = str(exc)
        else:
            pytest.fail(
                f"vLLM {proc.hello['vllm']} on CPU now builds an engine with enable_return_routed_experts: measure "
                "whether it fills CompletionOutput.routed_experts (prompt and generated positions, after a "
                "re-prefill too) and whether reading it could replace RouteTap's router hook "
                "(rollout/vllm_server.py, issue 37)"
            )
    finally:
        proc.close()
    reason = next((line.strip() for line in refusal.splitlines() if "Value error" in line), refusal.splitlines()[0])
    print(f"vLLM {proc.hello['vllm']} CPU build, has_triton {proc.hello['has_triton']}: {reason}")
    assert "AuxOutput Connector requires Model Runner V2" in refusal  # the V1 runner the build picks cannot
    assert proc.hello["has_triton"] is False  # and V2 needs a Triton CPU backend ('Model Runner V2 requires Triton')
