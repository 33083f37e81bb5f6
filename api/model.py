"""``spec.model``: which policy the job trains (a Hugging Face model folder or a built-in preset).

Its own module, below everything that reads a model: the architecture table (:mod:`asyncrl.api.model_arch`)
and the ``config.json`` bounds (:mod:`asyncrl.api.model_bounds`) take a :class:`ModelSpec`, and the job
(:mod:`asyncrl.api.job`) holds one and checks its layout against that architecture, so imports run one
way: ``model`` <- ``model_bounds`` <- ``model_arch`` <- ``old_logits`` <- ``job``.
"""

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import CelRule
from asyncrl.api.lora import LoraSpec

GQA_MESSAGE = "numAttentionHeads must be a multiple of numKeyValueHeads (grouped-query attention)"


class ModelSpec(SpecModel):
    """``spec.model``: the policy: a Hugging Face model folder (``weights``) or a built-in preset."""

    preset: str | None = Field(
        default=None,
        pattern=r"^(tiny-llama|small-llama|smollm2-135m)$",
        description="Built-in architecture: tiny-llama (~0.3M params, CPU), small-llama (~4M), "
        "smollm2-135m (SmolLM2-135M's shape). Unset: tiny-llama, or the architecture of the weights "
        "folder's config.json (then leave preset and the size overrides out).",
    )
    hidden_size: int | None = Field(default=None, ge=8, le=65536, description="Override the preset's hidden size.")
    num_layers: int | None = Field(default=None, ge=1, le=1024, description="Override the preset's layer count.")
    num_attention_heads: int | None = Field(
        default=None, ge=1, le=1024, description="Override the query head count."
    )
    num_key_value_heads: int | None = Field(
        default=None, ge=1, le=1024, description="Override the key/value head count (grouped-query attention)."
    )
    ffn_hidden_size: int | None = Field(
        default=None, ge=8, le=262144, description="Override the SwiGLU inner size."
    )
    tie_embeddings: bool | None = Field(default=None, description="Override tying of input/output embeddings.")
    weights: str | None = Field(
        default=None,
        description="A Hugging Face model folder readable in the actor's and rollout pods (a PVC path) or "
        "locally: config.json (its architectures entry picks the family: Llama, Mistral, Qwen2, Qwen3, "
        "Qwen3-MoE), safetensors (one file, or shards with model.safetensors.index.json), tokenizer files and "
        "generation_config.json; null = random initialisation of the preset.",
    )
    rollout_dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16",
        description="Precision of the rollout engine; bfloat16 vs the float32 actor makes the "
        "train–inference discrepancy real.",
    )
    lora: LoraSpec | None = Field(
        default=None,
        description="Train low-rank adapters on the frozen base instead of every weight (docs/lora.md); "
        "null = full fine-tuning.",
    )

    cel_rules: ClassVar[tuple[CelRule, ...]] = (
        CelRule(
            "!has(self.numAttentionHeads) || !has(self.numKeyValueHeads) || "
            "self.numAttentionHeads % self.numKeyValueHeads == 0",
            GQA_MESSAGE,
        ),
    )

    @model_validator(mode="after")
    def _gqa_divides(self) -> "ModelSpec":
        q, kv = self.num_attention_heads, self.num_key_value_heads
        if q is not None and kv is not None and q % kv != 0:
            raise ValueError(f"{GQA_MESSAGE}; got {q} and {kv}: set numKeyValueHeads to a divisor of {q}")
        return self
