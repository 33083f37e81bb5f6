"""One family table: the decoder architecture both sides build, from a preset or a folder's ``config.json``.

The actor (megatron-core ``GPTModel``), both rollout engines (transformers, vLLM), the converter and
``asyncrl export`` must build the *same* network, so all of them take a :class:`ModelArch` from
:func:`resolve_arch`. A :class:`ModelArch` goes to and from a Hugging Face ``config.json``
(:func:`arch_from_hf_config`, :meth:`ModelArch.to_hf_config`); a preset is just such a record.
Pure data: no torch, no transformers (``api/`` imports nothing heavy).

Supported families (:data:`FAMILIES`), all RMSNorm + SwiGLU + RoPE + grouped-query attention:

| family | HF class | differs from Llama by |
|---|---|---|
| llama | ``LlamaForCausalLM`` | - |
| mistral | ``MistralForCausalLM`` | sliding-window attention (``sliding_window``) |
| qwen2 | ``Qwen2ForCausalLM`` | bias on q/k/v projections (``qkv_bias``) |
| qwen3 | ``Qwen3ForCausalLM`` | RMSNorm on every query/key head before RoPE (``qk_norm``), explicit head dim |
| qwen3_moe | ``Qwen3MoeForCausalLM`` | qwen3 attention + top-k routed SwiGLU experts, no shared expert |
"""

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from asyncrl.api.model import ModelSpec
from asyncrl.api.model_bounds import (
    COMMON,
    MAX_PARAMETERS,
    MAX_TENSORS,
    family_bounds,
    field_problems,
    value_problem,
)
from asyncrl.api.model_folder import FolderFileError, file_problems, read_json

Family = Literal["llama", "mistral", "qwen2", "qwen3", "qwen3_moe"]
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class FamilyInfo:
    """What a family fixes: its HF class and ``model_type``, and the features it always has."""

    architecture: str  # the ``architectures`` entry of config.json
    model_type: str
    qkv_bias: bool = False
    qk_norm: bool = False
    moe: bool = False


FAMILIES: Mapping[Family, FamilyInfo] = {
    "llama": FamilyInfo("LlamaForCausalLM", "llama"),
    "mistral": FamilyInfo("MistralForCausalLM", "mistral"),
    "qwen2": FamilyInfo("Qwen2ForCausalLM", "qwen2", qkv_bias=True),
    "qwen3": FamilyInfo("Qwen3ForCausalLM", "qwen3", qk_norm=True),
    "qwen3_moe": FamilyInfo("Qwen3MoeForCausalLM", "qwen3_moe", qk_norm=True, moe=True),
}
ARCHITECTURES: Mapping[str, Family] = {info.architecture: fam for fam, info in FAMILIES.items()}
SUPPORTED = ", ".join(ARCHITECTURES)


class ArchitectureError(ValueError):
    """A config (or spec) that no supported family builds; ``problems`` lists every reason."""

    def __init__(self, problems: list[str], source: str = "config.json") -> None:
        self.problems = problems
        self.source = source
        super().__init__((f"{source}: " if source else "") + "; ".join(problems))


@dataclass(frozen=True)
class ModelArch:
    """A decoder of one family: RMSNorm, SwiGLU, RoPE, grouped-query attention, plus the family's extras.

    The first eight fields are positional (as the Llama-only record had them); the rest default to Llama.
    """

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    ffn_hidden_size: int  # dense SwiGLU inner size (unused by a MoE layer: see moe_ffn_hidden_size)
    vocab_size: int
    max_sequence_length: int
    tie_embeddings: bool
    rope_theta: float = 10000.0
    norm_epsilon: float = 1e-5
    family: Family = "llama"
    kv_channels: int | None = None  # explicit head dim (Qwen3: 128 whatever the hidden size); None = H / nh
    sliding_window: int | None = None  # Mistral: a query sees its last `sliding_window` keys; None = all
    num_experts: int = 0  # routed experts per MoE layer (0 = dense model)
    moe_top_k: int = 0  # experts each token is sent to
    moe_ffn_hidden_size: int = 0  # SwiGLU inner size of one expert
    norm_topk_prob: bool = False  # renormalise the top-k router probabilities to sum to 1

    @property
    def head_dim(self) -> int:
        return self.kv_channels if self.kv_channels is not None else self.hidden_size // self.num_attention_heads

    @property
    def info(self) -> FamilyInfo:
        return FAMILIES[self.family]

    @property
    def qkv_bias(self) -> bool:
        return self.info.qkv_bias

    @property
    def qk_norm(self) -> bool:
        return self.info.qk_norm

    @property
    def is_moe(self) -> bool:
        return self.info.moe

    @property
    def architecture(self) -> str:
        return self.info.architecture

    def problems(self) -> list[str]:
        """Every inconsistency of the record (empty = buildable), named by HF config keys."""
        out = []
        if self.family not in FAMILIES:
            out.append(f"family {self.family!r} is unknown; valid families: {', '.join(FAMILIES)}")
            return out
        if self.num_key_value_heads < 1 or self.num_attention_heads % self.num_key_value_heads:
            out.append(
                f"num_attention_heads {self.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{self.num_key_value_heads} (grouped-query attention)"
            )
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            out.append(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads} "
                "(set head_dim explicitly, as Qwen3 does)"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            out.append(f"sliding_window {self.sliding_window} must be >= 1 (or null for full attention)")
        if self.is_moe:
            if self.num_experts < 1 or not 1 <= self.moe_top_k <= self.num_experts:
                out.append(
                    f"num_experts {self.num_experts} and num_experts_per_tok {self.moe_top_k}: need "
                    "1 <= num_experts_per_tok <= num_experts"
                )
            if self.moe_ffn_hidden_size < 1:
                out.append(f"moe_intermediate_size {self.moe_ffn_hidden_size} must be >= 1")
        elif self.num_experts:
            out.append(f"num_experts {self.num_experts} set on the dense family {self.family!r}")
        return out

    def to_hf_config(self, dtype: str = "float32") -> dict[str, Any]:
        """The ``config.json`` of this architecture (``AutoConfig.for_model(**d)`` builds its HF class).

        Ids of special tokens are left ``None``: they belong to the tokenizer and generation_config.json.
        """
        cfg: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.info.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.ffn_hidden_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_sequence_length,
            "rms_norm_eps": self.norm_epsilon,
            "tie_word_embeddings": self.tie_embeddings,
            "rope_parameters": {"rope_type": "default", "rope_theta": float(self.rope_theta)},
            "attention_dropout": 0.0,
            "bos_token_id": None,
            "eos_token_id": None,
            "pad_token_id": None,
            "dtype": dtype,
        }
        if self.family == "llama":
            cfg |= {"attention_bias": False, "mlp_bias": False}
        elif self.family == "mistral":
            cfg["sliding_window"] = self.sliding_window
        else:  # the Qwen families
            cfg |= {"use_sliding_window": False, "sliding_window": None}
            if self.family != "qwen2":
                cfg["attention_bias"] = False
        if self.is_moe:
            cfg |= {
                "num_experts": self.num_experts,
                "num_experts_per_tok": self.moe_top_k,
                "moe_intermediate_size": self.moe_ffn_hidden_size,
                "norm_topk_prob": self.norm_topk_prob,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "output_router_logits": False,
            }
        return cfg

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def hf_param_shapes(arch: ModelArch, *, with_tied_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Every tensor name of ``arch``'s Hugging Face checkpoint and its shape (what ``save_pretrained``
    writes: MoE experts one by one, ``lm_head.weight`` left out when tied unless ``with_tied_head``)."""
    H, V, hn = arch.hidden_size, arch.vocab_size, arch.head_dim
    q_rows, kv_rows = arch.num_attention_heads * hn, arch.num_key_value_heads * hn
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, H)}
    for i in range(arch.num_layers):
        h = f"model.layers.{i}."
        shapes |= {
            h + "input_layernorm.weight": (H,),
            h + "self_attn.q_proj.weight": (q_rows, H),
            h + "self_attn.k_proj.weight": (kv_rows, H),
            h + "self_attn.v_proj.weight": (kv_rows, H),
            h + "self_attn.o_proj.weight": (H, q_rows),
            h + "post_attention_layernorm.weight": (H,),
        }
        if arch.qkv_bias:
            shapes |= {h + "self_attn.q_proj.bias": (q_rows,), h + "self_attn.k_proj.bias": (kv_rows,),
                       h + "self_attn.v_proj.bias": (kv_rows,)}
        if arch.qk_norm:
            shapes |= {h + "self_attn.q_norm.weight": (hn,), h + "self_attn.k_norm.weight": (hn,)}
        if arch.is_moe:
            inner = arch.moe_ffn_hidden_size
            shapes[h + "mlp.gate.weight"] = (arch.num_experts, H)
            mlps = [h + f"mlp.experts.{e}." for e in range(arch.num_experts)]
        else:
            inner, mlps = arch.ffn_hidden_size, [h + "mlp."]
        for p in mlps:
            shapes |= {p + "gate_proj.weight": (inner, H), p + "up_proj.weight": (inner, H),
                       p + "down_proj.weight": (H, inner)}
    shapes["model.norm.weight"] = (H,)
    if with_tied_head or not arch.tie_embeddings:
        shapes["lm_head.weight"] = (V, H)
    return shapes


def parameter_count(arch: ModelArch) -> int:
    """Parameters of ``arch``'s checkpoint (tied head counted once), from its sizes alone: what
    :func:`hf_param_shapes` would list, summed without building the table."""
    H, V, hn = arch.hidden_size, arch.vocab_size, arch.head_dim
    qkv_rows = (arch.num_attention_heads + 2 * arch.num_key_value_heads) * hn
    attention = qkv_rows * H + H * arch.num_attention_heads * hn + qkv_rows * arch.qkv_bias + 2 * hn * arch.qk_norm
    if arch.is_moe:
        mlp = arch.num_experts * (3 * arch.moe_ffn_hidden_size * H + H)  # experts + one router row each
    else:
        mlp = 3 * arch.ffn_hidden_size * H  # gate, up, down
    layer = attention + mlp + 2 * H  # + the two norms
    return V * H + arch.num_layers * layer + H + (0 if arch.tie_embeddings else V * H)


def tensor_count(arch: ModelArch) -> int:
    """Tensors of ``arch``'s checkpoint as ``save_pretrained`` writes it (``len(hf_param_shapes(arch,
    with_tied_head=False))``), from its sizes alone."""
    mlp = 1 + 3 * arch.num_experts if arch.is_moe else 3
    per_layer = 6 + 3 * arch.qkv_bias + 2 * arch.qk_norm + mlp
    return 1 + arch.num_layers * per_layer + 1 + (0 if arch.tie_embeddings else 1)


def size_problems(arch: ModelArch) -> list[str]:
    """The architecture's size against :data:`~asyncrl.api.model_bounds.MAX_PARAMETERS` and
    :data:`~asyncrl.api.model_bounds.MAX_TENSORS`, estimated before any table or tensor is allocated."""
    out = []
    sizes = (f"hidden_size {arch.hidden_size}, num_hidden_layers {arch.num_layers}, intermediate_size "
             f"{arch.moe_ffn_hidden_size if arch.is_moe else arch.ffn_hidden_size}, vocab_size {arch.vocab_size}"
             + (f", num_experts {arch.num_experts}" if arch.is_moe else ""))
    if (n := parameter_count(arch)) > MAX_PARAMETERS:
        out.append(f"{sizes} make {n:.3g} parameters, over MAX_PARAMETERS {MAX_PARAMETERS:.3g}; no supported model "
                   "is this large: correct the sizes in config.json")
    if (t := tensor_count(arch)) > MAX_TENSORS:
        out.append(f"{sizes} make {t} tensors, over MAX_TENSORS {MAX_TENSORS}; no supported model has this many: "
                   "correct the sizes in config.json")
    return out


LlamaArch = ModelArch  # the Llama-only record's name, kept for the callers that build one positionally

# vocab_size 0 = taken from the task's tokenizer at resolve time.
PRESETS: dict[str, ModelArch] = {
    "tiny-llama": ModelArch(128, 2, 4, 2, 256, 0, 128, True),
    "small-llama": ModelArch(256, 4, 8, 4, 1024, 0, 256, True),
    "smollm2-135m": ModelArch(576, 30, 9, 3, 1536, 49152, 2048, True, rope_theta=100000.0),
}
DEFAULT_PRESET = "tiny-llama"
SIZE_OVERRIDES = {  # spec.model field (python name) -> its YAML name
    "hidden_size": "hiddenSize",
    "num_layers": "numLayers",
    "num_attention_heads": "numAttentionHeads",
    "num_key_value_heads": "numKeyValueHeads",
    "ffn_hidden_size": "ffnHiddenSize",
    "tie_embeddings": "tieEmbeddings",
}


def _rope_theta(cfg: Mapping[str, Any], problems: list[str]) -> float:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
    if kind != "default":
        problems.append(f"rope type {kind!r} is not supported (only default RoPE); remove the RoPE scaling entry")
    theta = rope.get("rope_theta") if isinstance(rope, Mapping) else None
    return float(theta if theta is not None else cfg.get("rope_theta", 10000.0))


def family_of(cfg: Mapping[str, Any]) -> Family:
    """The family of a ``config.json``: from its ``architectures`` entry (else its ``model_type``).

    Raises :class:`ArchitectureError` naming the architecture and the supported list.
    """
    if bad := [p for k in ("architectures", "model_type") if (p := value_problem(k, cfg.get(k), COMMON[k]))]:
        raise ArchitectureError(bad)
    archs = cfg.get("architectures") or []
    if archs:
        unknown = [a for a in archs if a not in ARCHITECTURES]
        if unknown or len(archs) != 1:
            raise ArchitectureError([
                f"architectures {list(archs)}: {', '.join(unknown) or 'more than one entry'} is not supported; "
                f"supported architectures: {SUPPORTED} (one entry)"
            ])
        return ARCHITECTURES[archs[0]]
    by_type = {info.model_type: fam for fam, info in FAMILIES.items()}
    model_type = cfg.get("model_type")
    if model_type not in by_type:
        raise ArchitectureError([
            f"neither architectures nor a supported model_type ({model_type!r}); set architectures to one of {SUPPORTED}"
        ])
    return by_type[model_type]


def arch_from_hf_config(cfg: Mapping[str, Any], source: str = CONFIG_FILE) -> ModelArch:
    """The :class:`ModelArch` of a Hugging Face ``config.json`` dict (every problem reported at once)."""
    try:
        family = family_of(cfg)
    except ArchitectureError as exc:
        raise ArchitectureError(exc.problems, source) from None
    # 1. every field this family reads, typed and bounded, before any number is used
    bounds = field_problems(cfg, family_bounds(family, FAMILIES[family].moe))
    problems: list[str] = []
    if (act := cfg.get("hidden_act", "silu")) != "silu":
        problems.append(f"hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
    if cfg.get("mlp_bias"):
        problems.append("mlp_bias true is not supported (no family here has MLP biases)")
    if family != "qwen2" and cfg.get("attention_bias"):
        problems.append(f"attention_bias true is not supported for {family} (it biases o_proj too)")
    if family in ("qwen2", "qwen3", "qwen3_moe") and cfg.get("use_sliding_window"):
        problems.append("use_sliding_window true (per-layer windows) is not supported; set it to false")
    if bounds:
        raise ArchitectureError(bounds + problems, source)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim")
    if head_dim is None and family == "qwen3":
        head_dim = 128  # Qwen3Config's default: not derived from hidden_size
    kv_channels = None if head_dim is None or head_dim * heads == cfg["hidden_size"] else int(head_dim)
    moe: dict[str, Any] = {}
    if FAMILIES[family].moe:
        if cfg.get("decoder_sparse_step", 1) != 1 or cfg.get("mlp_only_layers"):
            problems.append("decoder_sparse_step != 1 or mlp_only_layers (dense layers among MoE ones) is not supported")
        if cfg.get("shared_expert_intermediate_size"):
            problems.append("shared experts (shared_expert_intermediate_size) are not supported for qwen3_moe")
        moe = {
            "num_experts": int(cfg.get("num_experts", cfg.get("num_local_experts", 0)) or 0),
            "moe_top_k": int(cfg.get("num_experts_per_tok", 0) or 0),
            "moe_ffn_hidden_size": int(cfg.get("moe_intermediate_size", 0) or 0),
            "norm_topk_prob": bool(cfg.get("norm_topk_prob", False)),
        }
    window = cfg.get("sliding_window") if family == "mistral" else None
    arch = ModelArch(
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        ffn_hidden_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        max_sequence_length=int(cfg.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        rope_theta=_rope_theta(cfg, problems),
        norm_epsilon=float(cfg.get("rms_norm_eps", 1e-6)),
        family=family,
        kv_channels=kv_channels,
        sliding_window=None if window is None else int(window),
        **moe,
    )
    problems += arch.problems()
    # 2. the whole model's size, estimated from the bounded fields before anything is allocated
    problems += size_problems(arch) if not problems else []
    if problems:
        raise ArchitectureError(problems, source)
    return arch


def folder_config(weights: str) -> dict[str, Any] | None:
    """The parsed ``config.json`` of the ``spec.model.weights`` folder, or None when it has none.

    Read as untrusted data (:func:`asyncrl.api.model_folder.read_json`): a regular file inside the folder
    (a link out of it is refused) of at most ``CONFIG_MAX_BYTES``, holding a JSON object."""
    folder = Path(os.path.expanduser(weights))
    try:
        cfg = read_json(folder, CONFIG_FILE)
    except FolderFileError as exc:
        raise ArchitectureError([str(exc)], source="") from None
    if cfg is not None and not isinstance(cfg, dict):
        raise ArchitectureError([f"holds JSON {type(cfg).__name__}, not an object; re-save the folder with "
                                 "save_pretrained"], str(folder / CONFIG_FILE))
    return cfg


def _from_preset(spec: ModelSpec) -> ModelArch:
    name = spec.preset or DEFAULT_PRESET
    if name not in PRESETS:
        raise ValueError(f"spec.model.preset {name!r} is unknown; valid presets: {', '.join(PRESETS)}")
    overrides = {k: getattr(spec, k) for k in SIZE_OVERRIDES if getattr(spec, k) is not None}
    return replace(PRESETS[name], **overrides)


def folder_problems(spec: ModelSpec) -> list[str]:
    """What is wrong with ``spec.model`` given its weights folder's ``config.json`` (where visible here).

    Pure file reading (the folder's listing, config.json and tokenizer_config.json), so ``asyncrl validate``
    runs it without torch: the folder's files (:func:`asyncrl.api.model_folder.file_problems`: links out of
    the folder, oversized files), then config.json. Each problem starts with the field path it is about.
    """
    if spec.weights is None or not Path(os.path.expanduser(spec.weights)).is_dir():
        return []
    files = [f"spec.model.weights: {p}" for p in file_problems(spec.weights)]
    try:
        cfg = folder_config(spec.weights)
        if cfg is None:
            return files  # a bare safetensors folder: the preset gives the architecture (as before)
        where = str(Path(os.path.expanduser(spec.weights)) / CONFIG_FILE)
        arch = arch_from_hf_config(cfg, where)
    except ArchitectureError as exc:
        return files + [p for p in [f"spec.model.weights: {exc}"] if p not in files]
    if files:
        return files
    out = [
        f"spec.model.{yaml}: the architecture comes from {where}; size overrides are refused: remove {yaml}"
        for field, yaml in SIZE_OVERRIDES.items()
        if getattr(spec, field) is not None
    ]
    if spec.preset is not None:
        preset = replace(PRESETS[spec.preset], vocab_size=PRESETS[spec.preset].vocab_size or arch.vocab_size)
        # context length only sizes the RoPE table; an epsilon stored as float32 (GGUF: 9.99999975e-06) is the same
        same_eps = abs(preset.norm_epsilon - arch.norm_epsilon) <= 1e-9
        like = replace(preset, max_sequence_length=arch.max_sequence_length,
                       norm_epsilon=arch.norm_epsilon if same_eps else preset.norm_epsilon)
        if like != arch:
            out.append(
                f"spec.model.preset: {spec.preset!r} differs from the architecture in {where} "
                f"({arch.architecture}); leave spec.model.preset out (the folder's config.json decides)"
            )
    return out


def parallel_problems(arch: ModelArch, tp: int, pp: int = 1, ep: int = 1, *,
                      fix: str = "set spec.actor.megatron.tensorParallel to a common divisor") -> list[str]:
    """What in ``arch`` cannot be split ``tp``-way (tensor), ``pp``-way (pipeline), ``ep``-way (experts):
    megatron shards heads, KV heads and the vocabulary over TP (it does not pad), layers over PP and
    routed experts over EP. A vocabulary of 0 (the tokenizer's, not known yet) is not checked. ``fix``: the
    TP advice (whose tensorParallel: the actor's, or a dedicated scorer's)."""
    out = []
    for what, n in (("numAttentionHeads", arch.num_attention_heads), ("numKeyValueHeads", arch.num_key_value_heads),
                    ("vocabSize", arch.vocab_size)):
        if n and n % tp:
            out.append(f"{what} {n} is not divisible by tensorParallel {tp}: {fix} "
                       f"(heads {arch.num_attention_heads}, KV heads {arch.num_key_value_heads}, "
                       f"vocab {arch.vocab_size or 'from the tokenizer'})")
    if arch.num_layers % pp:
        out.append(f"numLayers {arch.num_layers} is not divisible by pipelineParallel {pp}: set pipelineParallel "
                   f"to a divisor of {arch.num_layers}")
    if ep > 1 and (not arch.num_experts or arch.num_experts % ep):
        out.append(f"numExperts {arch.num_experts} is not divisible by expertParallel {ep}: set expertParallel "
                   f"to a divisor of the routed experts (1 for a dense model)")
    return out


def known_arch(spec: ModelSpec) -> ModelArch | None:
    """The architecture ``asyncrl validate`` can see without torch: the weights folder's ``config.json``
    when readable here, else the preset with its overrides; None when neither resolves."""
    try:
        cfg = folder_config(spec.weights) if spec.weights is not None else None
        return arch_from_hf_config(cfg) if cfg is not None else _from_preset(spec)
    except ValueError:
        return None  # reported by the model's own checks


def resolve_arch(spec: ModelSpec, vocab_size: int, max_sequence_length: int | None = None) -> ModelArch:
    """The architecture of ``spec.model``: its weights folder's ``config.json`` when it has one, else
    the preset with its size overrides.

    Args:
        spec: the job's ``model`` section.
        vocab_size: the task tokenizer's vocabulary (used when the preset does not fix one).
        max_sequence_length: raise the context length to at least this many tokens (RoPE has no
            learned positions, so this only sizes megatron's rotary table).
    """
    cfg = folder_config(spec.weights) if spec.weights is not None else None
    if cfg is not None:
        if problems := folder_problems(spec):
            raise ArchitectureError(problems, "spec.model")
        arch = arch_from_hf_config(cfg)
    else:
        arch = _from_preset(spec)
    if arch.vocab_size == 0:
        arch = replace(arch, vocab_size=vocab_size)
    if max_sequence_length is not None and max_sequence_length > arch.max_sequence_length:
        arch = replace(arch, max_sequence_length=max_sequence_length)
    problems = []
    if arch.hidden_size % arch.num_attention_heads:
        problems.append(f"hiddenSize {arch.hidden_size} is not a multiple of numAttentionHeads {arch.num_attention_heads}")
    if arch.num_attention_heads % arch.num_key_value_heads:
        problems.append(
            f"numAttentionHeads {arch.num_attention_heads} is not a multiple of numKeyValueHeads {arch.num_key_value_heads}"
        )
    if problems and cfg is None:
        raise ValueError("spec.model: " + "; ".join(problems))
    return arch


__all__ = [
    "ARCHITECTURES", "FAMILIES", "PRESETS", "ArchitectureError", "Family", "FamilyInfo", "LlamaArch", "ModelArch",
    "arch_from_hf_config", "family_of", "folder_config", "folder_problems", "hf_param_shapes", "known_arch",
    "parallel_problems", "resolve_arch",
]
