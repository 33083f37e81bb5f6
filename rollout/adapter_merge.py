"""LoRA versions on the transformers engine: the base kept once, each version's adapters merged onto it.

Under ``spec.model.lora`` the weight sync sends a version as its adapters alone, in peft's per-projection
names (``model.layers.0.self_attn.q_proj.lora_A.weight`` ``[r, in]`` and ``...lora_B.weight`` ``[out, r]``,
``B`` already multiplied by ``alpha / rank``); the first delivery (and a late joiner's) carries the base's
HF tensors too. The engine then runs ``W + (s B) A`` as a plain weight: merged once per version, a decode step
costs what the base model's does (an unmerged adapter adds two thin matmuls to every projection of every
token; ``bench/lora_versions.py`` measures both).

The merge is in fp32 and rounded once to the engine's dtype; under an fp32 rollout the engine's log-probs equal
the actor's ``W x + s B (A x)`` to float rounding (``r_d == 1`` within 1e-5, ``tests/rollout/test_adapter_merge.py``).
The base stays resident beside the model (twice the weights' memory on the engine), so that no version's
merge is ever undone by subtraction, which would accumulate rounding over versions.
"""

from collections.abc import Mapping

import torch

A_WEIGHT, B_WEIGHT = ".lora_A.weight", ".lora_B.weight"


def is_hf_adapter_name(name: str) -> bool:
    """An adapter tensor in peft's naming (``...q_proj.lora_A.weight``)."""
    return name.endswith(A_WEIGHT) or name.endswith(B_WEIGHT)


def base_name(name: str) -> str:
    """``...q_proj.lora_A.weight`` -> ``...q_proj.weight``: the base weight an adapter tensor belongs to."""
    return name.removesuffix(A_WEIGHT).removesuffix(B_WEIGHT) + ".weight"


class AdapterMerge:
    """The base an engine holds under LoRA, and the full state dict of each version delivered as adapters."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}  # HF name -> tensor (the engine's dtype), empty until a base arrives
        self.merges = 0  # versions merged (counted for the tests: a full load without adapters merges nothing)

    def resolve(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full HF state dict to install for ``weights``: as given when it holds no adapter; else the base
        (``weights``' own base tensors when it carries them, else the one kept) with the adapters merged."""
        adapters = {k: v for k, v in weights.items() if is_hf_adapter_name(k)}
        if not adapters:
            return dict(weights)
        plain = {k: v for k, v in weights.items() if not is_hf_adapter_name(k)}
        if plain:
            self.base = plain
        if not self.base:
            raise RuntimeError(
                "adapter merge: a version arrived as LoRA adapters before any base weights; the first delivery "
                "must carry the base (the actor's hf_state_dict)"
            )
        out = dict(self.base)
        for target in sorted({base_name(k) for k in adapters}):
            stem = target.removesuffix(".weight")
            a, b = adapters.get(stem + A_WEIGHT), adapters.get(stem + B_WEIGHT)
            if a is None or b is None or target not in self.base:
                raise ValueError(f"adapter merge: {stem} needs lora_A, lora_B and its base weight {target}; got "
                                 f"A {a is not None}, B {b is not None}, base {target in self.base}")
            w = self.base[target]
            if tuple(b.shape[:1]) + tuple(a.shape[1:]) != tuple(w.shape) or a.shape[0] != b.shape[1]:
                raise ValueError(f"adapter merge: {stem}: B {tuple(b.shape)} A {tuple(a.shape)} do not make "
                                 f"the base's {tuple(w.shape)}")
            out[target] = (w.float() + b.float() @ a.float()).to(w.dtype)
        self.merges += 1
        return out
