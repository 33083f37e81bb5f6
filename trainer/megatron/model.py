"""Build the megatron-core ``GPTModel`` for a :class:`~asyncrl.api.model_arch.ModelArch` of any family.

The kwargs are the measured Llama mapping of ``docs/architecture.md`` (megatron-core on the CPU): RMSNorm
with the architecture's epsilon (megatron's default 1e-5 silently differs from HF's 1e-6),
SwiGLU (``gated_linear_unit`` + SiLU, fc1 = [gate; up]), RoPE with ``rotary_interleaved=False``
(HF's rotate-half), grouped-query attention via ``num_query_groups``, the head dim as
``kv_channels`` (Qwen3's is explicit), no biases, tied or untied embeddings. Per family:

- qwen2: ``add_qkv_bias`` (bias on the fused q/k/v projection only, as Qwen2 has);
- qwen3, qwen3_moe: ``qk_layernorm`` (an RMSNorm over each head's ``head_dim`` features of q and k,
  before RoPE, as HF's ``q_norm``/``k_norm``), passed to both the config and the layer spec;
- mistral: the sliding window is *not* megatron's ``window_size`` (its local attention then builds
  the window mask with ``device="cuda"`` and ignores the mask passed in); the explicit mask of
  :func:`causal_mask` carries it instead, exact on CPU and GPU alike;
- qwen3_moe: megatron's MoE layer: ``TopKRouter`` (softmax, top-k; ``norm_topk_prob`` -> softmax over
  the k chosen logits, else softmax over all then top-k, which is ``moe_router_pre_softmax``),
  ``SequentialMLP`` experts (one SwiGLU per expert; grouped GEMM only with TransformerEngine on a GPU),
  the ``allgather`` dispatcher (``alltoall`` makes a CUDA stream), EP = 1, no auxiliary loss.

Call :func:`asyncrl.trainer.megatron.compat.init_megatron` first.
"""

from typing import Any

import torch

from asyncrl.api.model_arch import ModelArch


def _moe_kwargs(arch: ModelArch) -> dict[str, Any]:
    if not arch.is_moe:
        return {}
    return {
        "num_moe_experts": arch.num_experts,
        "moe_router_topk": arch.moe_top_k,
        "moe_ffn_hidden_size": arch.moe_ffn_hidden_size,
        # HF: p = softmax(all logits) -> top-k (-> renormalised if norm_topk_prob). Renormalised top-k
        # probabilities are exactly softmax over the k chosen logits, megatron's default order.
        "moe_router_pre_softmax": not arch.norm_topk_prob,
        "moe_router_score_function": "softmax",
        "moe_router_load_balancing_type": "none",  # RL fine-tuning: no auxiliary loss term in the gradient
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,  # SequentialMLP: plain matmuls, any device
        "moe_token_dispatcher_type": "allgather",
        "moe_router_dtype": "fp32",  # HF computes the router softmax in fp32 too
    }


def _draw_nothing(weight: torch.Tensor) -> torch.Tensor:
    """A megatron init method that leaves ``weight`` as allocated (it is about to be loaded)."""
    return weight


def transformer_config(arch: ModelArch, *, use_cpu_initialization: bool = True, init_std: float = 0.02,
                       random_init: bool = True):
    """The megatron ``TransformerConfig`` of ``arch`` in fp32 (no dropout); ``random_init=False`` leaves
    the weights uninitialised (they are about to be loaded: megatron's CPU init of a 1.1B model takes
    ~70 s on 2 cores, almost all of it drawing random numbers).

    At TP > 1 not by ``perform_initialization=False``: megatron-core 0.16.1 marks a weight as tensor parallel
    (``tensor_model_parallel``, ``partition_dim``, ``partition_stride``: what ``parallel.shard_of`` slices by)
    only inside its init, so a folder's full tensors would meet unmarked shards. Its init runs there with
    init methods that draw nothing: the marks are set, the empty master weight is split as usual (two copies
    of each weight: smollm2-135m 0.3-0.7 s against 0.02 s skipped and 0.9-1.5 s drawn, 1 thread). At TP = 1
    nothing is sliced: the init is skipped."""
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_config import TransformerConfig

    sharded = parallel_state.model_parallel_is_initialized() and \
        parallel_state.get_tensor_model_parallel_world_size() > 1
    skip = {"init_method": _draw_nothing, "output_layer_init_method": _draw_nothing,
            "embedding_init_method": _draw_nothing} if not random_init and sharded else {}
    return TransformerConfig(
        **skip,
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_attention_heads,
        num_query_groups=arch.num_key_value_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_epsilon,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=init_std,
        use_cpu_initialization=use_cpu_initialization,
        perform_initialization=random_init or sharded,  # sharded without random init: draws nothing (above)
        params_dtype=torch.float32,
        # Already the 0.16.1 defaults, pinned because the HF mapping depends on them.
        rotary_interleaved=False,
        apply_rope_fusion=False,
        attention_softmax_in_fp32=True,
        **_moe_kwargs(arch),
    )


def build_gpt_model(arch: ModelArch, *, use_cpu_initialization: bool = True, init_std: float = 0.02,
                    random_init: bool = True):
    """A fresh, randomly initialised megatron ``GPTModel`` (fp32) for ``arch``.

    With ``use_cpu_initialization`` the weights come from torch's default CPU generator, so
    ``torch.manual_seed`` before this call makes the init reproducible. The model carries
    ``sliding_window`` (read by :func:`attention_mask`). ``random_init=False``: parameters are
    allocated but not initialised, for a model whose every weight is loaded next.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = transformer_config(arch, use_cpu_initialization=use_cpu_initialization, init_std=init_std,
                                random_init=random_init)
    gpt = GPTModel(
        config=config,
        # The spec argument only matters when Apex is installed (its fused norm is LayerNorm-only);
        # config.normalization is what selects RMSNorm here. Set both.
        transformer_layer_spec=get_gpt_layer_local_spec(
            num_experts=arch.num_experts or None,
            moe_grouped_gemm=False,
            qk_layernorm=arch.qk_norm,
            normalization="RMSNorm",
        ),
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_sequence_length,
        position_embedding_type="rope",
        rotary_base=int(arch.rope_theta),
        rotary_percent=1.0,
        share_embeddings_and_output_weights=arch.tie_embeddings,
        parallel_output=True,
    )
    gpt.sliding_window = arch.sliding_window
    if arch.is_moe:  # idle replay state of its own per router (routing replay: trainer/megatron/routing_replay.py)
        from asyncrl.trainer.megatron.routing_replay import install

        install(gpt)
    return gpt


def causal_mask(seq_len: int, device: torch.device, sliding_window: int | None = None) -> torch.Tensor:
    """Megatron's attention mask ``[1, 1, T, T]`` bool, **True = masked** (the future, and with a
    ``sliding_window`` W every key ``j <= i - W``: query i sees keys ``i-W+1..i``, as HF Mistral).

    Always passed explicitly: ``attention_mask=None`` makes megatron build its causal mask with
    ``device="cuda"``. Right padding needs no key-padding term: a padded key only ever sits after
    every real query, where the causal mask already hides it. A window >= T is full attention.
    """
    ones = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1)
    if sliding_window is not None and sliding_window < seq_len:
        mask |= torch.tril(ones, diagonal=-sliding_window)
    return mask[None, None]


def attention_mask(model: Any, seq_len: int, device: torch.device) -> torch.Tensor:
    """:func:`causal_mask` with the sliding window of ``model`` (a GPTModel or a wrapper of one)."""
    return causal_mask(seq_len, device, getattr(unwrap(model), "sliding_window", None))


def position_ids(batch: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """``[B, T]`` positions ``0..T-1``; megatron's RoPE uses ``arange(T)`` whatever is passed."""
    return torch.arange(seq_len, device=device).expand(batch, seq_len)


def unwrap(model: Any) -> Any:
    """The ``GPTModel`` inside megatron's DDP wrapper (or the model itself); typed ``Any`` because
    megatron's modules carry attributes (``post_process``, ``output_layer``) torch's stubs lack."""
    while hasattr(model, "module"):
        model = model.module
    return model
