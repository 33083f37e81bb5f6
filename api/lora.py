"""``spec.model.lora``: train low-rank adapters on a frozen base instead of every weight.

A policy version is then its adapter (about 1 % of the model), so every version a token still references can
stay resident and the exact route scores each row under its own version in one forward
(``trainer/megatron/lora.py``, ``docs/lora.md``).

Target modules are named as in Hugging Face Llama-style models (the names ``peft`` uses, so an exported
adapter loads onto the base folder unchanged). The actor's megatron-core layers fuse two groups of them, and one
adapter on a fused layer has one ``A`` for the whole group: q/k/v are one layer (``linear_qkv``) and gate/up
are one (``linear_fc1``), so each group is targeted whole or not at all. On a Qwen3-MoE model ``gate_proj``,
``up_proj`` and ``down_proj`` are every expert's (the router is never adapted).

The checks that need the rest of the job (the engine, tensor parallelism, the model's widths) are
:func:`lora_problems`, called by the job's validator. Every old-logit strategy is served: ``snapshot`` keeps each
referenced version's adapters, ``dedicated`` and ``interruptSync`` scorers keep the base once and merge each
version's adapters onto it.
"""

from pydantic import Field, field_validator, model_validator

from asyncrl.api.base import SpecModel
from asyncrl.api.cel import raise_all

TARGET_MODULES: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FUSED_GROUPS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
MAX_RANK = 1024

ENGINE_MESSAGE = (
    "model.lora needs rollout.engine transformers: the vLLM engine of this build is not wired to LoRA adapters "
    "(its CPU build loads full weights only); set rollout.engine: transformers, or remove model.lora"
)


class LoraSpec(SpecModel):
    """``spec.model.lora``: low-rank adapters ``W + (alpha / rank) B A`` on the target projections."""

    rank: int = Field(default=8, ge=1, le=MAX_RANK, description=f"Adapter rank r (1..{MAX_RANK}).")
    alpha: float = Field(
        default=16.0, gt=0.0, le=1.0e4,
        description="Scale numerator: the adapter's output is multiplied by alpha / rank (as peft's lora_alpha).",
    )
    dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0,
        description="Dropout on the adapter's input in the gradient forward only (never in a scoring forward, "
        "so exact old logits stay exact); 0 disables it.",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(TARGET_MODULES),
        min_length=1,
        max_length=len(TARGET_MODULES),
        description="Projections that get an adapter, by their Hugging Face names: "
        f"{', '.join(TARGET_MODULES)} (MoE: every expert's gate/up/down). q/k/v are targeted together and "
        "gate/up together (the actor fuses each group into one layer).",
    )

    @field_validator("target_modules")
    @classmethod
    def _known_modules(cls, v: list[str]) -> list[str]:
        unknown = [m for m in v if m not in TARGET_MODULES]
        if unknown:
            raise ValueError(
                f"unknown target module(s) {unknown}; valid: {', '.join(TARGET_MODULES)} (Hugging Face names of "
                "the attention and MLP projections)"
            )
        if len(set(v)) != len(v):
            raise ValueError(f"target modules {v} repeat a name; list each once")
        return v

    @model_validator(mode="after")
    def _groups_whole(self) -> "LoraSpec":
        chosen = set(self.target_modules)
        problems = []
        for group in FUSED_GROUPS:
            part = [m for m in group if m in chosen]
            if part and len(part) != len(group):
                problems.append((
                    ".targetModules",
                    f"{part} is part of the fused group {list(group)}: the actor computes them as one layer with "
                    f"one adapter; list all of {list(group)} or none",
                ))
        raise_all(problems)
        return self

    @property
    def scale(self) -> float:
        """``alpha / rank``: what the adapter's output ``B A x`` is multiplied by."""
        return self.alpha / self.rank


def lora_problems(lora: LoraSpec | None, *, engine: str, smallest_dim: int | None,
                  tensor_parallel: int = 1) -> list[tuple[str, str]]:
    """The ``(path, message)`` of every combination the job cannot serve with ``lora`` (empty without it).

    ``smallest_dim``: the model's smallest adapted input or output width when it is known (a rank above it is no
    low-rank adapter)."""
    if lora is None:
        return []
    out: list[tuple[str, str]] = []
    if engine != "transformers":
        out.append(("rollout.engine", f"{ENGINE_MESSAGE} (got {engine!r})"))
    if lora.dropout > 0.0 and tensor_parallel > 1:
        out.append((
            "model.lora.dropout",
            f"model.lora.dropout {lora.dropout} with actor.megatron.tensorParallel {tensor_parallel}: the adapter's dropout mask "
            "is drawn per rank, and a column-parallel layer's ranks must drop the same inputs; set dropout: 0 or "
            "tensorParallel: 1",
        ))
    if smallest_dim is not None and lora.rank > smallest_dim:
        out.append((
            "model.lora.rank",
            f"rank {lora.rank} exceeds the model's smallest adapted width {smallest_dim}: a low-rank adapter needs "
            f"rank <= {smallest_dim}; lower model.lora.rank",
        ))
    return out
